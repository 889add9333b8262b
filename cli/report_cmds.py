"""CLI: ``miniverl report``, ``miniverl benchmark`` and ``miniverl export-benchmark``.

``report RUN`` writes one run's page; ``report RUN_A RUN_B ... --out compare.html`` one
page comparing them (:mod:`miniverl.student.report.compare`). Thin wrappers over
:mod:`miniverl.student.report`, :mod:`miniverl.student.benchmark.run`
and :mod:`miniverl.student.benchmark.export`; all three are torch-free (the default
benchmark cell imports the trainer only when it runs). ``report`` exits 1 when a sealed
file or line does not match its digest (the page is still written, listing it).
"""

from __future__ import annotations

# Imports inside command bodies are deliberate: `miniverl --help` stays fast and torch-free.
from pathlib import Path

import typer


def report(
    runs: list[Path] = typer.Argument(
        ..., help="Run directory, e.g. runs/<id>; two or more runs: one comparison page."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="HTML file (default <run>/report.html; compare.html for several)."
    ),
    markdown: Path | None = typer.Option(
        None, "--markdown", help="Also write a markdown summary (one run)."
    ),
) -> None:
    """Write a self-contained offline HTML report of a run, or compare several runs."""
    from miniverl.common.errors import ConfigError, ProvenanceError

    for run in runs:
        if run.is_dir() and not any((run / f).is_file() for f in ("status.json", "manifest.json")):
            raise ProvenanceError(
                f"{run} is not a run directory (no status.json or manifest.json); pass runs/<id>"
            )
    if len(runs) > 1:
        if markdown:
            raise ConfigError("--markdown summarises one run; drop it to compare several runs")
        from miniverl.student.report.compare import build_comparison

        path, parsed = build_comparison(runs, out or Path("compare.html"))
        typer.echo(f"comparison: {path}")
    else:
        from miniverl.student.report.build import build_report
        from miniverl.student.report.load import load_run

        path = build_report(runs[0], out=out, markdown=markdown)
        parsed = [load_run(runs[0])]
        typer.echo(f"report: {path}")
        if markdown:
            typer.echo(f"markdown: {markdown}")
    tampered = [t for data in parsed for t in data.tampered]
    for data in parsed:
        for problem in data.problems:
            if problem not in data.tampered:
                typer.echo(f"note: {data.run_id}: {problem}" if len(parsed) > 1
                           else f"note: {problem}", err=True)
    if tampered:
        # The page lists what was skipped; the exit code must not call the run sound.
        raise ProvenanceError("; ".join(tampered))


def benchmark(
    config: Path = typer.Argument(
        ..., help="Benchmark config YAML, e.g. benchmarks/toy_benchmark.yaml."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted benchmark."),
    output_dir: Path | None = typer.Option(
        None, "--output-dir", help="Where to write (default runs/benchmarks/<name>)."
    ),
    update_committed: bool = typer.Option(
        False, "--update-committed",
        help="Rewrite the committed results (the config's output_dir) instead.",
    ),
) -> None:
    """Compare training arms over several seeds under one matched budget."""
    from miniverl.student.benchmark.run import run_benchmark
    from miniverl.student.benchmark.stats import summary_markdown

    def progress(cell) -> None:
        state = cell.result.status
        extra = f" ({cell.result.error})" if cell.result.error else ""
        typer.echo(f"cell {cell.arm} seed {cell.seed}: {state}{extra}", err=True)

    results, out_dir = run_benchmark(config, resume=resume, output_dir=output_dir,
                                     update_committed=update_committed, on_cell=progress)
    typer.echo(summary_markdown(results))
    typer.echo(f"results: {out_dir / 'results.json'}\nreport: {out_dir / 'report.html'}")
    if not results.complete:
        raise typer.Exit(1)


def export_benchmark(
    source: Path = typer.Argument(..., help="A run directory or a benchmark results.json."),
    out: Path = typer.Option(..., "--out", help="Where to write the shareable JSON."),
) -> None:
    """Write a sanitized, schema-validated hardware result that can be shared."""
    from miniverl.student.benchmark.export import export_benchmark as _export

    typer.echo(f"wrote {_export(source, out)} (secrets and local paths redacted)")


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app` and its schemas to ``miniverl schema``."""
    from miniverl.cli.foundation import SCHEMAS

    SCHEMAS.setdefault(
        "benchmark", "miniverl.student.benchmark.export:benchmark_result_json_schema"
    )
    SCHEMAS.setdefault(
        "benchmark-results", "miniverl.student.benchmark.results:benchmark_results_json_schema"
    )
    app.command("report")(report)
    app.command("benchmark")(benchmark)
    app.command("export-benchmark")(export_benchmark)
