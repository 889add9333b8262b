"""The demo's measured runs as docs/demo.md's table, printed from their record.

    python benchmarks/demo_report.py --record benchmarks/results/demo_learning.json
    python benchmarks/demo_report.py --record benchmarks/results/demo_learning.json --commit <sha>

Reads what ``benchmarks/demo_learning.py`` recorded (one entry per ``miniverl demo`` run:
cold, with the teacher prepared in the run; warm, with it cached; fast) and prints one
row per run: the wall clock of the whole command, held-out success before and after,
the teacher's success and preparation, the warm-up's steps and seconds and the strict
OPD phase's seconds. With ``--commit`` (the commit holding the record) the table is
followed by its table annotation (tests/docs/figures.py): the docs test prints it again
from the record at that commit and compares it whole. It computes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from table_report import markdown, report_main

ROOT = Path(__file__).resolve().parents[1]


def row(run: dict[str, Any]) -> list[str]:
    kind = "fast" if run.get("fast") else ("warm" if run.get("teacher_cached") else "cold")
    split = run.get("time_split") or {}
    n = run["eval_n"]
    teacher = (f"{run['teacher_success']:.0%} (cached)" if run.get("teacher_cached")
               else f"{run['teacher_success']:.0%}, prepared in {split['teacher_prep']:.1f} s")
    return [kind, "-" if run.get("fast") else str(run["seed"]), f"{run['wall_s']:.1f} s",
            f"{run['success_before']:.0%} -> {run['success_after']:.0%} "
            f"({round(run['success_after'] * n)}/{n})",
            teacher, str(run["warmup_steps"]), f"{split.get('warmup', 0.0):.1f} s",
            f"{split.get('opd', 0.0):.1f} s"]


def table(data: dict[str, Any]) -> str:
    updates = {r.get("opd_updates") for r in data["runs"] if not r.get("fast")}
    opd = f"strict OPD ({updates.pop()} updates)" if len(updates) == 1 else "strict OPD"
    header = ["run", "seed", "wall (whole command)", "success before -> after", "teacher",
              "warm-up steps", "student warm-up", opd]
    return markdown(header, [row(r) for r in data["runs"]])


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, doc=__doc__, script="benchmarks/demo_report.py",
                       producer="benchmarks/demo_learning.py", key="runs", table=table,
                       records=" (benchmarks/results/demo_learning*.json)")


if __name__ == "__main__":
    sys.exit(main())
