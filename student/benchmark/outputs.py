"""Where a benchmark writes: a fresh folder by default, the committed results only when asked.

Every benchmark (``miniverl benchmark`` and the scripts in ``benchmarks/``) takes the same
two options: ``--output-dir DIR`` (where this run writes) and ``--update-committed`` (rewrite
the committed result under ``benchmarks/results/``). Without either, a run writes to a
git-ignored folder of its own (:data:`FRESH_ROOT`), so a fresh clone can rerun every
benchmark without refusing because a result is committed and without touching one.
:func:`refuse_committed` is the guard: a file git tracks is written only with
``--update-committed``. :func:`relative_to` keeps the paths a record stores relative to
the folder it is read from, never a machine's absolute path. :func:`add_output_options` and
:func:`script_output_file` give a script that writes one result file the same two options.

This module runs nothing and imports no torch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from miniverl.common.errors import ConfigError

FRESH_ROOT = Path("runs") / "benchmarks"  # git-ignored (.gitignore: runs/)


def tracked_by_git(paths: Iterable[Path]) -> list[Path]:
    """Those of ``paths`` that exist and that git tracks (none outside a git checkout)."""
    tracked = []
    for path in paths:
        if not path.exists():
            continue
        folder, name = (path, ".") if path.is_dir() else (path.parent, path.name)
        try:
            listed = subprocess.run(["git", "-C", str(folder), "ls-files", "--", name],
                                    capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return []  # no git: nothing is known to be committed
        if listed.returncode == 0 and listed.stdout.strip():
            tracked.append(path)
    return tracked


def refuse_committed(paths: Iterable[Path], *, update_committed: bool) -> None:
    """ConfigError naming the committed files among ``paths`` unless told to rewrite them."""
    if update_committed:
        return
    committed = tracked_by_git(paths)
    if committed:
        names = ", ".join(str(p) for p in committed)
        what = "is a committed result" if len(committed) == 1 else "are committed results"
        raise ConfigError(
            f"{names} {what}; pass --update-committed to rewrite "
            f"{'it' if len(committed) == 1 else 'them'}, or --output-dir DIR to write elsewhere"
        )


def choose_output_dir(output_dir: Path | None, *, update_committed: bool, committed: Path,
                      fresh: Path) -> Path:
    """``output_dir``, else ``committed`` when told to update it, else ``fresh``."""
    if output_dir is None:
        return Path(committed) if update_committed else Path(fresh)
    is_committed = Path(output_dir).resolve() == Path(committed).resolve()
    if update_committed and not is_committed:
        raise ConfigError(
            f"--output-dir {output_dir} and --update-committed ({committed}) both say where "
            "to write; pass one of them"
        )
    if is_committed and not update_committed:
        raise ConfigError(
            f"--output-dir {output_dir} is the committed results folder; pass "
            "--update-committed to rewrite it, or another --output-dir"
        )
    return Path(output_dir)


def relative_to(path: str | Path, base: str | Path) -> str:
    """``path`` relative to ``base`` (``..`` where it lies outside), as a POSIX string."""
    return Path(os.path.relpath(Path(path).resolve(), Path(base).resolve())).as_posix()


def resolve_under(path: str | Path, base: str | Path) -> Path:
    """A stored path read back: relative ones are under ``base``, absolute ones as they are."""
    path = Path(path)
    return path if path.is_absolute() else Path(base) / path


def add_output_options(parser: argparse.ArgumentParser, committed: Path) -> None:
    """``--output-dir`` and ``--update-committed`` on a script that writes one result file."""
    parser.add_argument("--output-dir", type=Path, default=None,
                        help=f"where to write {committed.name} (default {FRESH_ROOT}/"
                             f"{committed.stem})")
    parser.add_argument("--update-committed", action="store_true",
                        help=f"rewrite the committed benchmarks/results/{committed.name} instead")


def script_output_file(args: argparse.Namespace, committed: Path, root: Path) -> Path:
    """The file a script writes: ``committed`` with ``--update-committed``, else its name
    in ``--output-dir`` (default ``root/runs/benchmarks/<stem>``). A bad choice exits 1
    with one line (a script's error, no traceback)."""
    try:
        if args.update_committed and args.output_dir is not None:
            raise ConfigError(f"--output-dir {args.output_dir} and --update-committed both say "
                              "where to write; pass one of them")
        if args.update_committed:
            return committed
        path = (args.output_dir or root / FRESH_ROOT / committed.stem) / committed.name
        refuse_committed([path], update_committed=False)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
