"""The cross-tokenizer benchmark's results table as Markdown, printed from its analysis.

    python benchmarks/xvocab_report.py --record benchmarks/results/xvocab_v4_bench.json
    python benchmarks/xvocab_report.py --record benchmarks/results/xvocab_v3_bench.json --commit <sha>

Reads an analysis of ``benchmarks/xvocab_bench.py`` (``benchmarks/results/xvocab*_bench.json``)
and prints docs/cross-tokenizer.md's table of it: per arm T=1 success before → after
(mean over seeds) and each seed's after, greedy before → after, the paired difference to
the baseline with its interval, the share of episodes the cross-tokenizer path aligned
and of trainable positions it trained, and the training seconds per cell. With
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


def table(data: dict[str, Any]) -> str:
    base = data.get("baseline") or "sft"
    header = ["arm", "T=1 before → after", "per seed after", "greedy before → after",
              f"T=1 Δ vs {base} [95%]", "episodes aligned", "trainable positions trained",
              "training s per cell"]
    rows = []
    for arm, e in data["arms"].items():
        seeds = ", ".join(f"{c['curve'][-1]['t1']:.3f}" for c in data["cells"]
                          if c["arm"] == arm and c.get("curve"))
        bench = e.get("benchmark") or {}
        diff = ("-" if bench.get("diff_vs_baseline") is None else
                f"{bench['diff_vs_baseline']:+.3f} [{bench['diff_low']:+.3f}, "
                f"{bench['diff_high']:+.3f}]")
        xv = e.get("xvocab") or {}
        rows.append([f"`{arm}`", f"{e['t1_before']:.3f} → {e['t1_after']:.3f}", seeds or "-",
                     f"{e['greedy_before']:.3f} → {e['greedy_after']:.3f}", diff,
                     "-" if not xv else f"{xv['episodes_aligned_share']:.1%}",
                     "-" if not xv else f"{xv['trained_share']:.1%}",
                     f"{e['training_s']:.1f}"])
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", required=True, help="the analysis, relative to the repository")
    ap.add_argument("--commit", default=None,
                    help="the commit that holds the record: the table gets its annotation")
    args = ap.parse_args(argv)
    path = Path(args.record) if Path(args.record).is_absolute() else ROOT / args.record
    if not path.is_file():
        sys.exit(f"error: {args.record} does not exist; run python benchmarks/xvocab_bench.py "
                 "first, or name a committed analysis")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not data.get("arms") or not data.get("cells"):
        sys.exit(f"error: {args.record} holds no arms and cells; name an analysis of "
                 "benchmarks/xvocab_bench.py (benchmarks/results/xvocab*_bench.json)")
    out = table(data)
    if args.commit:
        out += (f"\n<!-- table: {args.record} @ {args.commit} by python benchmarks/xvocab_report.py "
                f"--record {args.record} -->\n")
    print(out, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
