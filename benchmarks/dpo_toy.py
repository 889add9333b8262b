"""What DPO does on the toy, measured: recipes/toy_cpu_dpo.yaml as shipped and stopped after one update.

    python benchmarks/dpo_toy.py                     # two `miniverl up` runs, about 3 min each on 2 cores
    python benchmarks/dpo_toy.py --runs FULL ONE     # the same record from two finished runs

Runs ``miniverl up recipes/toy_cpu_dpo.yaml`` twice from the same cache: as shipped
(20 DPO cycles after the SFT warm-up) and with ``train.cycles: 1`` (the warm-up and one
DPO update), so the record says how much of the held-out success the warm-up made and
how much DPO added. Per run: greedy held-out success before and after (and of how many
tasks), the DPO cycles that had pairs and how many pairs each, the cycles skipped for
having none (``dpo_no_pairs``), the rollouts' success in the DPO cycles, the optimizer
steps, and the commit the run's manifest names. Writes ``dpo_toy.json`` in
``--output-dir`` (default ``runs/benchmarks/dpo_toy/``; the committed
``benchmarks/results/dpo_toy.json`` with ``--update-committed``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from miniverl.student.benchmark.outputs import add_output_options, script_output_file

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "toy_cpu_dpo.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "dpo_toy.json"


def run_up(recipe: Path, out: Path) -> tuple[Path, float]:
    """One ``miniverl up`` run; its run directory and wall time."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "miniverl.cli.app", "up", str(recipe),
                           "--output-dir", str(out), "--quiet"], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: miniverl up {recipe} exited {proc.returncode}:\n"
                         f"{proc.stderr[-2000:]}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir, wall


def summarize(run_dir: Path, wall_s: float | None) -> dict:
    """The record of one finished run (its evals, DPO cycles, skipped cycles, commit)."""
    evals = sorted((run_dir / "eval").glob("eval-v*.summary.json"),
                   key=lambda p: int(p.name.split("-v")[1].split(".")[0]))
    before, after = (json.loads(p.read_text(encoding="utf-8")) for p in (evals[0], evals[-1]))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    dpo = [r for r in rows if r.get("phase") == "train" and r.get("dpo_pairs") is not None]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    span = np.datetime64(events[-1]["ts"].rstrip("Z")) - np.datetime64(events[0]["ts"].rstrip("Z"))
    return {
        "run": run_dir.name,
        "git": manifest.get("git"),
        "wall_s": round(wall_s, 1) if wall_s is not None else None,  # the whole command
        "run_span_s": round(float(span / np.timedelta64(1, "ms")) / 1000, 1),  # first to last event
        "optimizer_steps": len(rows),
        "success_before": before["success"],
        "success_after": after["success"],
        "eval_tasks": after["n"],
        "dpo_cycles_with_pairs": len(dpo),
        "dpo_cycles_without_pairs": sum(e["event"] == "dpo_no_pairs" for e in events),
        "pairs_per_cycle": [r["dpo_pairs"] for r in dpo],
        "rollout_success_min": min((r["train_success"] for r in dpo), default=None),
        "rollout_success_max": max((r["train_success"] for r in dpo), default=None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs=2, metavar=("FULL", "ONE"),
                        help="read these finished runs (as shipped, one cycle) instead")
    add_output_options(parser, RESULTS)
    args = parser.parse_args(argv)
    output = script_output_file(args, RESULTS, ROOT)
    if args.runs:
        runs = [(run, None) for run in args.runs]
    else:
        with tempfile.TemporaryDirectory(prefix="mvl-dpo-") as tmp:
            one = Path(tmp) / "toy_cpu_dpo_1.yaml"
            data = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
            data["train"]["cycles"] = 1
            data["teacher"]["prepare"] = str(RECIPE.parent / data["teacher"]["prepare"])
            one.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
            out = output.parent / "runs"
            runs = [run_up(RECIPE, out / "full"), run_up(one, out / "one")]
    record = {"benchmark": "dpo_toy", "recipe": RECIPE.relative_to(ROOT).as_posix(),
              "as_shipped": summarize(*runs[0]), "one_cycle": summarize(*runs[1])}
    output.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    for name in ("as_shipped", "one_cycle"):
        r = record[name]
        print(f"{name}: {r['success_before']:.1%} -> {r['success_after']:.1%} of "
              f"{r['eval_tasks']}, {r['dpo_cycles_with_pairs']} cycles with pairs, "
              f"{r['dpo_cycles_without_pairs']} without")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
