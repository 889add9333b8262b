"""``miniverl teacher serve|status|reload|park|wake|shutdown|keys|use``: run and steer a teacher.

``serve`` runs the teacher in the foreground (the same code as ``python -m
miniverl.teacher_server``; Ctrl-C or SIGTERM drains and exits); ``serve --recipe`` of a
recipe with ``teacher.prepare`` prepares the teacher first (or reuses the cached one)
and refuses one below the recipe's ``teacher.min_success``. ``status`` is a
scoring-level request; ``reload``, ``park``, ``wake`` and ``shutdown`` are admin requests
over ``mvl-score/1`` and carry proof (docs/protocol.md, "Admin"): an admin CURVE key, or the admin token
file the teacher wrote at start (``--admin-token FILE``; by default the one beside an
``ipc://`` socket, or the per-user one of a ``tcp://`` teacher started without ``--log``).
They need no tokenizer and no torch. ``keys`` creates CURVE certificates for a teacher,
a student and an admin. Each command is one library call; the
library raises ``MiniverlError`` for expected failures and ``cli/app.py`` prints them
as one line. ``use`` asks a running student (by its run directory) to switch
teachers over its control socket; the student refuses (exit 1, with the reason) a
teacher it would not accept: none answering, another tokenizer, below its gate. Other modules may add commands to :data:`teacher_app`.
"""

from __future__ import annotations

# Imports inside command bodies are deliberate: `miniverl --help` stays fast and torch-free.
import contextlib
import inspect
import json
from collections.abc import Iterator

import typer

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"

teacher_app = typer.Typer(
    name="teacher",
    help="Serve a frozen teacher over mvl-score/1 and steer a running one.",
    no_args_is_help=True,
)

ENDPOINT_ARG = typer.Argument(..., help="Teacher endpoint, e.g. tcp://127.0.0.1:5555.")
TIMEOUT_OPT = typer.Option(30.0, "--timeout", min=0.1, help="Give up after this many seconds.")
CURVE_SECRET_OPT = typer.Option(None, "--curve-secret-key", help="Client CURVE secret key file.")
CURVE_SERVER_OPT = typer.Option(None, "--curve-server-key", help="Server CURVE public key file.")
MODE_OPT = typer.Option("drain", "--mode", help="drain: finish open work; abort: fail it.")
ADMIN_TOKEN_OPT = typer.Option(
    None, "--admin-token",
    help="Admin token file the teacher wrote (default: beside its ipc socket, or the "
    "per-user one of a tcp teacher started without --log).",
)


@teacher_app.command("serve")
def serve(
    model: str = typer.Option(None, "--model", help="Local HF model directory or hub id ORG/NAME."),
    revision: str = typer.Option(None, "--revision", help="40-hex commit pinning a hub id."),
    adapter: str = typer.Option(None, "--adapter", help="PEFT adapter directory to merge."),
    adapter_revision: str = typer.Option(
        None, "--adapter-revision", help="40-hex commit pinning a hub adapter id."
    ),
    adapters: list[str] = typer.Option(
        None, "--adapters", metavar="NAME=DIR",
        help="Serve this PEFT adapter (a directory, or ORG/NAME@<40-hex>) under NAME beside "
        "the other --adapters, over one base (repeatable; not with --adapter).",
    ),
    recipe: str = typer.Option(
        None, "--recipe",
        help="Use this recipe's teacher section (teacher.prepare: prepared first, or the "
        "cached one; a RELOAD its teacher.min_success refuses is refused).",
    ),
    scorer: str = typer.Option(
        None, "--scorer", help="causal_lm (default) or a miniverl.scorers entry point."
    ),
    scorer_option: list[str] = typer.Option(
        None, "--scorer-option", help="KEY=VALUE option for the scorer (repeatable)."
    ),
    bind: str = typer.Option(
        None, "--bind", help=f"Endpoint to bind (default {DEFAULT_ENDPOINT})."
    ),
    device: str = typer.Option(None, "--device", help="auto, cpu, cuda or cuda:N."),
    dtype: str = typer.Option(None, "--dtype", help="auto, float32, bfloat16 or float16."),
    offline: bool = typer.Option(False, "--offline", help="Never touch the network."),
    log: str = typer.Option(None, "--log", help="JSON-lines log file (default stderr)."),
    threads: int = typer.Option(None, "--threads", min=1, help="CPU threads (default 1)."),
    exact_max_vocab: int = typer.Option(
        262144, "--exact-max-vocab", min=1, help="Largest vocabulary served with kind=exact."
    ),
    prefix_cache_tokens: int = typer.Option(
        None, "--prefix-cache-tokens", min=0,
        help="Tokens of shared system blocks kept between requests (default 2048; 0 keeps none).",
    ),
    openai: str = typer.Option(
        None, "--openai", metavar="HOST:PORT",
        help="Also serve OpenAI-compatible /v1/completions with prompt_logprobs here.",
    ),
    openai_token_file: str = typer.Option(
        None, "--openai-token-file", help="Bearer token file for --openai (needed off loopback)."
    ),
    curve_secret_key: str = typer.Option(
        None, "--curve-secret-key", help="Server CURVE secret key file (needed off loopback)."
    ),
    curve_authorized_dir: str = typer.Option(
        None, "--curve-authorized-dir", help="Directory of authorized client public keys."
    ),
    curve_admin_dir: str = typer.Option(
        None, "--curve-admin-dir", help="Directory of admin public keys (RELOAD, PARK, SHUTDOWN)."
    ),
) -> None:
    """Load a teacher and serve it until SHUTDOWN or Ctrl-C (binds before loading).

    With ``--recipe`` whose ``teacher.prepare`` is set, the teacher is prepared first
    (or the cached one reused) and must pass the recipe's ``teacher.min_success``.
    """
    from miniverl.teacher_server.__main__ import build_parser
    from miniverl.teacher_server.__main__ import serve as run

    argv: list[str] = ["--exact-max-vocab", str(exact_max_vocab)]
    prepared = prepared_teacher(recipe) if recipe is not None and model is None else None
    if prepared is not None:
        argv += ["--prepared-dir", str(prepared)]
    for flag, value in (
        ("--model", model),
        ("--revision", revision),
        ("--adapter", adapter),
        ("--adapter-revision", adapter_revision),
        ("--recipe", recipe),
        ("--scorer", scorer),
        ("--bind", bind),
        ("--device", device),
        ("--dtype", dtype),
        ("--log", log),
        ("--threads", threads),
        ("--prefix-cache-tokens", prefix_cache_tokens),
        ("--openai", openai),
        ("--openai-token-file", openai_token_file),
        ("--curve-secret-key", curve_secret_key),
        ("--curve-authorized-dir", curve_authorized_dir),
        ("--curve-admin-dir", curve_admin_dir),
    ):
        if value is not None:
            argv += [flag, str(value)]
    for option in scorer_option or []:
        argv += ["--scorer-option", option]
    for pair in adapters or []:
        argv += ["--adapters", pair]
    if offline:
        argv.append("--offline")
    code = run(build_parser().parse_args(argv))
    if code:
        raise typer.Exit(code)


def prepared_teacher(recipe_path: str):
    """The directory ``teacher serve --recipe`` serves when the recipe prepares its teacher.

    Runs ``teacher.prepare`` (or reuses the cached result, as ``miniverl up`` does) and
    applies the recipe's competence gate to it, so a preparation that did not make the
    teacher competent is refused here, not by each student that attaches. None when the
    recipe prepares nothing.
    """
    from miniverl.common.qualification import require_qualified
    from miniverl.common.recipe import load_recipe
    from miniverl.student.teacher_prep import prep_recipe_path, prepare_teacher

    recipe = load_recipe(recipe_path)
    prep = prep_recipe_path(recipe, recipe_path)
    if prep is None:
        return None
    typer.echo(f"teacher: preparing from {prep.name} (cached after the first run)", err=True)
    prepared = prepare_teacher(recipe, prep)
    where = "cached" if prepared.cached else f"trained in {prepared.record['wall_s']:.1f} s"
    identity = {"name": prepared.model_dir.name, "model": str(prepared.model_dir),
                "revision": None, "adapter_sha256": None}
    record = require_qualified(recipe, identity)
    gates = []
    if record and recipe.teacher.min_success is not None:
        gates.append(f"success {record['success']:.3f} >= teacher.min_success "
                     f"{recipe.teacher.min_success:g}")
    if record and recipe.teacher.min_recovery is not None:
        gates.append(f"recovery {record['recovery']:.3f} >= teacher.min_recovery "
                     f"{recipe.teacher.min_recovery:g}")
    qualified = f", qualified: {', '.join(gates)}" if gates else ""
    typer.echo(f"teacher: {prepared.model_dir} ({where}{qualified})", err=True)
    return prepared.model_dir


@contextlib.contextmanager
def _admin(endpoint: str, timeout: float, secret: str | None, server_key: str | None,
           mode: str | None = None, token: str | None = None, proof: bool = False) -> Iterator:
    """An admin-only client, closed on exit (no HELLO: these commands need no tokenizer);
    ``mode``, when given, must be drain or abort. ``proof``: the command is an admin
    message, so without CURVE keys it sends the admin token (``token`` or the default)."""
    from miniverl.common.errors import ConfigError, Unauthorized
    from miniverl.protocol.endpoints import default_admin_token_file, read_admin_token
    from miniverl.protocol.sync_client import SyncTeacherClient

    if mode is not None and mode not in ("drain", "abort"):
        raise ConfigError(f"--mode {mode!r} is not drain or abort")
    curve = None
    if secret or server_key:
        from miniverl.protocol.endpoints import load_curve_client_keys

        if not (secret and server_key):
            raise ConfigError("CURVE needs both --curve-secret-key and --curve-server-key")
        curve = load_curve_client_keys(secret, server_key)
    token_file = token or (default_admin_token_file(endpoint) if proof and not curve else None)
    client = SyncTeacherClient(
        endpoint,
        tokenizer_fp=None,
        vocab_size=1,
        client_name="miniverl-cli",
        request_timeout_s=timeout,
        unavailable_timeout_s=timeout,
        curve=curve,
        admin_token=read_admin_token(token_file) if token_file else None,
    )
    try:
        yield client
    except Unauthorized as exc:
        hint = (
            "use a key from the teacher's --curve-admin-dir" if curve else
            f"the token in {token_file} is not this teacher's (a restarted teacher writes a new one)"
            if token_file else
            f"no admin token file was found for {endpoint}: pass --admin-token FILE (the "
            "teacher's log line 'admin_token' names it) or an admin CURVE key"
        )
        raise Unauthorized(f"{exc}; {hint}") from None
    finally:
        client.close()


@teacher_app.command("status")
def status(
    endpoint: str = ENDPOINT_ARG,
    timeout: float = TIMEOUT_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the full STATUS_OK as JSON."),
    curve_secret_key: str = CURVE_SECRET_OPT,
    curve_server_key: str = CURVE_SERVER_OPT,
) -> None:
    """State, identity, counters and device memory of a running teacher."""
    with _admin(endpoint, timeout, curve_secret_key, curve_server_key) as client:
        info = client.status()
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    teacher = info.get("teacher") or {}
    counters = info.get("counters") or {}
    typer.echo(f"{endpoint}: {info['state']}  instance {info['instance'][:12]}  gen {info['gen']}")
    if teacher:
        rev = f"@{teacher['revision'][:12]}" if teacher.get("revision") else ""
        adapter = (
            " + adapter " + teacher["adapter_sha256"][:19] if teacher.get("adapter_sha256") else ""
        )
        typer.echo(f"teacher: {teacher['name']} ({teacher['model']}{rev}){adapter}")
    for served in info.get("adapters") or []:
        typer.echo(f"adapter: {served['name']} {served['adapter_sha256'][:19]}")
    typer.echo(
        f"inflight {info['inflight']}  queue {info['queue_depth']}  requests "
        f"{counters.get('requests', 0)}  positions {counters.get('positions', 0)}  errors "
        f"{sum((counters.get('errors') or {}).values())}"
    )
    memory = info.get("memory") or {}
    if memory.get("allocated_bytes") is not None:
        typer.echo(
            f"memory: {memory['device']} {memory['allocated_bytes'] / 2**30:.2f} GiB allocated "
            f"of {memory['total_bytes'] / 2**30:.1f} GiB"
        )


@teacher_app.command("reload")
def reload(
    endpoint: str = ENDPOINT_ARG,
    model: str = typer.Option(..., "--model", help="Local HF model directory or hub id."),
    revision: str = typer.Option(None, "--revision", help="40-hex commit pinning a hub id."),
    adapter: str = typer.Option(None, "--adapter", help="PEFT adapter directory or hub id."),
    adapter_revision: str = typer.Option(
        None, "--adapter-revision", help="40-hex commit pinning a hub adapter id."
    ),
    mode: str = MODE_OPT,
    timeout: float = typer.Option(600.0, "--timeout", min=0.1, help="Seconds to wait."),
    curve_secret_key: str = CURVE_SECRET_OPT,
    curve_server_key: str = CURVE_SERVER_OPT,
    admin_token: str = ADMIN_TOKEN_OPT,
) -> None:
    """Swap the served weights in place (same tokenizer only); gen += 1."""
    with _admin(endpoint, timeout, curve_secret_key, curve_server_key, mode, admin_token,
                proof=True) as client:
        ok = client.reload(model, revision=revision, adapter=adapter, mode=mode, timeout_s=timeout,
                           adapter_revision=adapter_revision)
    typer.echo(f"reloaded: gen {ok.gen}, teacher {ok.teacher.name} ({ok.teacher.model})")


def _admin_command(name: str, doc: str) -> None:
    """``miniverl teacher shutdown|park|wake``: one admin call each, with the same options;
    only ``shutdown`` takes ``--mode`` (the others' signature drops it, so typer does too)."""

    def command(
        endpoint: str = ENDPOINT_ARG,
        mode: str = MODE_OPT,
        timeout: float = TIMEOUT_OPT,
        curve_secret_key: str = CURVE_SECRET_OPT,
        curve_server_key: str = CURVE_SERVER_OPT,
        admin_token: str = ADMIN_TOKEN_OPT,
    ) -> None:
        drain = mode if name == "shutdown" else None
        with _admin(endpoint, timeout, curve_secret_key, curve_server_key, drain, admin_token,
                    proof=True) as client:
            if name == "shutdown":
                client.shutdown(mode=mode, timeout_s=timeout)
                said = f"shut down ({mode})"
            else:
                said = getattr(client, name)().state.value
        typer.echo(f"{endpoint}: {said}")

    if name != "shutdown":
        signature = inspect.signature(command)
        command.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[p for p in signature.parameters.values() if p.name != "mode"])
    command.__doc__ = doc
    teacher_app.command(name)(command)


_admin_command("shutdown", "Stop a running teacher (drain finishes open requests first).")
_admin_command("park", "Move the teacher's weights off the accelerator (a SCORE or `wake` "
                       "brings them back).")
_admin_command("wake", "Move a parked teacher's weights back onto the accelerator.")


@teacher_app.command("keys")
def keys(
    folder: str = typer.Argument(..., help="New directory for the certificates (created 0700)."),
    endpoint: str = typer.Option(
        "tcp://HOST:5555", "--endpoint", help="Endpoint shown in the printed commands."
    ),
) -> None:
    """Create CURVE certificates for a teacher, a student and an admin; print the flags."""
    from miniverl.protocol.endpoints import create_curve_keys

    p = create_curve_keys(folder)
    typer.echo(f"created CURVE keys in {folder} (secret files 0600, never overwritten)")
    typer.echo("teacher (keep server.key_secret on its machine):")
    typer.echo(f"  miniverl teacher serve --recipe RECIPE --bind {endpoint} "
               f"--curve-secret-key {p['server_secret']} --curve-authorized-dir "
               f"{p['authorized_dir']} --curve-admin-dir {p['admin_dir']}")
    typer.echo("student (copy student.key_secret and server.key to its machine):")
    typer.echo(f"  miniverl up RECIPE --teacher {endpoint} --curve-secret-key "
               f"{p['student_secret']} --curve-server-key {p['server_public']}")
    typer.echo("  or in the recipe: teacher.curve_secret_key and teacher.curve_server_key")
    typer.echo("admin (reload, park, wake, shutdown):")
    typer.echo(f"  miniverl teacher shutdown {endpoint} --curve-secret-key "
               f"{p['admin_secret']} --curve-server-key {p['server_public']}")


@teacher_app.command("use")
def use(
    run: str = typer.Argument(..., help="Run directory of a running student (`miniverl up`)."),
    endpoint: str = ENDPOINT_ARG,
    timeout: float = typer.Option(10.0, "--timeout", min=0.1, help="Seconds to wait for the student."),
    route: str = typer.Option(
        None, "--route",
        help="With several teachers: the route to move (a teacher's name, or NAME/ADAPTER); "
        "the others keep theirs (docs/several-teachers.md)."),
) -> None:
    """Switch a running student to another teacher at its next update boundary (RETARGET);
    a teacher the run would refuse is refused now (exit 1)."""
    from miniverl.common.names import check_route
    from miniverl.protocol.control_socket import (
        RetargetRequest,
        control_endpoint,
        control_request,
        new_id,
    )

    if route is not None:
        check_route(route)  # a name is a name before it is sent (common/names.py)
    reply = control_request(
        control_endpoint(run), RetargetRequest(id=new_id(), endpoint=endpoint, route=route),
        timeout_s=timeout)
    typer.echo(
        f"retarget{f' of {route}' if route else ''} to {reply.endpoint} accepted (handshake, "
        "tokenizer and gate checked); it "
        f"takes effect at the {reply.takes_effect} (events.jsonl records teacher_changed)"
    )

def register(app: typer.Typer) -> None:
    """Add the ``teacher`` command group (and ``qualify-teacher``) to ``app``."""
    from miniverl.cli import qualify_cmds

    app.add_typer(teacher_app, name="teacher")
    qualify_cmds.register(app)
