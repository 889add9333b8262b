"""The distillation benchmark's tables as Markdown, each one annotated with its record.

    python benchmarks/distill_report.py --record benchmarks/results/distill_bench_v2.json --commit <sha>
    python benchmarks/distill_report.py --record benchmarks/results/distill_bench_v2.json --table updates=32

Reads a distillation benchmark's analysis (``benchmarks/results/distill_bench*.json``, what
``benchmarks/distill_bench.py --update-committed`` writes) and prints the tables of
docs/distillbench.md's results: the start points, the learning-rate grid, each reading
of both budgets (equal updates, equal training seconds) with both evaluations (T=1,
greedy) and each arm's paired difference to the baseline and to every arm of the
analysis's ``also_against``, and each arm's cost. ``--table NAME`` prints one table
(``start``, ``grid``, ``updates=N``, ``seconds=S``, ``gap``, ``signal``, ``cost``); ``gap``
(records with a plateau and a teacher above it, version 3) is each arm's share of the
plateau-to-teacher gap closed and its training seconds to the reach arm's final score. With ``--commit`` (the
commit that holds the record) each table is followed by one table annotation naming the
record, the commit and the command that prints it (tests/docs/figures.py): the docs test
prints the table again from the record at that commit and compares it whole.
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
    """A header and rows of printed cells."""

    def __init__(self, header: list[str]):
        self.header = header
        self.rows: list[list[str]] = []

    @staticmethod
    def fig(value: float | None, fmt: str = "{:.3f}") -> str:
        return "-" if value is None else fmt.format(value)

    @staticmethod
    def interval(entry: dict[str, Any] | None, signed: bool = False) -> str:
        if not entry:
            return "-"
        fmt = "{:+.3f}" if signed else "{:.3f}"
        shown = f"{fmt.format(entry['mean'])} [{fmt.format(entry['low'])}, {fmt.format(entry['high'])}]"
        if "above" in entry and "per_seed" in entry:
            shown += f", {entry['above']} of {len(entry['per_seed'])} above"
        return shown

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |",
                 "| " + " | ".join("---" for _ in self.header) + " |"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"


def start_table(data: dict[str, Any]) -> Table:
    t = Table(["model", "split", "greedy", "T=1 (2 per task)", "unseen states (T=1)", "tasks"])
    start = data["start"]
    for who in ("warm_student", "teacher"):
        row = start.get(who)
        if row:
            t.rows.append([who.replace("_", " ") + " (its preparation's eval)", row["split"],
                           t.fig(row["greedy"]), t.fig(row["t1"]), "-", str(row["n"])])
    for key, row in (data.get("start_evals") or {}).items():
        name, split = key.split(":")
        if split == data["distill"]["main_split"]:
            t.rows.append([("warm student" if name == "warm" else name) + " (measured once)",
                           split, t.fig(row["greedy"]), t.fig(row["t1"]),
                           t.fig(row.get("unseen_states")), str(row["n"])])
    return t


def grid_table(data: dict[str, Any]) -> Table:
    """Each arm's T=1 / greedy success at each rate it tried and its choice: the
    config's grid, then the rates an extension added (version 5: ``-`` where an arm did
    not run that rate, and whether its choice is still at an edge of its grid)."""
    choice = data["grid"].get("choice") or {}
    grid = list(data["distill"]["lr_grid"])
    extra = {r["lr"] for row in choice.values() for r in row["grid"]} - set(grid)
    grid = sorted({*grid, *extra}) if extra else grid
    extended = any("at_edge" in row for row in choice.values())
    t = Table(["arm", *(f"lr {lr:g}: T=1 / greedy" for lr in grid), "chosen",
               *(["choice at an edge"] if extended else [])])
    for arm, row in choice.items():
        tried = {r["lr"]: r for r in row["grid"]}
        cells = [f"{t.fig(tried[lr]['t1'])} / {t.fig(tried[lr]['greedy'])}" if lr in tried
                 else "-" for lr in grid]
        t.rows.append([arm, *cells, t.fig(row["chosen_lr"], "{:g}"),
                       *([row.get("at_edge") or "no"] if extended else [])])
    return t


def budget_table(data: dict[str, Any], label: str) -> Table:
    """One reading (an update count or a wall-clock point): both evaluations per arm, each
    paired with the baseline and with every arm of ``also_against``."""
    main, base = data["main"], data["baseline"]
    others = [base, *main.get("also_against", [])]
    header = ["arm", "cells ok"]
    for name in ("T=1", "greedy"):
        header += [f"{name} mean [95%]", *(f"{name} Δ vs {o} [95%]" for o in others)]
    t = Table([*header, "updates reached (seeds in order)"])
    for arm, entry in main["arms"].items():
        block = entry[label]
        reached = ", ".join("-" if v is None else str(v)
                            for v in block["updates_reached"].values())
        row = [arm, f"{entry['ok']}/{entry['cells']}"]
        for kind in ("t1", "greedy"):
            row += [t.interval(block[kind]),
                    *(t.interval(block.get(f"{kind}_vs_{o}"), signed=True) for o in others)]
        t.rows.append([*row, reached])
    return t


def cost_table(data: dict[str, Any]) -> Table:
    """Training seconds and where they went (when the record keeps the split), and the
    state coverage after the budget in the reading the record holds."""
    main = data["main"]
    t1 = data.get("coverage_reading") == "t1"  # older records hold greedy coverage only
    split = any(e.get("mean_time_split") for e in main["arms"].values())
    header = ["arm", "training s (mean)", "of which preparation s"]
    if split:
        header += ["rollout s", "teacher wait s", "update s"]
    header += ["cell wall s (with evaluation)",
               "unseen states after, T=1 [95%]" if t1 else "unseen states after, greedy [95%]"]
    if t1:
        header.append("unseen states after, greedy [95%]")
    t = Table(header)
    for arm, entry in main["arms"].items():
        row = [arm, t.fig(entry["mean_training_s"], "{:.1f} s"),
               t.fig(entry["mean_preparation_s"], "{:.1f} s")]
        if split:
            times = entry.get("mean_time_split") or {}
            row += [t.fig(times.get(k), "{:.1f} s") for k in ("rollout_s", "teacher_wait_s",
                                                               "update_s")]
        row += [t.fig(entry["mean_wall_s"], "{:.1f} s"),
                t.interval(entry.get("unseen_states_final"))]
        if t1:
            row.append(t.interval(entry.get("unseen_states_greedy_final")))
        t.rows.append(row)
    return t


def gap_table(data: dict[str, Any], labels: list[str]) -> Table:
    """Per arm: the share of the plateau-to-teacher gap its T=1 mean closes at each
    reading, and the training seconds it needs to reach the reach arm's final T=1
    success of the same seed (the seeds that reached it, their mean)."""
    main = data["main"]
    reach = (data.get("distill") or {}).get("reach_arm")
    key = f"seconds_to_{reach}_final" if reach else None
    header = ["arm", *(f"gap closed, T=1, {_said(label)}" for label in labels)]
    if key:
        header.append(f"training s to {reach}'s final T=1 (seeds that reached it)")
    half = any("half_gap_s" in e for e in main["arms"].values())  # version 5
    if half:
        header.append("training s to close half the gap (seeds that did)")
    t = Table(header)
    for arm, entry in main["arms"].items():
        row = [arm, *(t.fig((entry.get(label) or {}).get("t1_gap_closed"), "{:+.2f}")
                      for label in labels)]
        if half:
            hit = entry.get("half_gap_s") or {}
            row.append("-" if not hit else
                       f"{t.fig(hit.get('mean_s'), '{:.1f} s')} ({hit['reached']} of {hit['of']})")
        if key:
            hit = entry.get(key) or {}
            row.append("-" if not hit else
                       f"{t.fig(hit.get('mean_s'), '{:.1f} s')} ({hit['reached']} of {hit['of']})")
        t.rows.append(row)
    return t


def signal_table(data: dict[str, Any]) -> Table:
    """Per arm, what its updates had to learn from (the cells' means): the share of
    updates whose own training episodes all succeeded, the training success, the median
    absolute loss and gradient norm."""
    arms = data["main"]["arms"]
    clip = any("clip_binding_share" in (e.get("mean_signal") or {}) for e in arms.values())
    t = Table(["arm", "updates with every training episode right", "training success",
               "median |loss|", "median gradient norm",
               *(["updates the clip bound"] if clip else [])])
    for arm, entry in arms.items():
        sig = entry.get("mean_signal") or {}
        t.rows.append([arm, t.fig(sig.get("all_right_share"), "{:.0%}"),
                       t.fig(sig.get("train_success")), t.fig(sig.get("abs_loss_median"), "{:.1e}"),
                       t.fig(sig.get("grad_norm_median"), "{:.1e}"),
                       *([t.fig(sig.get("clip_binding_share"), "{:.0%}")] if clip else [])])
    return t


def _said(label: str) -> str:
    kind, value = label.split("=")
    return f"{value} updates" if kind == "updates" else f"{value} s"


def tables(data: dict[str, Any]) -> list[tuple[str, str, Table]]:
    """``(name, heading, table)`` for every table the record holds, in page order."""
    out = [("start", "Start points", start_table(data))]
    if data.get("grid"):
        out.append(("grid", "Learning-rate grid (validation split, T=1 / greedy after the "
                            "budget)", grid_table(data)))
    labels = ([f"updates={u}" for u in data["main"]["updates"] if u > 0]
              + [f"seconds={s:g}" for s in data["main"]["seconds"]])
    for label in labels:
        what = (f"after {label.split('=')[1]} updates" if label.startswith("updates")
                else f"within {label.split('=')[1]} training seconds")
        out.append((label, f"Test split, {what}", budget_table(data, label)))
    if data["main"].get("gap"):  # version 3: a plateau and a teacher above it
        gap = data["main"]["gap"]
        out.append(("gap", f"Share of the gap closed (test split: plateau T=1 "
                           f"{Table.fig(gap['start'].get('t1'))}, teacher "
                           f"{Table.fig(gap['teacher'].get('t1'))})", gap_table(data, labels)))
    if any(e.get("mean_signal") for e in data["main"]["arms"].values()):
        out.append(("signal", "What the updates had to learn from (means over cells)",
                    signal_table(data)))
    out.append(("cost", "Cost per cell", cost_table(data)))
    return out


def annotation(record: str, commit: str, name: str) -> str:
    """The table annotation: the record, the commit holding it, the command printing it."""
    return (f"<!-- table: {record} @ {commit} by python benchmarks/distill_report.py "
            f"--record {record} --table {name} -->")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", default=RECORD, help="the record, relative to the repository")
    ap.add_argument("--commit", default=None,
                    help="the commit that holds the record: each table gets its annotation")
    ap.add_argument("--table", default=None,
                    help="print this table only (start, grid, updates=N, seconds=S, gap, signal, cost)")
    args = ap.parse_args(argv)
    path = Path(args.record) if Path(args.record).is_absolute() else ROOT / args.record
    if not path.is_file():
        sys.exit(f"error: {args.record} does not exist; run python benchmarks/distill_bench.py "
                 "--update-committed first")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not data.get("main"):
        sys.exit(f"error: {args.record} holds no main phase; run the benchmark to the end first")
    made = tables(data)
    if args.table is not None and args.table not in [name for name, _, _ in made]:
        sys.exit(f"error: --table {args.table} is not a table of {args.record}; name one of "
                 f"{', '.join(name for name, _, _ in made)}")
    out = []
    for name, heading, table in made:
        if args.table is not None and name != args.table:
            continue
        text = table.markdown()
        if args.commit:
            text += "\n" + annotation(args.record, args.commit, name) + "\n"
        out.append(text if args.table else f"#### {heading}\n\n{text}")
    print("\n".join(out), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
