"""The toy learning runs as docs/toy-learning.md's tables, printed from their records.

    python benchmarks/toy_learning_report.py --record benchmarks/results/toy_learning.json
    python benchmarks/toy_learning_report.py --record benchmarks/results/toy_learning_more_seeds.json --commit <sha>

Reads what ``benchmarks/toy_learning.py`` recorded (one entry per ``miniverl up`` run of
the toy recipe) and prints one row per run: held-out success before and after, the wall
clock of the whole command, the teacher's preparation (or that it was cached), the
optimizer steps and the OPD phase's sampled success over its first and last five
updates. With ``--commit`` (the commit holding the record) the table is followed by its
table annotation (tests/docs/figures.py): the docs test prints it again from the record
at that commit and compares it whole. It computes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from table_report import markdown, report_main

ROOT = Path(__file__).resolve().parents[1]


def table(data: dict[str, Any]) -> str:
    runs = data["runs"]
    opd = {r.get("on_policy_steps") for r in runs}
    steps = (f"optimizer steps (warm-up + {opd.pop()})" if len(opd) == 1
             else "optimizer steps")
    header = ["seed", "success before -> after", "wall (whole `miniverl up`)", "teacher prep",
              steps, "OPD sampled success"]
    rows = []
    for r in runs:
        n = r["eval_n"]
        rows.append([str(r["seed"]),
                     f"{r['success_before']:.0%} -> {r['success_after']:.0%} "
                     f"({round(r['success_after'] * n)}/{n})",
                     f"{r['wall_s']:.1f} s",
                     "cached" if r.get("teacher_prep_wall_s") is None
                     else f"{r['teacher_prep_wall_s']:.1f} s",
                     str(r["optimizer_steps"]),
                     f"{r['opd_sampled_success_first5']:.2f} -> "
                     f"{r['opd_sampled_success_last5']:.2f}"])
    return markdown(header, rows)


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, doc=__doc__, script="benchmarks/toy_learning_report.py",
                       producer="benchmarks/toy_learning.py", key="runs", table=table,
                       records=" (benchmarks/results/toy_learning*.json)")


if __name__ == "__main__":
    sys.exit(main())
