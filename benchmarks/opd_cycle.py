"""How much does pipelined scoring save? One strict-OPD cycle's wall time, pipelining on vs off.

    python benchmarks/opd_cycle.py [--reps 4] [--cycles 3] [--rollouts 8] [--batch 2]
        [--teacher-hidden 512] [--teacher-layers 8] [--max-new-tokens 64]

The student (this process) and the teacher (a ``python -m miniverl.teacher_server``
child over ``ipc://``) each run on one CPU thread, as under ``miniverl up`` on a small
machine. The recipe is ``recipes/toy_cpu_opd.yaml`` with the overrides above. Each
repetition trains one run with ``train.pipelining: true`` and one with ``false``
(interleaved, so drift in machine load hits both alike) for ``--cycles + 1`` cycles; a
cycle's wall time is the gap between consecutive ``metrics.jsonl`` rows (rollout +
waiting for the teacher + update + logging), and the first cycle of each run is
dropped as warm-up. It prints the median cycle time of each arm, their ratio
(pipelined / serial; target <= 0.75), where the time went (rollout, teacher wait,
update), the teacher's share of a serial cycle and how much of its wait pipelining hid,
and writes ``opd_cycle.json`` in ``--output-dir`` (default ``runs/benchmarks/opd_cycle/``; the committed ``benchmarks/results/opd_cycle.json`` with ``--update-committed``).

What pipelining can save is the teacher's share of a serial cycle: the ratio cannot go
below ``1 - share``. The default teacher (512 wide, 8 layers; the student is 64 wide, 2
layers) is the regime distillation is for, a teacher far larger than its student, and
on one CPU thread it scores a cycle in about the time the student samples it. With a
teacher of the student's size scoring is ~10% of a cycle and the ratio stays near 0.9
whatever the pipeline does (``--teacher-hidden 128 --teacher-layers 2 --batch 4``).
Overlap comes from waves: with ``--batch`` smaller than ``--rollouts`` the student
samples in several waves and each finished wave is scored during the next; the last
wave's scoring is what remains. The saving needs two free cores; on a loaded machine
both processes share one and the ratio tends to 1. This script measures; it does not
tune anything.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from miniverl.student.benchmark.outputs import add_output_options, script_output_file

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "opd_cycle.json"
RECIPE = ROOT / "recipes" / "toy_cpu_opd.yaml"
TARGET_RATIO = 0.75


def build_recipe(args, output_dir: Path, pipelining: bool):
    from miniverl.common.recipe import Recipe, load_recipe, recipe_dict

    data = recipe_dict(load_recipe(RECIPE))
    data["run"].update(output_dir=str(output_dir), name=f"opd-cycle-{int(pipelining)}")
    data["teacher"]["model"]["toy"].update(
        hidden=args.teacher_hidden, layers=args.teacher_layers,
        intermediate=2 * args.teacher_hidden,
    )
    # A random-init teacher of another size: nothing to prepare or qualify; only the
    # timing of a cycle is measured here.
    data["teacher"].update(prepare=None, min_success=None)
    data["environment"].update(eval_tasks=1, test_tasks=1)
    data["rollout"].update(batch_size=args.batch, max_new_tokens_per_turn=args.max_new_tokens)
    data["train"].update(
        cycles=args.cycles + 1, rollouts_per_cycle=args.rollouts, pipelining=pipelining,
        eval_every=0, save_every=0, sft_warmup_steps=0, sft_warmup_lr=None,
        sft_warmup_until_loss=None,  # cycles only: every metrics row is one OPD cycle
    )
    data["cache"] = {"enabled": False}
    return Recipe.model_validate(data)


def launch_teacher(model_dir: Path, endpoint: str, folder: Path, timeout_s: float):
    """The teacher child on one CPU thread, READY before the first run trains."""
    from miniverl.student.teacher_process import start_teacher

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    args = ["--model", str(model_dir), "--threads", "1", "--device", "cpu",
            "--dtype", "float32", "--log", str(folder / "teacher.log")]
    return start_teacher(args, endpoint=endpoint, log=folder / "teacher.out",
                         timeout_s=timeout_s, env=env)


def one_run(args, root: Path, endpoint: str, pipelining: bool) -> dict:
    """Train one short run; per-cycle wall times (first cycle dropped) and time split."""
    from miniverl.student.train.trainer import Trainer

    recipe = build_recipe(args, root, pipelining)
    with Trainer(recipe, teacher_endpoint=endpoint, show_progress=False, write_report=False,
                 checkpoints=False) as trainer:
        result = trainer.train()
    rows = [json.loads(line) for line in
            (result.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    shutil.rmtree(result.run_dir, ignore_errors=True)
    cycle_s = [b["wall_s"] - a["wall_s"] for a, b in zip(rows, rows[1:], strict=False)]
    kept = rows[1:]
    return {
        "cycle_s": cycle_s,
        "rollout_s": [r["time_rollout_s"] for r in kept],
        "teacher_wait_s": [r["time_teacher_wait_s"] for r in kept],
        "update_s": [r["time_update_s"] for r in kept],
        "tokens": [r["tokens"] for r in kept],
        "positions": [r["positions"] for r in kept],
    }


def summarise(runs: list[dict]) -> dict:
    def pooled(name: str) -> list[float]:
        return [x for run in runs for x in run[name]]

    out = {name: statistics.median(pooled(name)) for name in
           ("cycle_s", "rollout_s", "teacher_wait_s", "update_s", "tokens", "positions")}
    out["cycles_measured"] = len(pooled("cycle_s"))
    out["cycle_s_all"] = [round(x, 4) for x in pooled("cycle_s")]
    return out


def parameter_count(model_dir: Path) -> int:
    """Parameters of a toy model, from its safetensors headers (nothing is loaded)."""
    from safetensors import safe_open

    total = 0
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                total += int(np.prod(f.get_slice(name).get_shape()))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=4, help="Runs per arm (interleaved).")
    parser.add_argument("--cycles", type=int, default=3, help="Measured cycles per run.")
    parser.add_argument("--rollouts", type=int, default=8, help="Rollouts per cycle.")
    parser.add_argument("--batch", type=int, default=2, help="Episodes sampled at once.")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="Per assistant turn.")
    parser.add_argument("--teacher-hidden", type=int, default=512)
    parser.add_argument("--teacher-layers", type=int, default=8)
    add_output_options(parser, RESULTS)
    args = parser.parse_args()
    args.out = script_output_file(args, RESULTS, ROOT)

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from miniverl.common.toy import toy_model_dir
    from miniverl.student.teacher_process import stop_teacher

    tmp = Path(tempfile.mkdtemp(prefix="opd-cycle-"))
    endpoint = f"ipc://{tmp}/teacher.sock"
    probe = build_recipe(args, tmp / "runs", True)
    teacher_dir = toy_model_dir(probe.teacher.model.toy)
    proc = launch_teacher(teacher_dir, endpoint, tmp, probe.runtime.teacher_startup_timeout_s)
    arms: dict[str, list[dict]] = {"pipelined": [], "serial": []}
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    try:
        for rep in range(args.reps):
            for name, flag in (("pipelined", True), ("serial", False)):
                run = one_run(args, tmp / "runs", endpoint, flag)
                arms[name].append(run)
                print(f"rep {rep + 1}/{args.reps} {name:9s} cycle s "
                      + " ".join(f"{x:.2f}" for x in run["cycle_s"]), flush=True)
    finally:
        stop_teacher(proc)
    wall = time.perf_counter() - t_start
    summary = {name: summarise(runs) for name, runs in arms.items()}
    ratio = summary["pipelined"]["cycle_s"] / summary["serial"]["cycle_s"]
    p, s = summary["pipelined"], summary["serial"]
    share = s["teacher_wait_s"] / s["cycle_s"]
    hidden = 1.0 - p["teacher_wait_s"] / s["teacher_wait_s"] if s["teacher_wait_s"] else 0.0
    params = {role: parameter_count(toy_model_dir(spec)) for role, spec in
              (("student", probe.student.model.toy), ("teacher", probe.teacher.model.toy))}
    shutil.rmtree(tmp, ignore_errors=True)
    report = {
        "benchmark": "opd_cycle",
        "ratio_pipelined_over_serial": round(ratio, 4),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "arms": summary,
        "teacher_share_of_serial_cycle": round(share, 4),
        "teacher_wait_hidden": round(hidden, 4),
        "config": {
            "recipe": str(RECIPE.relative_to(ROOT)), "reps": args.reps, "cycles": args.cycles,
            "rollouts_per_cycle": args.rollouts, "batch_size": args.batch,
            "max_new_tokens_per_turn": args.max_new_tokens,
            "student": {**probe.student.model.toy.model_dump(), "parameters": params["student"]},
            "teacher": {**probe.teacher.model.toy.model_dump(), "parameters": params["teacher"]},
            "threads": {"student": 1, "teacher": 1}, "transport": "ipc",
        },
        "machine": {
            "cpu_count": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "torch": torch.__version__,
        },
        "wall_s": round(wall, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"median cycle: pipelined {p['cycle_s']:.3f} s, serial {s['cycle_s']:.3f} s, "
          f"ratio {ratio:.3f} (target <= {TARGET_RATIO})")
    for name, arm in summary.items():
        print(f"  {name:9s} rollout {arm['rollout_s']:.3f} s, teacher wait "
              f"{arm['teacher_wait_s']:.3f} s, update {arm['update_s']:.3f} s")
    print(f"  teacher share of a serial cycle {share:.2f} (about the most pipelining can "
          f"save); pipelining hid {hidden:.0%} of the teacher wait")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
