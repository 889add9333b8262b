"""A ``miniverl benchmark`` results table as Markdown, printed from its committed results.

    python benchmarks/benchmark_report.py --record benchmarks/results/toy/results.json
    python benchmarks/benchmark_report.py --record benchmarks/results/toy/results.json --commit <sha>

Reads a benchmark's ``results.json`` (what ``miniverl benchmark`` writes) and prints its
per-arm table exactly as the benchmark's own ``summary.md`` holds it
(``student/benchmark/stats.py``): cells ok and failed, the mean of the metric with its
interval, the paired difference to the baseline with its interval, mean wall seconds
and updates per cell. With ``--commit`` (the commit holding the results) the table is
followed by its table annotation (tests/docs/figures.py): the docs test prints it again
from the results at that commit and compares it whole. It computes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    from miniverl.student.benchmark.results import load_results
    from miniverl.student.benchmark.stats import summary_markdown

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", required=True, help="the results.json, relative to the repository")
    ap.add_argument("--commit", default=None,
                    help="the commit that holds the results: the table gets its annotation")
    args = ap.parse_args(argv)
    path = Path(args.record) if Path(args.record).is_absolute() else ROOT / args.record
    if not path.is_file():
        sys.exit(f"error: {args.record} does not exist; run miniverl benchmark first, or name "
                 "a committed results.json")
    try:
        results = load_results(path)
    except Exception as exc:  # a file that is not a benchmark's results: one line
        sys.exit(f"error: {args.record} is not a benchmark's results.json ({type(exc).__name__}); "
                 "name what miniverl benchmark wrote")
    table = [line for line in summary_markdown(results).splitlines() if line.startswith("|")]
    out = "\n".join(table) + "\n"
    if args.commit:
        out += (f"\n<!-- table: {args.record} @ {args.commit} by python benchmarks/benchmark_report.py "
                f"--record {args.record} -->\n")
    print(out, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
