"""Bridge commands: export-adapter, export-verl, convert-dataset, import-verl, bridge doctor.

Each command is one call into ``miniverl.bridge``; imports happen inside the command body
so ``miniverl --help`` stays fast. Expected failures raise ``MiniverlError`` subclasses,
which ``cli/app.py`` prints as one line with exit code 1. See docs/verl-bridge.md.
"""

from __future__ import annotations

# Imports inside command bodies are deliberate: `miniverl --help` stays fast and torch-free.
import json
from pathlib import Path

import typer

bridge_app = typer.Typer(help="Check verl bundles.", no_args_is_help=True)


def export_adapter(
    run: Path = typer.Option(..., "--run", help="Run directory (runs/<id>)."),
    out: Path = typer.Option(..., "--out", help="New output directory."),
) -> None:
    """Write the run's latest checkpoint as a standard PEFT adapter (or HF model) + tokenizer."""
    from miniverl.bridge.artifacts import export_adapter as _export

    summary = _export(run, out)
    what = (
        "PEFT adapter"
        if summary["kind"] == "lora"
        else "full fine-tune: Hugging Face model directory"
    )
    typer.echo(f"{what} from step {summary['step']} of {summary['run_id']} -> {out}")


def export_verl(
    run: Path = typer.Option(..., "--run", help="Run directory (runs/<id>)."),
    out: Path = typer.Option(..., "--out", help="New bundle directory."),
    verl_version: str = typer.Option(
        "0.8.0", "--verl-version", help="The verl release the bundle is for: 0.8.0 or 0.9.1."
    ),
    teacher_gpus: list[str] = typer.Option(
        None, "--teacher-gpus",
        help="GPUs of each teacher in verl's teacher pool: N for every teacher, or ROUTE=N "
        "(repeatable). Default 1 each (verl's trainer refuses its own default pool of 0 "
        "nodes).",
    ),
) -> None:
    """Write a checksummed verl bundle (profile single-gpu-online-distillation-v1)."""
    from miniverl.bridge.bundle import export_verl as _export

    manifest = _export(run, out, verl_version=verl_version, teacher_gpus=teacher_gpus)
    envs = manifest.get("environments")
    what = (f", {len(envs)} environments" if envs else "") + (
        f", {len(manifest['teachers']['routes'])} teachers"
        if envs and manifest["teachers"]["routes"] else "")
    typer.echo(
        f"bundle {out} (verl {manifest['verl']['version']}, "
        f"{manifest['kind']}, step {manifest['checkpoint_step']}{what}, "
        f"{manifest['rows']['train']} train / {manifest['rows']['val']} val rows); "
        f"check it with: miniverl bridge doctor {out}"
    )
    for line in manifest["not_moved"]:
        typer.echo(f"does not move: {line}")


def convert_dataset(
    src: Path = typer.Argument(..., help="A .jsonl task set, a .yaml recipe or a verl .parquet."),
    dst: Path = typer.Argument(..., help="Output file (.parquet for verl, .jsonl for miniverl)."),
    to: str = typer.Option(..., "--to", help="verl or miniverl."),
    environment: str = typer.Option(
        None, "--environment", help="Environment of a .jsonl task set without a header line."
    ),
) -> None:
    """Convert task sets to verl Parquet rows and back, losslessly."""
    from miniverl.bridge.convert import convert_dataset as _convert

    n = _convert(src, dst, to, environment)
    typer.echo(f"{n} rows -> {dst} ({to})")


def import_verl(
    config: Path = typer.Argument(
        ..., help="verl config YAML, or a bundle directory written by export-verl."
    ),
    out: Path = typer.Option(..., "--out", help="Recipe YAML to write."),
    revision: str = typer.Option(
        None, "--revision", help="40-hex revision for a hub student model."
    ),
    teacher_revision: str = typer.Option(
        None, "--teacher-revision", help="40-hex revision for a hub teacher."
    ),
    trajectories: Path = typer.Option(
        None, "--trajectories",
        help="A bundle of an offline_kd run: the trajectories.jsonl it distilled from "
        "(the bundle does not hold it).",
    ),
) -> None:
    """Import a whitelisted verl config as a recipe; refuse anything else (import-report.json)."""
    from miniverl.bridge.importer import import_verl as _import

    report, report_path = _import(config, out, revision=revision,
                                  teacher_revision=teacher_revision, trajectories=trajectories)
    counts = ", ".join(f"{v} {k}" for k, v in report["counts"].items() if v)
    typer.echo(f"recipe {out} ({counts}); report {report_path}")


@bridge_app.command("doctor")
def doctor(
    bundle: Path = typer.Argument(..., help="Bundle directory written by export-verl."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON result."),
) -> None:
    """Recheck a bundle: hashes, schema, overrides, reward, adapter, tokenizer, privacy."""
    from miniverl.bridge.doctor import doctor as _doctor
    from miniverl.bridge.doctor import format_report

    if not bundle.is_dir():
        from miniverl.common.errors import ConfigError

        what = "is a file" if bundle.exists() else "does not exist"
        raise ConfigError(
            f"bundle {bundle} {what}; pass the directory written by `miniverl export-verl`"
        )
    result = _doctor(bundle)
    typer.echo(json.dumps(result, indent=2) if as_json else format_report(result))
    if not result["ok"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("export-adapter")(export_adapter)
    app.command("export-verl")(export_verl)
    app.command("convert-dataset")(convert_dataset)
    app.command("import-verl")(import_verl)
    app.add_typer(bridge_app, name="bridge")
