"""``miniverl cache stats|validate|prune DIR``: inspect and check a targets cache.

``DIR`` is a cache directory (the one holding ``index.json``) or a run directory
whose ``targets/`` holds the cache. ``validate`` recomputes every sha256 and
prints one line per problem, exiting 1 if there is any. Torch-free: these
commands work on the core install. They do not score or rescore anything.
"""

from __future__ import annotations

# Imports inside command bodies are deliberate: `miniverl --help` stays fast and torch-free.
from pathlib import Path

import typer

cache_app = typer.Typer(
    name="cache",
    help="Inspect and check a teacher-targets cache.",
    no_args_is_help=True,
)

DIR_ARG = typer.Argument(..., help="Cache directory (holds index.json) or a run directory.")


def _resolve(directory: Path) -> Path:
    if not (directory / "index.json").exists() and (directory / "targets" / "index.json").exists():
        return directory / "targets"
    return directory


def _open(directory: Path):
    from miniverl.student.targets_cache import TargetsCache

    return TargetsCache(_resolve(directory))


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


@cache_app.command("stats")
def stats(
    directory: Path = DIR_ARG,
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
) -> None:
    """Entries, shards, bytes, student versions and teachers in a cache."""
    import json

    info = _open(directory).stats()
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    ident = info["identity"]
    versions = info["versions"]
    span = f"{versions[0]}..{versions[-1]} ({len(versions)})" if versions else "none"
    k = f" k={ident['k']}" if ident["kind"] == "topk" else ""
    lines = [
        ("targets cache", info["path"]),
        (
            "identity",
            f"{ident['kind']}{k}, {ident['objective']}, temperature {ident['temperature']}, "
            f"vocab {ident['vocab_size']}, tokenizer {ident['tokenizer_fp']}",
        ),
        (
            "entries",
            f"{info['entries']} ({info['trajectories']} trajectories, "
            f"{info['positions']} positions)",
        ),
        ("shards", f"{info['shards']} ({_human_bytes(info['bytes'])})"),
        ("versions", span),
    ]
    teachers = info["teachers"] or [None]
    for i, t in enumerate(teachers):
        text = "none" if t is None else f"{t['name']} instance {t['instance']} gen {t['gen']}"
        if t is not None:
            text += f" ({t['entries']} entries)"
        lines.append(("teachers" if i == 0 else "", text))
    for label, value in lines:
        typer.echo(f"{label:<14} {value}")


@cache_app.command("validate")
def validate(directory: Path = DIR_ARG) -> None:
    """Recompute every hash and check the index against the shards; exit 1 on any problem."""
    cache = _open(directory)
    problems = cache.validate()
    for problem in problems:
        typer.echo(problem)
    if problems:
        typer.echo(f"{len(problems)} problem(s) in {cache.root}", err=True)
        raise typer.Exit(1)
    info = cache.stats()
    typer.echo(f"ok: {info['entries']} entries in {info['shards']} shards verified")


@cache_app.command("prune")
def prune(
    directory: Path = DIR_ARG,
    keep_last_versions: int = typer.Option(
        None, "--keep-last-versions", min=0, help="Keep the targets of the N newest versions."
    ),
    max_bytes: int = typer.Option(
        None, "--max-bytes", min=0, help="Drop the oldest shards until the cache fits."
    ),
) -> None:
    """Drop old targets by student version and/or total size."""
    from miniverl.common.errors import ConfigError

    if keep_last_versions is None and max_bytes is None:
        raise ConfigError(
            "cache prune needs --keep-last-versions N and/or --max-bytes B; nothing to do"
        )
    result = _open(directory).prune(keep_last_versions=keep_last_versions, max_bytes=max_bytes)
    typer.echo(
        f"removed {result['removed_entries']} entries and {result['removed_shards']} shards "
        f"({_human_bytes(result['freed_bytes'])})"
    )


def register(app: typer.Typer) -> None:
    """Add the ``cache`` command group to ``app``."""
    app.add_typer(cache_app, name="cache")
