"""What the scripts that print a docs table from a committed record share: the Markdown
table, and the command line ``--record RECORD [--commit COMMIT]`` that reads the record,
prints the table and, with ``--commit``, the table annotation the docs test checks it by
(tests/docs/figures.py). Imported by the ``*_report.py`` scripts beside it; runs nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """``header`` and ``rows`` as a Markdown table, one line each, ending in a newline."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def report_main(argv: list[str] | None, *, doc: str, script: str, producer: str, key: str,
                table: Callable[[dict[str, Any]], str], records: str = "") -> int:
    """Read ``--record`` (it must hold a non-empty ``key``, as ``producer`` writes it),
    print ``table(record)`` and, with ``--commit``, its annotation naming ``script``.
    ``records`` names where such records are, for the error of an empty one."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--record", required=True, help="the record, relative to the repository")
    ap.add_argument("--commit", default=None,
                    help="the commit that holds the record: the table gets its annotation")
    args = ap.parse_args(argv)
    path = Path(args.record) if Path(args.record).is_absolute() else ROOT / args.record
    if not path.is_file():
        sys.exit(f"error: {args.record} does not exist; run python {producer} first, or name "
                 "a committed record")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not data.get(key):
        sys.exit(f"error: {args.record} holds no {key}; name what {producer} recorded{records}")
    out = table(data)
    if args.commit:
        out += (f"\n<!-- table: {args.record} @ {args.commit} by python {script} "
                f"--record {args.record} -->\n")
    print(out, end="")
    return 0
