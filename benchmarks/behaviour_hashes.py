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

Against a base commit, on this machine (what a restructuring is checked with):

    python benchmarks/behaviour_hashes.py --against 158d583 --write benchmarks/results/behaviour_hashes.json

``--against REV`` checks ``REV`` out in a scratch git worktree, installs it into a scratch
venv that shares this environment's packages (``python -m venv --system-site-packages
--without-pip``, then this environment's ``pip install --no-deps -e WORKTREE``), checks
that the venv imports miniverl from the worktree, runs every mode there and here, and
exits 1 naming each mode whose hash is not the base's. The base runs this script's
recipes with the base's code, recipes and test kit. Both are removed afterwards; the
JSON records both commits (and whether this tree had uncommitted changes).

Record:  python benchmarks/behaviour_hashes.py --repeat 2 --write benchmarks/results/behaviour_hashes.json
Check:   python benchmarks/behaviour_hashes.py --check benchmarks/results/behaviour_hashes.json

``--repeat 2`` runs every mode twice and fails unless both runs agree, which is what
makes a recorded hash a meaningful baseline. ``--check`` exits 1 naming each mode
whose hash differs from the recorded one. Hashes do not travel: the same torch build
gives other hashes on another CPU, and on the same CPU with another kernel choice
(``ATEN_CPU_CAPABILITY``), so the JSON records the CPU model and torch's CPU capability
beside the torch build, and ``--check`` says when they are not this machine's; to
compare across machines, use ``--against`` on each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from miniverl.student.teacher_process import start_teacher, stop_teacher
from miniverl.testing.toy_recipe import STUDENT, TEACHER, recipe_dict

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this file
from machine import machine_record  # noqa: E402

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


MACHINE_KEYS = ("torch", "machine", "cpu_model", "cpu_capability")


def code_record() -> dict[str, Any]:
    """The commit the hashed code is, and whether tracked files differed from it."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True, text=True)
    return {"rev": head.stdout.strip() or None,
            "uncommitted_changes": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}


def hash_modes(modes: list[str], repeat: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mvl-hash-") as tmp:
        for mode in modes:
            runs = [run_mode(mode, Path(tmp), i) for i in range(repeat)]
            shas = {r["sha256"] for r in runs}
            results[mode] = {**runs[0], "repeats_agree": len(shas) == 1,
                             "wall_s": [r["wall_s"] for r in runs]}
            print(f"{mode:<11} {runs[0]['sha256'][:16]}  {runs[0]['checkpoint']:<8} "
                  f"repeats agree: {len(shas) == 1}  ({', '.join(str(r['wall_s']) for r in runs)} s)",
                  flush=True)
    return results


def _run(cmd: list[str], what: str, **kw: Any) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"behaviour_hashes: {what} failed (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
    return proc


def hash_base(rev: str, modes: list[str], repeat: int) -> dict[str, Any]:
    """Run ``modes`` with commit ``rev``'s code in a scratch worktree and venv."""
    sha = _run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
               f"git rev-parse {rev} (pass a commit of this repository)").stdout.strip()
    with tempfile.TemporaryDirectory(prefix="mvl-hash-base-") as tmp:
        tree, venv = Path(tmp) / "tree", Path(tmp) / "venv"
        _run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha],
             "git worktree add")
        try:
            # --without-pip: the venv uses this environment's pip and setuptools (a venv's
            # own bundled setuptools may be too old to build an editable wheel).
            _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                  str(venv)], "python -m venv")
            python = venv / "bin" / "python"
            # --no-build-isolation: build with this environment's setuptools, offline.
            _run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                  "--no-build-isolation", "-e", str(tree)], "pip install -e WORKTREE")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            where = _run([str(python), "-c", "import miniverl.student.train as t; "
                          "print(t.__file__)"], "importing miniverl in the base venv",
                         env=env).stdout.strip()
            if not Path(where).resolve().is_relative_to(tree.resolve()):
                raise SystemExit(f"behaviour_hashes: the base venv imports miniverl from "
                                 f"{where}, not from the worktree {tree}; the base would not "
                                 "be what runs")
            # This script's recipes with the base's code: the copy sits in the worktree,
            # so its recipes/ and the test kit it imports are the base's.
            script = tree / "benchmarks" / "behaviour_hashes.py"
            script.write_text(Path(__file__).read_text())
            out = Path(tmp) / "base.json"
            print(f"base {sha[:12]}: running {', '.join(modes)}", flush=True)
            proc = subprocess.run([str(python), str(script), "--modes", *modes, "--repeat",
                                   str(repeat), "--write", str(out)], cwd=tree, env=env)
            if proc.returncode != 0:
                raise SystemExit(f"behaviour_hashes: the base run at {sha[:12]} failed "
                                 f"(exit {proc.returncode})")
            base = json.loads(out.read_text())
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)
    return {"rev": sha, "imports_from_worktree": True,
            **{k: base[k] for k in MACHINE_KEYS}, "modes": base["modes"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--repeat", type=int, default=1, help="Runs per mode; all must agree.")
    parser.add_argument("--write", type=Path, help="Write the hashes to this JSON file.")
    parser.add_argument("--check", type=Path, help="Compare with hashes recorded here.")
    parser.add_argument("--against", metavar="REV",
                        help="Also run commit REV in a scratch worktree and venv on this "
                             "machine, and compare every mode with it.")
    args = parser.parse_args()

    machine = machine_record()
    print("machine: " + ", ".join(f"{k} {machine[k]}" for k in MACHINE_KEYS), flush=True)
    base = hash_base(args.against, args.modes, args.repeat) if args.against else None
    results = hash_modes(args.modes, args.repeat)
    record: dict[str, Any] = {"benchmark": "behaviour_hashes", **machine, **code_record(),
                              "modes": results}
    failed = [m for m, r in results.items() if not r["repeats_agree"]]
    if base is not None:
        if any(base[k] != machine[k] for k in MACHINE_KEYS):
            raise SystemExit("behaviour_hashes: the base ran on another torch build or CPU "
                             "capability than this run; rerun without ATEN_CPU_CAPABILITY set")
        for mode, r in results.items():
            want = base["modes"][mode]
            r["same_as_base"] = want["sha256"] == r["sha256"] and want["repeats_agree"]
            print(f"{mode:<11} {'same as base' if r['same_as_base'] else 'DIFFERS from base ' + want['sha256'][:16]}")
            if not r["same_as_base"]:
                failed.append(mode)
        record["base"] = {k: v for k, v in base.items() if k not in MACHINE_KEYS}
    if args.write:
        # Modes not run this time keep their recorded hashes, when they were recorded
        # on this machine (a hash from another CPU or torch build does not carry over).
        if args.write.is_file():
            old = json.loads(args.write.read_text())
            if all(old.get(k) == machine[k] for k in MACHINE_KEYS):
                record["modes"] = {**old.get("modes", {}), **results}
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.write}")
    if args.check:
        recorded_file = json.loads(args.check.read_text())
        other = [f"{k} {recorded_file.get(k)!r} (here {machine[k]!r})" for k in MACHINE_KEYS
                 if recorded_file.get(k) != machine[k]]
        if other:
            print(f"note: {args.check} was recorded on another machine: {'; '.join(other)}; "
                  "hashes do not travel, compare with --against REV instead")
        recorded = recorded_file["modes"]
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
