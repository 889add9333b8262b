"""``miniverl qualify-teacher RECIPE``: measure the teacher's own success, record it.

The recipe's teacher is loaded in this process exactly as the teacher server would
serve it (the prepared teacher when ``teacher.prepare`` is set, else the model plus
its PEFT adapter), plays the environment's held-out split greedily, and the
qualification record (``student/qualify.py``) is written to the per-user cache, next
to a prepared teacher, and to ``--out``. ``train`` and ``up`` read it when
``teacher.min_success`` (or ``teacher.min_recovery``) is set. The command exits 1 when
the measured success is below ``teacher.min_success``, or the recovery rate after a
tool error (environments with faults) below ``teacher.min_recovery`` (the record is
written anyway). A ``teacher.mode: privileged_context`` teacher plays the split in its
privileged view, the one it scores with; that record goes to the cache only (a
prepared directory keeps its preparation's own record).

With ``--teacher ENDPOINT`` nothing is loaded: the teacher already serving there is
measured over the wire (``student/qualify_remote.py``), with the recipe's student
tokenizer, environment and rollout limits, and the record goes to the cache (and
``--out``).

This module is the only place that joins the teacher's loader with the student's
evaluation; it trains nothing and serves nothing.
"""

from __future__ import annotations

# Imports inside command bodies are deliberate: `miniverl --help` stays fast and torch-free.
from pathlib import Path
from typing import Any

import typer


def route_views(recipe: Any, recipe_path: str | Path, route: str | None) -> list[Any]:
    """The one-environment recipes to measure: the recipe itself, or with ``--route NAME``
    the route's teacher on each environment routed to it (``teacher_routes.route_view``:
    the records that route's gate reads). Raises ``ConfigError`` for an unknown route."""
    from miniverl.common.errors import ConfigError
    from miniverl.common.teacher_routes import route_view, routes

    if route is None:
        return [recipe]
    found = routes(recipe)
    if route not in found:
        said = f"its routes are {', '.join(found)}" if found else "it routes nothing"
        raise ConfigError(f"--route {route} is not a route of {str(recipe_path)!r} ({said}); "
                          "name one of them, or drop --route for a recipe of one teacher")
    return [route_view(recipe, found[route], env) for env in found[route].environments]


def qualify_recipe(
    recipe_path: str | Path,
    *,
    split: str = "eval",
    out: str | Path | None = None,
    max_tasks: int | None = None,
    offline: bool = False,
    show_progress: bool = True,
    route: str | None = None,
) -> list[tuple[dict[str, Any], list[Path]]]:
    """Load the recipe's teacher (``route``: that route's teacher of ``teachers:``),
    measure it on ``split`` (on each environment of the route), save each record."""
    from miniverl.common.errors import ConfigError
    from miniverl.common.modeling import load_tokenizer
    from miniverl.common.recipe import load_recipe
    from miniverl.common.runtime import apply_cpu_threads
    from miniverl.common.teacher_routes import routes
    from miniverl.student.qualify import measure, privileged_view, save_record
    from miniverl.student.teacher_prep import prep_recipe_path, prepare_teacher
    from miniverl.teacher_server.loader import TeacherSpec, load_teacher, spec_from_recipe

    full = load_recipe(recipe_path)
    views = route_views(full, recipe_path, route)
    recipe = views[0]
    if recipe.teacher is None:
        raise ConfigError(
            f"recipe {str(recipe_path)!r} has no teacher section; qualify-teacher measures "
            "the recipe's teacher"
        )
    apply_cpu_threads(recipe.runtime.cpu_threads)
    prep = prep_recipe_path(recipe, recipe_path)
    beside = None
    if prep is not None:
        # `up` serves the prepared directory as a plain model (--model DIR); qualify the
        # very same thing so the identities match.
        prepared = prepare_teacher(recipe, prep, show_progress=show_progress)
        beside = prepared.model_dir
        spec = TeacherSpec(model=str(prepared.model_dir), device=recipe.teacher.device,
                           dtype=recipe.teacher.dtype, offline=offline)
    else:
        name = routes(full)[route].teacher if route is not None and full.teachers else None
        spec = spec_from_recipe(recipe_path, offline=offline, teacher_name=name)
    loaded = load_teacher(spec)
    tokenizer = load_tokenizer(loaded.model_dir)
    if privileged_view(recipe) or len(views) > 1:
        # A privileged view's record, or one of several environments: the prepared
        # directory keeps its preparation's own record (one file beside it).
        beside = None
    done = []
    for view in views:
        record = measure(
            loaded.model, tokenizer, view, identity=loaded.info, model_dir=loaded.model_dir,
            split=split, max_tasks=max_tasks, tokenizer_fp=loaded.tokenizer_fp,
        )
        record["min_success"] = view.teacher.min_success
        record["min_recovery"] = view.teacher.min_recovery
        done.append((record, save_record(record, out=out if len(views) == 1 else None,
                                         beside=beside)))
    return done


def qualify_endpoint(
    recipe_path: str | Path,
    endpoint: str,
    *,
    split: str = "eval",
    out: str | Path | None = None,
    max_tasks: int | None = None,
    offline: bool = False,
    timeout_s: float = 30.0,
    curve_files: tuple[str | None, str | None] = (None, None),
    route: str | None = None,
) -> list[tuple[dict[str, Any], list[Path]]]:
    """Measure the teacher serving at ``endpoint`` on ``split`` (``route``: on each
    environment routed to that route), save each record."""
    from miniverl.common.errors import ConfigError
    from miniverl.common.recipe import load_recipe
    from miniverl.common.runtime import apply_cpu_threads
    from miniverl.protocol.endpoints import check_endpoint, load_curve_client_keys
    from miniverl.protocol.engine_client import check_engine_endpoint, is_engine_endpoint
    from miniverl.student.qualify import save_record
    from miniverl.student.qualify_remote import measure_endpoint

    # A vLLM or SGLang server (http/https) is measured through its completions endpoint.
    check_engine_endpoint(endpoint) if is_engine_endpoint(endpoint) else check_endpoint(endpoint)
    recipe = load_recipe(recipe_path)
    curve = None
    if any(curve_files):
        if not all(curve_files):
            raise ConfigError("CURVE needs both --curve-secret-key and --curve-server-key")
        curve = load_curve_client_keys(*curve_files)
    apply_cpu_threads(recipe.runtime.cpu_threads)
    views = route_views(recipe, recipe_path, route)
    done = []
    for view in views:
        record = measure_endpoint(view, endpoint, split=split, max_tasks=max_tasks,
                                  curve=curve, offline=offline, timeout_s=timeout_s)
        teacher = view.teacher
        record["min_success"] = teacher.min_success if teacher is not None else None
        record["min_recovery"] = teacher.min_recovery if teacher is not None else None
        done.append((record, save_record(record, out=out if len(views) == 1 else None)))
    return done


def _engine_of(recipe_path: Path) -> str | None:
    """The recipe's teacher.endpoint when it is an engine server (http/https), else None."""
    from miniverl.common.recipe import load_recipe
    from miniverl.protocol.engine_client import is_engine_endpoint

    teacher = load_recipe(recipe_path).teacher
    endpoint = teacher.endpoint if teacher is not None else None
    return endpoint if is_engine_endpoint(endpoint) else None


def register(app: typer.Typer) -> None:
    """Add ``qualify-teacher`` to ``app``."""

    @app.command("qualify-teacher")
    def qualify_teacher(
        recipe: Path = typer.Argument(..., help="Recipe YAML whose teacher is measured."),
        split: str = typer.Option("eval", "--split", help="Held-out split: eval or test."),
        out: Path = typer.Option(None, "--out", help="Also write the record to this file."),
        max_tasks: int = typer.Option(None, "--max-tasks", min=1, help="Cap the tasks played."),
        offline: bool = typer.Option(False, "--offline", help="Never touch the network."),
        teacher: str = typer.Option(
            None, "--teacher",
            help="Measure the teacher already serving at this endpoint instead of loading "
            "the recipe's.",
        ),
        timeout: float = typer.Option(
            30.0, "--timeout", min=0.1, help="With --teacher: seconds to wait for its handshake."
        ),
        curve_secret_key: str = typer.Option(
            None, "--curve-secret-key", help="With --teacher: client CURVE secret key file."
        ),
        curve_server_key: str = typer.Option(
            None, "--curve-server-key", help="With --teacher: server CURVE public key file."
        ),
        route: str = typer.Option(
            None, "--route",
            help="Several teachers: measure this route's teacher on each environment routed "
            "to it (the records its min_success reads).",
        ),
    ) -> None:
        """Measure the teacher's own greedy success and record it (the competence gate)."""
        from miniverl.student.qualify import describe_teacher

        if teacher is None:
            teacher = _engine_of(recipe)  # an engine teacher is measured where it serves
        if teacher is None:
            if curve_secret_key or curve_server_key:
                from miniverl.common.errors import ConfigError

                raise ConfigError("--curve-secret-key/--curve-server-key go with --teacher "
                                  "ENDPOINT (a running teacher); leave them out otherwise")
            done = qualify_recipe(recipe, split=split, out=out, max_tasks=max_tasks,
                                  offline=offline, route=route)
        else:
            done = qualify_endpoint(
                recipe, teacher, split=split, out=out, max_tasks=max_tasks, offline=offline,
                timeout_s=timeout, curve_files=(curve_secret_key, curve_server_key),
                route=route)
        failed = False
        for record, paths in done:
            failed = _said(record, paths, describe_teacher) or failed
        if failed:
            raise typer.Exit(1)


def _said(record: dict[str, Any], paths: list[Path], describe_teacher: Any) -> bool:
    """Print one record's measurement, where it went and its gates; True if one failed."""
    env = record["environment"]
    typer.echo(
        f"teacher {describe_teacher(record['teacher'])}: success {record['success']:.1%} "
        f"on {env['name']} {record['split']} (n={record['n']}"
        + (f", {env['view']} view)" if env.get("view") else ")")
    )
    for diff, row in record["by_difficulty"].items():
        typer.echo(f"  {diff:<8} {row['success']:.1%} of {int(row['n'])}")
    faults = record.get("faults")
    if faults:  # an environment with injected tool faults (docs/environments.md)
        rate = faults["recovery"]["rate"]
        typer.echo(f"  recovery {'n/a' if rate is None else f'{rate:.1%}'} of "
                   f"{faults['recovery']['n_error_episodes']} episodes with a tool error")
    for path in paths:
        typer.echo(f"record: {path}")
    failed = False
    for gate, value in (("min_success", record["success"]),
                        ("min_recovery", record.get("recovery"))):
        threshold = record.get(gate)
        if threshold is not None:
            ok = value is not None and value >= threshold
            verdict = "qualified" if ok else "NOT qualified"
            typer.echo(f"teacher.{gate} {threshold:g}: {verdict}")
            failed = failed or not ok
    return failed
