"""The distillation benchmark's tables as Markdown, every figure annotated with its record.

    python benchmarks/distill_report.py --commit <sha>   # the commit holding the record

Reads ``benchmarks/results/distill_bench.json`` (what ``benchmarks/distill_bench.py
--update-committed`` writes) and prints the tables of docs/distillbench.md's results:
the start points, the learning-rate grid, both budgets (equal updates, equal training
seconds) with both evaluations (T=1, greedy), and each arm's cost. Every number is
followed by a figure annotation naming its path in the record at ``--commit``
(tests/docs/figures.py checks them), so the page's tables are the record's numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORD = "benchmarks/results/distill_bench.json"


class Table:
    """Rows of printed cells and the annotations of the numbers they print."""

    def __init__(self, record: str, commit: str, header: list[str]):
        self.record, self.commit, self.header = record, commit, header
        self.rows: list[list[str]] = []
        self.notes: list[str] = []

    def fig(self, value: float | None, pointer: str, fmt: str = "{:.3f}") -> str:
        if value is None:
            return "-"
        shown = fmt.format(value)
        self.notes.append(f"<!-- figure: {shown} = {self.record}#{pointer} @ {self.commit} -->")
        return shown

    def interval(self, entry: dict[str, Any] | None, pointer: str, signed: bool = False) -> str:
        if not entry:
            return "-"
        fmt = "{:+.3f}" if signed else "{:.3f}"
        return (f"{self.fig(entry['mean'], pointer + '.mean', fmt)} "
                f"[{self.fig(entry['low'], pointer + '.low', fmt)}, "
                f"{self.fig(entry['high'], pointer + '.high', fmt)}]")

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |",
                 "| " + " | ".join("---" for _ in self.header) + " |"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines + [""] + self.notes) + "\n"


def start_table(data: dict[str, Any], record: str, commit: str) -> Table:
    t = Table(record, commit, ["model", "split", "greedy", "T=1 (2 per task)", "tasks"])
    start = data["start"]
    for who in ("warm_student", "teacher"):
        row = start.get(who)
        if row:
            t.rows.append([who.replace("_", " ") + " (its preparation's eval)", row["split"],
                           t.fig(row["greedy"], f"start.{who}.greedy"),
                           t.fig(row["t1"], f"start.{who}.t1"), str(row["n"])])
    for key, row in (data.get("start_evals") or {}).items():
        name, split = key.split(":")
        if split == data["distill"]["main_split"]:
            t.rows.append([("warm student" if name == "warm" else name) + " (measured once)",
                           split, t.fig(row["greedy"], f"start_evals.{key}.greedy"),
                           t.fig(row["t1"], f"start_evals.{key}.t1"), str(row["n"])])
    return t


def grid_table(data: dict[str, Any], record: str, commit: str) -> Table:
    grid = data["distill"]["lr_grid"]
    t = Table(record, commit, ["arm", *(f"lr {lr:g}: T=1 / greedy" for lr in grid), "chosen"])
    for arm, row in (data["grid"].get("choice") or {}).items():
        cells = []
        for i, r in enumerate(row["grid"]):
            cells.append(f"{t.fig(r['t1'], f'grid.choice.{arm}.grid.{i}.t1')} / "
                         f"{t.fig(r['greedy'], f'grid.choice.{arm}.grid.{i}.greedy')}")
        t.rows.append([arm, *cells, t.fig(row["chosen_lr"], f"grid.choice.{arm}.chosen_lr",
                                          "{:g}")])
    return t


def budget_table(data: dict[str, Any], record: str, commit: str, label: str) -> Table:
    """One reading (an update count or a wall-clock point): both evaluations per arm."""
    main, base = data["main"], data["baseline"]
    t = Table(record, commit, ["arm", "cells ok", "T=1 mean [95%]", f"T=1 Δ vs {base} [95%]",
                               "greedy mean [95%]", f"greedy Δ vs {base} [95%]",
                               "updates reached (seeds in order)"])
    for arm, entry in main["arms"].items():
        block = entry[label]
        reached = ", ".join("-" if v is None else str(v)
                            for v in block["updates_reached"].values())
        row = [arm, f"{entry['ok']}/{entry['cells']}"]
        for kind in ("t1", "greedy"):
            row += [t.interval(block[kind], f"main.arms.{arm}.{label}.{kind}"),
                    t.interval(block.get(f"{kind}_vs_{base}"),
                               f"main.arms.{arm}.{label}.{kind}_vs_{base}", signed=True)]
        t.rows.append([*row, reached])
    return t


def cost_table(data: dict[str, Any], record: str, commit: str) -> Table:
    main = data["main"]
    t = Table(record, commit, ["arm", "training s (mean)", "of which preparation s",
                               "cell wall s (with evaluation)", "unseen states after [95%]"])
    for arm, entry in main["arms"].items():
        t.rows.append([arm, t.fig(entry["mean_training_s"], f"main.arms.{arm}.mean_training_s",
                                  "{:.1f} s"),
                       t.fig(entry["mean_preparation_s"], f"main.arms.{arm}.mean_preparation_s",
                             "{:.1f} s"),
                       t.fig(entry["mean_wall_s"], f"main.arms.{arm}.mean_wall_s", "{:.1f} s"),
                       t.interval(entry.get("unseen_states_final"),
                                  f"main.arms.{arm}.unseen_states_final")])
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", required=True, help="the commit that holds the record")
    ap.add_argument("--record", default=RECORD, help="the record, relative to the repository")
    args = ap.parse_args(argv)
    path = ROOT / args.record
    if not path.is_file():
        sys.exit(f"error: {args.record} does not exist; run python benchmarks/distill_bench.py "
                 "--update-committed first")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not data.get("main"):
        sys.exit(f"error: {args.record} holds no main phase; run the benchmark to the end first")
    out = ["### Start points\n", start_table(data, args.record, args.commit).markdown()]
    if data.get("grid"):
        out += ["### Learning-rate grid (validation split, T=1 / greedy after the budget)\n",
                grid_table(data, args.record, args.commit).markdown()]
    for label in [f"updates={u}" for u in data["main"]["updates"] if u > 0] + \
                 [f"seconds={s:g}" for s in data["main"]["seconds"]]:
        what = (f"after {label.split('=')[1]} updates" if label.startswith("updates")
                else f"within {label.split('=')[1]} training seconds")
        out += [f"### Test split, {what}\n",
                budget_table(data, args.record, args.commit, label).markdown()]
    out += ["### Cost per cell\n", cost_table(data, args.record, args.commit).markdown()]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
