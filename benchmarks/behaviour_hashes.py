"""Behaviour fingerprint: a sha256 over the final checkpoint of a short toy run per mode.

A restructuring must not change what training computes. This script runs the real
two processes (a ``python -m miniverl.teacher_server`` process and ``miniverl train
--teacher`` over ``mvl-score/1``) for each mode (sft, offline_kd, opd, replay, dpo) on
tiny toy models, then hashes every tensor of the last checkpoint (model weights,
optimizer and RNG state) in name order. The teacher is started the way ``miniverl up``
starts one (``miniverl.student.teacher_process.start_teacher``: the student starts
only once the teacher answered READY) and stopped with SIGTERM after the run.

Settings under which two runs agree bit for bit: ``run.deterministic: true``. The
student then marks every SCORE ``deterministic`` and the teacher scores each alone in
one forward pass (no coalescing, no prefix cache), so pipelining and a coalescing
teacher no longer matter (docs/up.md, "Reruns and resumes"). The runs here still use
``train.pipelining: false`` and ``--batch-tokens 1 --prefix-cache-tokens 0``.

Re-recorded once, on purpose (issue 18): before deterministic scoring, a teacher with
``--prefix-cache-tokens 0`` kept no prefix but still split a request's forward pass at
the prefix it shared with the previous request (a split that depends on request
order); a deterministic request is now one plain forward pass, which rounds
differently at 1e-7. sft and dpo (no top-k targets) kept their hashes; with
``run.deterministic: false`` the other modes reproduced the earlier hashes exactly.

Record:  python benchmarks/behaviour_hashes.py --repeat 2 --write benchmarks/results/behaviour_hashes.json
Check:   python benchmarks/behaviour_hashes.py --check benchmarks/results/behaviour_hashes.json

``--repeat 2`` runs every mode twice and fails unless both runs agree, which is what
makes a recorded hash a meaningful baseline. ``--check`` exits 1 naming each mode
whose hash differs from the recorded one. Hashes are tied to the torch build and CPU
they were recorded on (the JSON says which); compare on the same machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from miniverl.student.teacher_process import start_teacher, stop_teacher
from miniverl.testing.toy_recipe import STUDENT, TEACHER, recipe_dict

ROOT = Path(__file__).resolve().parent.parent
MODES = ("sft", "offline_kd", "opd", "replay", "dpo", "dpo_step")
TEACHER_STARTUP_S = 120.0
# The runtime section the hashes were recorded with (one thread, patient timeouts).
RUNTIME = {"cpu_threads": 1, "heartbeat_ms": 200, "request_timeout_s": 60,
           "unavailable_timeout_s": 120}


def dpo_step_recipe(output_dir: Path) -> dict[str, Any]:
    """``recipes/toy_cpu_dpo.yaml`` cut to two DPO cycles: its 300 warm-up steps make a
    student that succeeds on some rollouts, so a DPO cycle finds a pair and takes a DPO
    update (the short ``dpo`` recipe above finds none: it covers the warm-up and the
    pair search only). About a minute."""
    data = yaml.safe_load((ROOT / "recipes" / "toy_cpu_dpo.yaml").read_text())
    data["run"].update(output_dir=str(output_dir), deterministic=True)
    data["train"].update(cycles=2, pipelining=False)
    data["environment"].update(eval_tasks=4, test_tasks=4)
    return data


def recipe(mode: str, output_dir: Path) -> dict[str, Any]:
    """A few-second deterministic recipe for ``mode`` (every mode takes >= 3 updates): the
    tests' toy recipe (``miniverl.testing.toy_recipe``), serial, with patient timeouts."""
    if mode == "dpo_step":
        return dpo_step_recipe(output_dir)
    train: dict[str, Any] = {"pipelining": False}
    if mode == "replay":
        train.update(updates_per_batch=2, max_lag=1)
    if mode == "dpo":
        train.update(sft_warmup_steps=3, rollouts_per_cycle=4)
    sections: dict[str, Any] = {"run": {"name": f"hash-{mode}"}, "runtime": RUNTIME}
    if mode == "dpo":
        sections["dpo"] = {"beta": 0.1, "group_size": 2}
    return recipe_dict(mode, output_dir, teacher=TEACHER if mode != "dpo" else STUDENT,
                       sections=sections, **train)


def checkpoint_sha256(run_dir: Path) -> tuple[str, str]:
    """(sha256 over every tensor of the newest checkpoint, its directory name)."""
    from safetensors.numpy import load_file

    steps = sorted((run_dir / "checkpoints").glob("step_*"),
                   key=lambda p: int(p.name.removeprefix("step_")))
    if not steps:
        raise SystemExit(f"behaviour_hashes: {run_dir} has no checkpoint; the run failed")
    digest = hashlib.sha256()
    for file in sorted(steps[-1].glob("*.safetensors")):
        tensors = load_file(str(file))
        for name in sorted(tensors):
            array = tensors[name]
            digest.update(f"{file.name}:{name}:{array.dtype}:{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest(), steps[-1].name


def run_mode(mode: str, work: Path, attempt: int) -> dict[str, Any]:
    out = work / f"{mode}-{attempt}"
    out.mkdir(parents=True)
    path = out / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(mode, out / "runs"), sort_keys=False))
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "miniverl.cli.app", "train", str(path), "--run-id", "run"]
    teacher = None
    if mode != "sft":
        endpoint = f"ipc://{out}/teacher.sock"
        teacher = start_teacher(
            ["--recipe", str(path), "--threads", "1", "--batch-tokens", "1",
             "--prefix-cache-tokens", "0", "--log", str(out / "teacher.log")],
            endpoint=endpoint, log=out / "teacher.out", timeout_s=TEACHER_STARTUP_S)
        cmd += ["--teacher", endpoint]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out)
    finally:
        if teacher is not None:
            stop_teacher(teacher, timeout_s=60)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"behaviour_hashes: {mode} run failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    sha, step = checkpoint_sha256(out / "runs" / "run")
    return {"sha256": sha, "checkpoint": step, "wall_s": round(wall, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--repeat", type=int, default=1, help="Runs per mode; all must agree.")
    parser.add_argument("--write", type=Path, help="Write the hashes to this JSON file.")
    parser.add_argument("--check", type=Path, help="Compare with hashes recorded here.")
    args = parser.parse_args()

    import torch

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mvl-hash-") as tmp:
        for mode in args.modes:
            runs = [run_mode(mode, Path(tmp), i) for i in range(args.repeat)]
            shas = {r["sha256"] for r in runs}
            results[mode] = {**runs[0], "repeats_agree": len(shas) == 1,
                             "wall_s": [r["wall_s"] for r in runs]}
            print(f"{mode:<11} {runs[0]['sha256'][:16]}  {runs[0]['checkpoint']:<8} "
                  f"repeats agree: {len(shas) == 1}  ({', '.join(str(r['wall_s']) for r in runs)} s)")
    record = {
        "benchmark": "behaviour_hashes",
        "torch": torch.__version__,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "modes": results,
    }
    failed = [m for m, r in results.items() if not r["repeats_agree"]]
    if args.write:
        # Modes not run this time keep their recorded hashes.
        if args.write.is_file():
            kept = json.loads(args.write.read_text()).get("modes", {})
            record["modes"] = {**kept, **results}
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.write}")
    if args.check:
        recorded = json.loads(args.check.read_text())["modes"]
        for mode, r in results.items():
            want = recorded.get(mode, {}).get("sha256")
            same = want == r["sha256"]
            print(f"{mode:<11} {'same as recorded' if same else 'DIFFERS from ' + str(want)[:16]}")
            if not same:
                failed.append(mode)
    if failed:
        print(f"behaviour_hashes: modes not reproduced: {', '.join(sorted(set(failed)))}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
