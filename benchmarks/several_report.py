"""Print the several-teachers benchmark's tables from its committed record.

    python benchmarks/several_report.py --record benchmarks/results/several_bench.json --table main

Tables (Markdown, as docs/several-teachers-bench.md prints them):

- ``teachers``: the student's start and every teacher (the base, each adapter merged
  into it) on the report's split: each domain's T=1 and greedy success and tool calls
  per episode at T=1;
- ``main``: every arm after the budget: the mixture's and each domain's T=1 success
  (mean over seeds, 95% bootstrap interval), tool calls per episode at T=1 in each
  domain, and the paired difference of the mixture's T=1 to the baseline and to each
  arm of ``also_against`` (mean, interval, seeds above);
- ``domains``: the same paired differences, domain by domain;
- ``grid``: every arm's T=1 and greedy success at each rate, and its choice;
- ``cost``: each arm's mean training seconds and their split, and each route's
  counters summed over its cells (episodes, positions scored, stale replies dropped,
  episodes held back, seconds waited).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TABLES = ("teachers", "main", "domains", "grid", "cost")


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ci(block: dict[str, Any] | None, digits: int = 3, sign: bool = False) -> str:
    if not block:
        return "–"
    fmt = f"{{:+.{digits}f}}" if sign else f"{{:.{digits}f}}"
    return (f"{fmt.format(block['mean'])} [{fmt.format(block['low'])}, "
            f"{fmt.format(block['high'])}]")


def _vs(block: dict[str, Any] | None) -> str:
    if not block:
        return "–"
    return f"{_ci(block, sign=True)}, {block['above']}/{block['seeds']} above"


def domains_of(summary: dict[str, Any]) -> list[str]:
    evals = (summary.get("start") or {}).get("evals") or {}
    for row in evals.values():
        return sorted(row.get("domains") or {})
    return []


def teachers(summary: dict[str, Any]) -> list[str]:
    split = summary["main"]["split"] if summary.get("main") else "test"
    evals = summary["start"]["evals"]
    domains = domains_of(summary)
    head = ["model", *(f"{d} T=1 / greedy / calls" for d in domains), "mixture T=1"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key in sorted(k for k in evals if k.endswith(f":{split}")):
        row = evals[key]
        cells = [f"{_f(row['domains'][d]['t1'])} / {_f(row['domains'][d]['greedy'])} / "
                 f"{_f(row['domains'][d]['tool_calls_t1'], 2)}" for d in domains]
        lines.append(f"| {key.rsplit(':', 1)[0]} | " + " | ".join(cells)
                     + f" | {_f(row['t1'])} |")
    return lines


def main_table(summary: dict[str, Any]) -> list[str]:
    main = summary["main"]
    domains = domains_of(summary)
    others = [summary["baseline"], *summary.get("also_against", [])]
    head = ["arm", "T=1 [95%]", *(f"{d} T=1 [95%]" for d in domains),
            *(f"{d} calls" for d in domains), *(f"T=1 vs {o}" for o in others)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for arm, block in main["arms"].items():
        cells = [_ci(block.get("t1")), *(_ci(block.get(f"{d}/t1")) for d in domains),
                 *(_f((block.get(f"{d}/tool_calls_t1") or {}).get("mean"), 2) for d in domains),
                 *(_vs(block.get(f"t1_vs_{o}")) for o in others)]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def domains_table(summary: dict[str, Any]) -> list[str]:
    main = summary["main"]
    others = [summary["baseline"], *summary.get("also_against", [])]
    head = ["arm", "domain", *(f"T=1 vs {o}" for o in others),
            *(f"calls vs {o}" for o in others)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for arm, block in main["arms"].items():
        for d in domains_of(summary):
            cells = [*(_vs(block.get(f"{d}/t1_vs_{o}")) for o in others),
                     *(_ci(block.get(f"{d}/tool_calls_t1_vs_{o}"), 2, sign=True)
                       for o in others)]
            lines.append(f"| {arm} | {d} | " + " | ".join(cells) + " |")
    return lines


def grid(summary: dict[str, Any]) -> list[str]:
    lines = ["| arm | lr | T=1 | greedy | chosen |", "| --- | --- | --- | --- | --- |"]
    for arm, block in summary["grid"]["grid"].items():
        for row in block["grid"]:
            lines.append(f"| {arm} | {row['lr']:g} | {_f(row['t1'])} | {_f(row['greedy'])} | "
                         f"{'yes' if row['lr'] == block['chosen_lr'] else ''} |")
    return lines


def cost(summary: dict[str, Any]) -> list[str]:
    lines = ["| arm | training s | rollout / teacher wait / update / preparation s | route | "
             "episodes | positions scored | stale dropped | held back | wait s |",
             "|" + " --- |" * 9]
    for arm, block in summary["main"]["arms"].items():
        split = block.get("mean_time_split") or {}
        parts = " / ".join(_f(split.get(k), 1) for k in
                           ("rollout_s", "teacher_wait_s", "update_s", "preparation_s"))
        routes = block.get("routes") or {"–": {}}
        for name, c in routes.items():
            lines.append(f"| {arm} | {_f(block.get('mean_training_s'), 1)} | {parts} | {name} | "
                         f"{c.get('episodes', '–')} | {c.get('positions_scored', '–')} | "
                         f"{c.get('stale_dropped', '–')} | {c.get('held_back', '–')} | "
                         f"{_f(c.get('wait_s'), 1) if c else '–'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path, required=True, help="the benchmark's analysis JSON")
    ap.add_argument("--table", choices=TABLES, required=True)
    args = ap.parse_args(argv)
    try:
        summary = json.loads(args.record.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"error: {args.record} cannot be read as the benchmark's JSON "
                         f"({type(exc).__name__}); pass several_bench.py's analysis") from None
    needs = {"teachers": "start", "grid": "grid"}.get(args.table, "main")
    if not summary.get(needs) or (needs == "grid" and "grid" not in summary["grid"]):
        raise SystemExit(f"error: {args.record} has no {needs} phase to print the "
                         f"{args.table} table from; run benchmarks/several_bench.py first")
    table = {"teachers": teachers, "main": main_table, "domains": domains_table,
             "grid": grid, "cost": cost}[args.table]
    print("\n".join(table(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
