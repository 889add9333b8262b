"""Are tool calls bounded? Thousands of hostile calls against sqlite, calculator and jsonnav.

    python benchmarks/tool_bounds.py [--fuzz 3000] [--seed 0] [--no-write]

Runs every named bomb of ``tests/student/environments/hostile_calls.py`` (printf width
bombs, zeroblob/randomblob, replace expansion, recursive CTEs, cross joins, sorts of
huge keys, rows of hundreds of GLOB/LIKE/instr calls, ``9**9**9``, deep nesting, long
paths ...) and ``--fuzz`` seeded hostile calls spread evenly over the three
environments, each through ``Environment.step`` on a live episode. It prints, per
environment: calls, errors, calls that raised (must be 0), the slowest call and its
input, calls over 1 s (must be 0) and the largest result, and writes
``tool_bounds.json`` in ``--output-dir`` (default ``runs/benchmarks/tool_bounds/``; the
committed ``benchmarks/results/tool_bounds.json`` with ``--update-committed``). Exit status 1 if any call raised, took 1 s or
more, or returned more than the result cap.

Issue 18's probe: one sqlite call (``printf('%.*c', 2000000000, 'x')``) ran 43 s before
these bounds. Timings are wall clock on whatever machine runs this; the limits are
0.25 s per sqlite statement and microseconds for the calculator and jsonnav.
"""

from __future__ import annotations

import argparse
import json
import platform
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the shared hostile inputs live under tests/

from miniverl.student.benchmark.outputs import add_output_options, script_output_file  # noqa: E402
from tests.student.environments.hostile_calls import (  # noqa: E402
    ENVIRONMENTS,
    fuzz_calls,
    live_environments,
    named_bombs,
    run_call,
)

RESULTS = ROOT / "benchmarks" / "results" / "tool_bounds.json"
CALL_LIMIT_S = 1.0


def _record(stats: dict, env_name: str, label: str, arguments, seconds: float, out, raised: str | None):
    s = stats.setdefault(
        env_name,
        {"calls": 0, "bombs": 0, "errors": 0, "raised": 0, "over_1s": 0, "slowest_s": 0.0,
         "slowest_input": "", "largest_result_chars": 0, "total_s": 0.0},
    )  # fmt: skip
    s["calls"] += 1
    s["bombs"] += label != "fuzz"
    s["total_s"] += seconds
    if raised:
        s["raised"] += 1
        s.setdefault("raised_examples", []).append(f"{label}: {raised}"[:300])
        return
    s["errors"] += out.startswith("error:")
    s["over_1s"] += seconds >= CALL_LIMIT_S
    s["largest_result_chars"] = max(s["largest_result_chars"], len(out))
    if seconds > s["slowest_s"]:
        s["slowest_s"] = seconds
        s["slowest_input"] = f"{label}: {str(arguments)[:160]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fuzz", type=int, default=3000, help="seeded hostile calls (default 3000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print only; do not write the JSON")
    add_output_options(parser, RESULTS)
    args = parser.parse_args()
    output = None if args.no_write else script_output_file(args, RESULTS, ROOT)

    envs = live_environments()
    calls = [(label, name, tool, arguments) for label, name, tool, arguments in named_bombs()]
    calls += [("fuzz", name, tool, arguments) for name, tool, arguments in fuzz_calls(args.fuzz, args.seed)]
    stats: dict[str, dict] = {}
    started = time.perf_counter()
    for label, name, tool, arguments in calls:
        try:
            seconds, out = run_call(envs[name], tool, arguments)
            raised = None
        except Exception as exc:  # counted: step must never raise
            seconds, out, raised = 0.0, "", repr(exc)
        _record(stats, name, label, arguments, seconds, out, raised)
    wall = time.perf_counter() - started

    cap = max(env.max_result_chars for env in envs.values())
    header = f"{'environment':<12}{'calls':>7}{'bombs':>7}{'errors':>8}{'raised':>8}{'>1 s':>6}{'slowest':>10}{'largest':>9}  slowest input"
    print(header)
    print("-" * len(header))
    for name in ENVIRONMENTS:
        s = stats[name]
        print(
            f"{name:<12}{s['calls']:>7}{s['bombs']:>7}{s['errors']:>8}{s['raised']:>8}{s['over_1s']:>6}"
            f"{s['slowest_s'] * 1000:>8.1f}ms{s['largest_result_chars']:>9}  {s['slowest_input'][:70]}"
        )
    total = sum(s["calls"] for s in stats.values())
    bad = sum(s["raised"] + s["over_1s"] for s in stats.values())
    too_big = [n for n, s in stats.items() if s["largest_result_chars"] > cap]
    print(f"{total} calls in {wall:.1f} s; {bad} raised or over 1 s; result cap {cap} chars"
          f"{' EXCEEDED by ' + ', '.join(too_big) if too_big else ' held'}")

    record = {
        "benchmark": "tool_bounds",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "machine": platform.machine(),
        "fuzz_calls": args.fuzz,
        "seed": args.seed,
        "total_calls": total,
        "wall_s": round(wall, 2),
        "call_limit_s": CALL_LIMIT_S,
        "result_cap_chars": cap,
        "environments": {
            n: {k: round(v, 4) if isinstance(v, float) else v for k, v in s.items()} for n, s in stats.items()
        },
        "ok": bad == 0 and not too_big,
    }
    if output is not None:
        output.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {output}")
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
