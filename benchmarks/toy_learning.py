"""Learning benchmark: does ``recipes/toy_cpu_opd.yaml`` teach the toy student, per seed?

For each seed this writes a copy of the recipe with ``run.seed`` replaced (and
``teacher.prepare`` made absolute so the copy still finds the teacher-preparation
recipe), runs the real two-process system with ``miniverl up``, and reads the run's
``events.jsonl`` (eval before and after, teacher preparation) and ``metrics.jsonl``
(optimizer steps by phase, stale replies). Wall time is the whole ``miniverl up``
command: process start-up, toy model build, teacher preparation when the cache is
empty, both evals and training.

Cache modes: ``first`` (default) gives the first seed an empty ``MINIVERL_CACHE`` (it
pays teacher preparation) and lets the later seeds reuse it (warm); ``all`` gives every
seed an empty cache; ``none`` prepares the teacher once before timing anything.

The target (issue 6): held-out greedy success >= 0.9 on every seed, each run <= 150 s
on a 2-core CPU. The JSON records the load average, because the machine may be shared.

Run:  python benchmarks/toy_learning.py [--seeds 1 2 3] [--cold first|all|none]

This script trains nothing itself; it only starts ``miniverl up`` and reads the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from miniverl.common.rundir import RunDir
from miniverl.student.benchmark.outputs import add_output_options, script_output_file

ROOT = Path(__file__).resolve().parent.parent
TARGET_SUCCESS = 0.9
TARGET_WALL_S = 150.0


def seeded_recipe(recipe_path: Path, seed: int, work: Path) -> Path:
    """A copy of the recipe with ``run.seed`` and ``run.output_dir`` replaced."""
    data = yaml.safe_load(recipe_path.read_text(encoding="utf-8"))
    data["run"]["seed"] = seed
    data["run"]["output_dir"] = str(work / "runs")
    prepare = (data.get("teacher") or {}).get("prepare")
    if prepare and not Path(prepare).is_absolute():
        data["teacher"]["prepare"] = str((recipe_path.parent / prepare).resolve())
    out = work / f"{recipe_path.stem}-seed{seed}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return out


def _mean_success(rows: list[dict[str, Any]]) -> float | None:
    values = [r["train_success"] for r in rows if r.get("train_success") is not None]
    return round(sum(values) / len(values), 3) if values else None


def read_run(run_dir: Path) -> dict[str, Any]:
    """Evals, teacher preparation and step counts of one finished run."""
    events = RunDir(run_dir).read_jsonl("events.jsonl")
    metrics = RunDir(run_dir).read_jsonl("metrics.jsonl")
    evals = [e for e in events if e["event"] == "eval"]
    prepared = next((e for e in events if e["event"] == "teacher_prepared"), None)
    warmup = next((e for e in events if e["event"] == "sft_warmup_done"), None)
    status = json.loads((run_dir / "status.json").read_text()) if (
        run_dir / "status.json").is_file() else {}
    return {
        "status": status.get("status"),
        "success_before": evals[0]["success"] if evals else None,
        "success_after": evals[-1]["success"] if len(evals) > 1 else None,
        "eval_n": evals[-1]["n"] if evals else None,
        "evals": [{"version": e["version"], "success": e["success"]} for e in evals],
        "optimizer_steps": len(metrics),
        "on_policy_steps": sum(1 for r in metrics if r.get("on_policy")),
        "sft_warmup_ended": warmup and {"step": warmup["step"], "reason": warmup["reason"]},
        "stale_dropped": max((r.get("stale_dropped", 0) for r in metrics), default=0),
        # Sampled (temperature 1) success of the first and last 5 strict-OPD batches:
        # what distillation itself did after the SFT warm-up.
        "opd_sampled_success_first5": _mean_success(
            [r for r in metrics if r.get("on_policy")][:5]),
        "opd_sampled_success_last5": _mean_success(
            [r for r in metrics if r.get("on_policy")][-5:]),
        "student_wall_s": metrics[-1]["wall_s"] if metrics else None,
        "teacher_prepared": prepared and {
            "cached": prepared.get("cached"),
            "steps": prepared.get("steps"),
            "eval_success": prepared.get("eval_success"),
        },
    }


def prep_record(cache: Path) -> dict[str, Any] | None:
    records = sorted((cache / "teachers").glob("prepared-*/miniverl_prepared.json"))
    return json.loads(records[-1].read_text()) if records else None


def run_seed(recipe: Path, seed: int, work: Path, cache: Path, timeout_s: float) -> dict:
    copy = seeded_recipe(recipe, seed, work)
    run_id = f"toy-learning-seed{seed}-{int(time.time())}"
    env = {**os.environ, "MINIVERL_CACHE": str(cache)}
    cold = not any((cache / "teachers").glob("prepared-*/miniverl_prepared.json"))
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "miniverl.cli.app", "up", str(copy), "--run-id", run_id,
         "--quiet"],
        env=env, cwd=work, capture_output=True, text=True, timeout=timeout_s,
    )
    wall = time.perf_counter() - t0
    result = {
        "seed": seed,
        "cold_cache": cold,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "loadavg_1m_before": round(load_before[0], 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        **read_run(work / "runs" / run_id),
    }
    if cold:
        record = prep_record(cache)
        result["teacher_prep_wall_s"] = round(record["wall_s"], 1) if record else None
    if proc.returncode != 0:
        result["stderr_tail"] = proc.stderr.splitlines()[-15:]
    result["meets_target"] = bool(
        proc.returncode == 0
        and (result["success_after"] or 0.0) >= TARGET_SUCCESS
        and wall <= TARGET_WALL_S
    )
    return result


def prewarm(recipe: Path, cache: Path) -> None:
    """Prepare the teacher into ``cache`` before timing (``--cold none``)."""
    env = {**os.environ, "MINIVERL_CACHE": str(cache)}
    code = (
        "import sys; from miniverl.common.recipe import load_recipe; "
        "from miniverl.student.teacher_prep import prep_recipe_path, prepare_teacher; "
        "r = load_recipe(sys.argv[1]); "
        "prepare_teacher(r, prep_recipe_path(r, sys.argv[1]), show_progress=False)"
    )
    subprocess.run([sys.executable, "-c", code, str(recipe)], env=env, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "toy_cpu_opd.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--cold", choices=["first", "all", "none"], default="first")
    add_output_options(parser, ROOT / "benchmarks" / "results" / "toy_learning.json")
    parser.add_argument("--timeout-s", type=float, default=1200.0)
    parser.add_argument("--keep", action="store_true", help="Keep the work folder.")
    parser.add_argument("--cache", type=Path, default=None,
                        help="Use this MINIVERL_CACHE for every seed (warm if it holds the teacher).")
    args = parser.parse_args(argv)
    args.out = script_output_file(args, ROOT / "benchmarks" / "results" / "toy_learning.json", ROOT)

    recipe = args.recipe.resolve()
    work = Path(tempfile.mkdtemp(prefix="toy-learning-"))
    shared = work / "cache-shared"
    runs = []
    try:
        if args.cold == "none":
            prewarm(recipe, shared)
        for i, seed in enumerate(args.seeds):
            cache = work / f"cache-seed{seed}" if args.cold == "all" else shared
            if args.cold == "first" and i > 0:
                cache = shared
            if args.cache is not None:
                cache = args.cache.resolve()
            runs.append(run_seed(recipe, seed, work, cache, args.timeout_s))
            r = runs[-1]
            print(f"seed {seed}: {'cold' if r['cold_cache'] else 'warm'} "
                  f"success {r['success_before']} -> {r['success_after']} "
                  f"wall {r['wall_s']} s (load {r['loadavg_1m_before']}) "
                  f"exit {r['exit_code']}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "toy_learning",
        "recipe": str(recipe.relative_to(ROOT)) if recipe.is_relative_to(ROOT) else str(recipe),
        "recipe_text": recipe.read_text(encoding="utf-8"),
        "target": {"success_after": TARGET_SUCCESS, "wall_s": TARGET_WALL_S},
        "cold_mode": args.cold,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": runs,
        "all_meet_target": all(r["meets_target"] for r in runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0 if report["all_meet_target"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
