"""The recovery benchmark's results tables as Markdown, printed from its analysis records.

    python benchmarks/recovery_table_report.py --record benchmarks/results/recovery_bench_256.json
    python benchmarks/recovery_table_report.py --record benchmarks/results/recovery_bench.json --commit <sha>
    python benchmarks/recovery_table_report.py --record benchmarks/results/recovery_bench_256.json --table seeds
    python benchmarks/recovery_table_report.py --record benchmarks/results/recovery_copies.json --table copies --then benchmarks/results/recovery_copies_256.json

Reads an analysis of ``benchmarks/recovery_bench.py`` (``benchmarks/results/recovery_bench*.json``)
and prints docs/recoverybench.md's table of it: per arm the recovery after an error, its
paired difference to the baseline in points (seed-paired, and task-paired when the record
holds it), retries, strict success on faulted tasks and its difference, success on
fault-free tasks (means over seeds with 95% bootstrap intervals), the wall clock of a
cell with its rollout / teacher-wait / update split, and what crossed the wire. With
``--commit`` (the commit holding the record) the table is followed by its table
annotation (tests/docs/figures.py): the docs test prints it again from the record at
that commit and compares it whole. ``--table seeds`` prints each arm's recovery after
training, seed by seed; ``--table copies`` the copies analysis of
``benchmarks/recovery_copies.py`` (``--record``: the first run's, ``--then``: the second
run's, each arm's figures side by side). This module computes nothing; it prints what
the records hold (``benchmarks/recovery_report.py`` draws its charts).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def share(entry: dict[str, Any] | None) -> str:
    """A fraction as a percentage with its interval: ``1.3% [0.1%, 2.9%]``."""
    if not entry:
        return "-"
    return f"{entry['mean']:.1%} [{entry['low']:.1%}, {entry['high']:.1%}]"


def points(entry: dict[str, Any] | None) -> str:
    """A paired difference of fractions in points with its interval: ``+1.3 [+0.1, +2.9]``."""
    if not entry:
        return "-"
    return (f"{100 * entry['mean']:+.1f} [{100 * entry['low']:+.1f}, "
            f"{100 * entry['high']:+.1f}]")


def table(data: dict[str, Any]) -> str:
    base = data["baseline"]
    paired = any(f"recovery_vs_{base}_task_paired" in e for e in data["arms"].values())
    header = ["arm", "recovery [95%]", f"Δ recovery vs `{base}`, points [95%]"]
    if paired:
        header.append("task-paired Δ")
    header += ["retry [95%]", "strict success (faulted) [95%]", f"Δ vs `{base}`, points [95%]",
               "success (fault-free) [95%]", "wall s per cell (rollout / teacher wait / update)",
               "positions scored, MB on the wire"]
    rows = []
    for arm, e in data["arms"].items():
        baseline = arm == base
        row = [f"`{arm}`", share(e.get("recovery")),
               "(baseline)" if baseline else points(e.get(f"recovery_vs_{base}"))]
        if paired:
            row.append("(baseline)" if baseline
                       else points(e.get(f"recovery_vs_{base}_task_paired")))
        split = e.get("mean_time_split") or {}
        wire = ("0 (no teacher)" if not e.get("mean_positions_scored")
                else f"{e['mean_positions_scored']:,.0f}, {e['mean_bytes'] / 1e6:.1f}")
        row += [share(e.get("retry")), share(e.get("faulted_success")),
                "(baseline)" if baseline else points(e.get(f"faulted_success_vs_{base}")),
                share(e.get("fault_free_success")),
                f"{e['mean_wall_s']:.0f} ({split.get('rollout_s', 0):.0f} / "
                f"{split.get('teacher_wait_s', 0):.1f} / {split.get('update_s', 0):.0f})",
                wire]
        rows.append(row)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def seeds_table(data: dict[str, Any]) -> str:
    """Each arm's recovery after training, one column per seed."""
    by_arm: dict[str, dict[int, float]] = {}
    for cell in data["cells"]:
        by_arm.setdefault(cell["arm"], {})[cell["seed"]] = cell["after"]["recovery"]
    seeds = sorted({seed for row in by_arm.values() for seed in row})
    lines = ["| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "| --- | " + " | ".join("---" for _ in seeds) + " |"]
    for arm, row in by_arm.items():
        lines.append(f"| `{arm}` | " + " | ".join(
            f"{row[s]:.1%}" if s in row else "-" for s in seeds) + " |")
    return "\n".join(lines) + "\n"


def copies_table(first: dict[str, Any], then: dict[str, Any] | None) -> str:
    """How close each arm's repeated calls come to the failed one, first run -> second."""
    lines = ["| arm | exact copies | characters right | leading characters right |",
             "| --- | --- | --- | --- |"]
    for arm, a in first["arms"].items():
        b = (then or {}).get("arms", {}).get(arm)
        cells = [(f"{a['exact']:.1%}", f"{b['exact']:.1%}" if b else None),
                 (f"{a['char_accuracy']:.1%}", f"{b['char_accuracy']:.1%}" if b else None),
                 (f"{a['prefix']:.2f} of {a['expression_chars']:.0f}",
                  f"{b['prefix']:.2f}" if b else None)]
        name = f"`{arm}`" if b or then is None else f"`{arm}` (first run only)"
        lines.append(f"| {name} | " + " | ".join(
            x if y is None else f"{x} → {y}" for x, y in cells) + " |")
    return "\n".join(lines) + "\n"


def _read(name: str, what: str) -> dict[str, Any]:
    path = Path(name) if Path(name).is_absolute() else ROOT / name
    if not path.is_file():
        sys.exit(f"error: {name} does not exist; run {what} --update-committed first, or "
                 "name a committed record")
    return json.loads(path.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", required=True, help="the analysis, relative to the repository")
    ap.add_argument("--commit", default=None,
                    help="the commit that holds the record: the table gets its annotation")
    ap.add_argument("--table", choices=["arms", "seeds", "copies"], default="arms",
                    help="arms: the results table (default); seeds: recovery per seed; "
                         "copies: the copies analysis (with --then, the second run's)")
    ap.add_argument("--then", default=None,
                    help="with --table copies: the second run's copies record")
    args = ap.parse_args(argv)
    if args.table == "copies":
        out = copies_table(_read(args.record, "python benchmarks/recovery_copies.py"),
                           _read(args.then, "python benchmarks/recovery_copies.py")
                           if args.then else None)
    else:
        data = _read(args.record, "python benchmarks/recovery_bench.py")
        if not data.get("arms"):
            sys.exit(f"error: {args.record} holds no arms; name a recovery benchmark's "
                     "analysis (benchmarks/results/recovery_bench*.json)")
        out = seeds_table(data) if args.table == "seeds" else table(data)
    if args.commit:
        extra = "" if args.table == "arms" else f" --table {args.table}"
        extra += f" --then {args.then}" if args.then else ""
        out += (f"\n<!-- table: {args.record} @ {args.commit} by python "
                f"benchmarks/recovery_table_report.py --record {args.record}{extra} -->\n")
    print(out, end="")
    return 0

if __name__ == "__main__":
    sys.exit(main())
