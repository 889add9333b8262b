"""The real-model learning benchmark's two tables as Markdown, printed from its record.

    python benchmarks/real_model_learning_report.py --record benchmarks/results/real_model_learning.json --table arms
    python benchmarks/real_model_learning_report.py --record benchmarks/results/real_model_learning.json --table cells --commit <sha>

Reads what ``benchmarks/real_model_learning.py`` recorded and prints docs/real-model-learning.md's
tables: ``arms`` (per arm, over its seeds: cells ok, success before and after, the gain
with its interval, the mean and largest wall clock of a cell) and ``cells`` (per cell:
success before → after, the gain with its interval, wall clock, the rollout /
teacher-wait / update split, valid tool calls and stop reasons after training). With
``--commit`` (the commit holding the record) the table is followed by its table
annotation (tests/docs/figures.py): the docs test prints it again from the record at
that commit and compares it whole. It computes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _gain(e: dict[str, Any]) -> str:
    return (f"{100 * e['gain']:+.1f} [{100 * e['gain_low']:+.1f}, "
            f"{100 * e['gain_high']:+.1f}]")


def arms_table(data: dict[str, Any]) -> list[list[str]]:
    rows = [["arm", "cells ok", "success before", "success after", "gain, points [95% CI]",
             "wall per cell, mean (max)"]]
    for arm, e in data["arms"].items():
        rows.append([arm, f"{e['ok']}/{e['cells']}", f"{e['success_before']:.1%}",
                     f"{e['success_after']:.1%}", _gain(e),
                     f"{e['mean_wall_s']:.0f} s ({e['max_wall_s']:.0f} s)"])
    return rows


def cells_table(data: dict[str, Any]) -> list[list[str]]:
    rows = [["arm", "seed", "before → after", "gain [95% CI]", "wall",
             "rollout / teacher wait / update (s)", "tool calls valid", "stop reasons after"]]
    for c in data["cells"]:
        split = c.get("time_split") or {}
        calls = (c.get("tool_calls") or {}).get("after") or {}
        valid = ("-" if calls.get("valid_rate") is None
                 else f"{calls['valid_rate']:.0%} of {calls['calls']}")
        stops = ", ".join(f"{k} {v}" for k, v in ((c.get("stop_reasons") or {}).get("after")
                                                   or {}).items())
        rows.append([c["arm"], str(c["seed"]),
                     f"{c['success_before']:.1%} → {c['success_after']:.1%}", _gain(c),
                     f"{c['wall_s']:.0f} s",
                     f"{split.get('rollout_s', 0):.0f} / {split.get('teacher_wait_s', 0):.0f} / "
                     f"{split.get('update_s', 0):.0f}", valid, stops or "-"])
    return rows


TABLES = {"arms": arms_table, "cells": cells_table}


def markdown(rows: list[list[str]]) -> str:
    header, *body = rows
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", required=True, help="the record, relative to the repository")
    ap.add_argument("--table", required=True, choices=sorted(TABLES), help="which table")
    ap.add_argument("--commit", default=None,
                    help="the commit that holds the record: the table gets its annotation")
    args = ap.parse_args(argv)
    path = Path(args.record) if Path(args.record).is_absolute() else ROOT / args.record
    if not path.is_file():
        sys.exit(f"error: {args.record} does not exist; run python benchmarks/real_model_learning.py "
                 "first, or name a committed record")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not data.get("arms") or not data.get("cells"):
        sys.exit(f"error: {args.record} holds no arms and cells; name what "
                 "benchmarks/real_model_learning.py recorded")
    out = markdown(TABLES[args.table](data))
    if args.commit:
        out += (f"\n<!-- table: {args.record} @ {args.commit} by python "
                f"benchmarks/real_model_learning_report.py --record {args.record} "
                f"--table {args.table} -->\n")
    print(out, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
