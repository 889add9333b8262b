"""``miniverl qualify-teacher RECIPE``: measure the teacher's own success, record it.

The recipe's teacher is loaded in this process exactly as the teacher server would
serve it (the prepared teacher when ``teacher.prepare`` is set, else the model plus
its PEFT adapter), plays the environment's held-out split greedily, and the
qualification record (``student/qualify.py``) is written to the per-user cache, next
to a prepared teacher, and to ``--out``. ``train`` and ``up`` read it when
``teacher.min_success`` is set. The command exits 1 when the measured success is
below ``teacher.min_success`` (the record is written anyway).

This module is the only place that joins the teacher's loader with the student's
evaluation; it trains nothing and serves nothing.
"""

from __future__ import annotations

# Imports inside command bodies are deliberate: `miniverl --help` stays fast and torch-free.
from pathlib import Path
from typing import Any

import typer


def qualify_recipe(
    recipe_path: str | Path,
    *,
    split: str = "eval",
    out: str | Path | None = None,
    max_tasks: int | None = None,
    offline: bool = False,
    show_progress: bool = True,
) -> tuple[dict[str, Any], list[Path]]:
    """Load the recipe's teacher, measure it on ``split``, save the record."""
    from miniverl.common.errors import ConfigError
    from miniverl.common.modeling import load_tokenizer
    from miniverl.common.recipe import load_recipe
    from miniverl.common.runtime import apply_cpu_threads
    from miniverl.student.qualify import measure, save_record
    from miniverl.student.teacher_prep import prep_recipe_path, prepare_teacher
    from miniverl.teacher_server.loader import TeacherSpec, load_teacher, spec_from_recipe

    recipe = load_recipe(recipe_path)
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
        spec = spec_from_recipe(recipe_path, offline=offline)
    loaded = load_teacher(spec)
    tokenizer = load_tokenizer(loaded.model_dir)
    record = measure(
        loaded.model, tokenizer, recipe, identity=loaded.info, model_dir=loaded.model_dir,
        split=split, max_tasks=max_tasks, tokenizer_fp=loaded.tokenizer_fp,
    )
    record["min_success"] = recipe.teacher.min_success
    return record, save_record(record, out=out, beside=beside)


def register(app: typer.Typer) -> None:
    """Add ``qualify-teacher`` to ``app``."""

    @app.command("qualify-teacher")
    def qualify_teacher(
        recipe: Path = typer.Argument(..., help="Recipe YAML whose teacher is measured."),
        split: str = typer.Option("eval", "--split", help="Held-out split: eval or test."),
        out: Path = typer.Option(None, "--out", help="Also write the record to this file."),
        max_tasks: int = typer.Option(None, "--max-tasks", min=1, help="Cap the tasks played."),
        offline: bool = typer.Option(False, "--offline", help="Never touch the network."),
    ) -> None:
        """Measure the teacher's own greedy success and record it (the competence gate)."""
        from miniverl.student.qualify import describe_teacher

        record, paths = qualify_recipe(recipe, split=split, out=out, max_tasks=max_tasks,
                                       offline=offline)
        env = record["environment"]
        typer.echo(
            f"teacher {describe_teacher(record['teacher'])}: success {record['success']:.1%} "
            f"on {env['name']} {record['split']} (n={record['n']})"
        )
        for diff, row in record["by_difficulty"].items():
            typer.echo(f"  {diff:<8} {row['success']:.1%} of {int(row['n'])}")
        for path in paths:
            typer.echo(f"record: {path}")
        threshold = record.get("min_success")
        if threshold is not None:
            ok = record["success"] >= threshold
            typer.echo(f"teacher.min_success {threshold:g}: {'qualified' if ok else 'NOT qualified'}")
            if not ok:
                raise typer.Exit(1)
