"""Demo benchmark: does ``miniverl demo`` teach the student, and how long does it take?

It runs the README's first command as a user does, ``miniverl demo --seed N --output
DIR``, one process after another, and times the whole command (interpreter start,
imports, toy models, teacher preparation and qualification, both evals, warm-up,
distillation, report, shutdown):

1. seeds 1-10 (``--seeds``), each from an empty ``MINIVERL_CACHE``: every run builds
   the toy models and prepares the teacher;
2. seeds 1-3 (``--warm-seeds``) with the teacher cached (the cache the first cold run
   filled);
3. ``miniverl demo --fast`` from an empty cache (``--fast-runs`` times).

For each run it reads the run directory back (:func:`miniverl.cli.demo.run_summary`:
success before and after, the teacher's held-out success, warm-up steps, where the
student's time went) and writes everything to ``demo_learning.json`` in ``--output-dir`` (default ``runs/benchmarks/demo_learning/``; the committed ``benchmarks/results/demo_learning.json`` with ``--update-committed``).

Targets (issue 15): held-out greedy success >= 0.9 on every seed; median wall <= 75 s
from an empty cache and <= 50 s with the teacher cached; ``--fast`` <= 25 s from an
empty cache. Run it with nothing else on the machine:

    python benchmarks/demo_learning.py [--seeds 1 ... 10] [--warm-seeds 1 2 3] [--fast-runs 3]

This script trains nothing itself; it only starts ``miniverl demo`` and reads the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from miniverl.student.benchmark.outputs import add_output_options, script_output_file

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"success_after": 0.9, "cold_median_s": 75.0, "warm_median_s": 50.0, "fast_s": 25.0}


def run_demo(work: Path, cache: Path, *, seed: int | None, fast: bool) -> dict[str, Any]:
    """One ``miniverl demo`` command, timed; its summary read back from the run folder."""
    from miniverl.cli.demo import run_summary

    out = work / "out"
    cmd = [sys.executable, "-m", "miniverl.cli.app", "demo", "--output", str(out)]
    cmd += ["--seed", str(seed)] if seed is not None else []
    cmd += ["--fast"] if fast else []
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, "MINIVERL_CACHE": str(cache)},
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {"seed": seed, "fast": fast, "exit_code": proc.returncode,
                           "wall_s": round(wall, 2), "loadavg_1m_before": round(load_before, 2),
                           "loadavg_1m_after": round(os.getloadavg()[0], 2)}
    runs = sorted((out / "runs").iterdir()) if (out / "runs").is_dir() else []
    if proc.returncode != 0 or not runs:
        row["error"] = (proc.stderr or proc.stdout)[-2000:]
        return row
    s = run_summary(runs[-1])
    row.update(
        status=s["status"],
        success_before=(s["success_before"] or {}).get("success"),
        success_after=(s["success_after"] or {}).get("success"),
        eval_n=(s["success_after"] or {}).get("n"),
        teacher_success=s["teacher_success"],
        teacher_cached=s["teacher_cached"],
        warmup_steps=s["warmup_steps"],
        opd_updates=s["opd_updates"],
        stale_dropped=s["stale_dropped"],
        time_split={k: (round(v, 2) if isinstance(v, float) else v)
                    for k, v in s["time"].items()},
    )
    return row


def median_max(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    walls = [r["wall_s"] for r in rows if r.get("exit_code") == 0]
    if not walls:
        return {"median_s": None, "max_s": None, "n": 0}
    return {"median_s": round(statistics.median(walls), 2), "max_s": max(walls), "n": len(walls)}


def verdict(cold: list, warm: list, fast: list) -> dict[str, Any]:
    learned = [r for r in cold + warm if (r.get("success_after") or 0) >= TARGETS["success_after"]]
    c, w, f = median_max(cold), median_max(warm), median_max(fast)
    return {
        "cold": c, "warm": w, "fast": f,
        "every_seed_learned": len(learned) == len(cold + warm) and bool(cold),
        "cold_met": c["median_s"] is not None and c["median_s"] <= TARGETS["cold_median_s"],
        "warm_met": w["median_s"] is not None and w["median_s"] <= TARGETS["warm_median_s"],
        "fast_met": f["max_s"] is not None and f["max_s"] <= TARGETS["fast_s"],
    }


def show(rows: list[dict[str, Any]], result: dict[str, Any], console: Console) -> None:
    table = Table(title="miniverl demo")
    for col in ("run", "seed", "wall", "success", "teacher", "warm-up", "note"):
        table.add_column(col)
    for r in rows:
        kind = "fast" if r["fast"] else ("cold" if not r.get("teacher_cached") else "warm")
        if r.get("exit_code") != 0:
            table.add_row(kind, str(r["seed"]), f"{r['wall_s']:.1f} s", "-", "-", "-",
                          f"exit {r['exit_code']}")
            continue
        table.add_row(kind, str(r["seed"]), f"{r['wall_s']:.1f} s",
                      f"{r['success_before']:.0%} -> {r['success_after']:.0%}",
                      f"{r['teacher_success']:.0%}", str(r["warmup_steps"]), "")
    console.print(table)
    v = result["verdict"]
    for name in ("cold", "warm", "fast"):
        console.print(f"{name:<5} median {v[name]['median_s']} s, max {v[name]['max_s']} s "
                      f"over {v[name]['n']} runs")
    console.print(f"every seed >= 90%: {v['every_seed_learned']}; cold median <= 75 s: "
                  f"{v['cold_met']}; warm median <= 50 s: {v['warm_met']}; fast <= 25 s: "
                  f"{v['fast_met']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=list(range(1, 11)))
    ap.add_argument("--warm-seeds", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--fast-runs", type=int, default=3)
    add_output_options(ap, ROOT / "benchmarks/results/demo_learning.json")
    args = ap.parse_args()
    args.out = script_output_file(args, ROOT / "benchmarks/results/demo_learning.json", ROOT)
    console = Console()
    rows: list[dict[str, Any]] = []
    base = Path(tempfile.mkdtemp(prefix="mvdb"))  # short: the ipc socket path is limited
    warm_cache = None
    try:
        for seed in args.seeds:
            work = base / f"cold{seed}"
            rows.append(run_demo(work, work / "cache", seed=seed, fast=False))
            warm_cache = warm_cache or (work / "cache")
            console.print(f"cold seed {seed}: {rows[-1]['wall_s']:.1f} s, "
                          f"success {rows[-1].get('success_after')}")
        for seed in args.warm_seeds:
            cache = warm_cache or base / "warm-cache"
            rows.append(run_demo(base / f"warm{seed}", cache, seed=seed, fast=False))
            console.print(f"warm seed {seed}: {rows[-1]['wall_s']:.1f} s, "
                          f"success {rows[-1].get('success_after')}")
        for i in range(args.fast_runs):
            work = base / f"fast{i}"
            rows.append(run_demo(work, work / "cache", seed=None, fast=True))
            console.print(f"fast run {i + 1}: {rows[-1]['wall_s']:.1f} s")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    cold = [r for r in rows if not r["fast"] and not r.get("teacher_cached")]
    warm = [r for r in rows if not r["fast"] and r.get("teacher_cached")]
    fast = [r for r in rows if r["fast"]]
    result = {
        "benchmark": "demo_learning",
        "command": "miniverl demo --seed N (cold: empty MINIVERL_CACHE; warm: teacher cached); "
                   "miniverl demo --fast (empty cache)",
        "targets": TARGETS,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": rows,
        "verdict": verdict(cold, warm, fast),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    show(rows, result, console)
    console.print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
