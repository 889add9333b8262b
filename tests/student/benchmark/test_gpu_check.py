"""The GPU check (benchmarks/gpu_check.py, docs/gpu.md): prepared and tested without a GPU.

A GPU is at hand rarely and for minutes, so the command must work the first time it
runs there. Its CPU form (``--cpu-smoke``) runs every step end to end on tiny models —
``miniverl up`` with both processes, swap, park/wake over the socket, the float16 path,
sampling against ``generate`` — and reports each GPU-only step as skipped with its
reason; the recipes of the GPU form (the Qwen3-0.6B/1.7B shapes on ``cuda``, bf16, nf4,
fp16) validate here; a bad value is one line.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
UP_STEPS = ("opd_bf16_lora", "opd_bf16_full", "opd_swap")


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cpu_form(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """The CPU form's process and its record, run once for the tests that read it (about a
    minute: `miniverl up` four times, a teacher once, two updates at the real vocabulary)."""
    out = tmp_path_factory.mktemp("cpu-form")
    done = _run("--cpu-smoke", "--output-dir", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads((out / "gpu_check_cpu_smoke.json").read_text())


@pytest.mark.slow
def test_the_cpu_form_runs_every_step(cpu_form):
    done, record = cpu_form
    assert record["benchmark"] == "gpu_check" and record["cpu_smoke"] is True
    assert list(record["steps"]) == [name for name, _ in gpu_check.STEPS]
    machine = record["machine"]
    assert machine["device"] == "cpu" and machine["torch"] and machine["transformers"]
    assert {"driver", "cuda", "peft", "bitsandbytes", "gpu_memory_mib"} <= set(machine)
    steps = record["steps"]
    assert steps["build"]["status"] == "ok"
    for name in UP_STEPS:  # two processes under `up`, one update after the warm-up
        step = steps[name]
        assert step["status"] == "ok", (name, step.get("error"))
        assert step["exit_code"] == 0 and step["updates"] == 2 and step["loss_finite"]
        assert step["update_s"] > 0 and step["sampled_tokens_per_s"] > 0
        assert step["teacher_wait_s"] >= 0 and step["loss_and_step_s"] > 0
        # The memory figures need a GPU: said, not left blank.
        assert "no GPU" in step["peak_allocator_mib"]["skipped"]
        assert "no GPU" in step["peak_driver_mib"]["skipped"]
    assert steps["opd_swap"]["memory_strategy"]["chosen"] == "swap"
    # auto on a CPU student: resident, and the reason says why.
    lora = steps["opd_bf16_lora"]["memory_strategy"]
    assert lora["chosen"] == "resident" and "student on CPU" in lora["reason"]
    fp16 = steps["opd_fp16"]
    assert fp16["config"]["dtype"] == "float16" and fp16["updates"] >= 1
    # The float16 path trains a LoRA student (its adapters step in float32); a float16
    # full fine-tune, whose first AdamW step turned its weights NaN (docs/gpu.md), is
    # refused by the recipe (test_a_float16_full_fine_tune_is_refused_before_it_runs).
    assert fp16["config"]["lora"] is True and fp16["status"] == "ok", fp16
    park = steps["teacher_park_wake"]
    assert park["status"] == "ok" and park["park_s"] >= 0 and park["wake_s"] >= 0
    assert park["positions_per_s"] > 0 and "no GPU" in park["park_frees"]["skipped"]
    for name in ("opd_qlora_nf4", "opd_nf4_teacher_swap"):
        nf4 = steps[name]
        assert nf4["status"] == "skipped" and "4-bit needs bitsandbytes on CUDA" in nf4["reason"]
    rows = steps["sampling_vs_generate"]["rows"]
    assert rows and all(r["ours_tokens_per_s"] > 0 and r["generate_tokens_per_s"] > 0
                        for r in rows)
    assert steps["opd_smollm2"]["status"] == "skipped" and steps["opd_smollm2"]["reason"]
    # Without vLLM here (or on the CPU form with it), the engine step says why it skipped.
    assert steps["sampling_engines"]["status"] == "skipped" and steps["sampling_engines"]["reason"]
    assert "GPU check on cpu" in done.stdout and "wrote" in done.stdout
    committed = gpu_check._args(["--cpu-smoke", "--update-committed"]).out
    assert committed == ROOT / "benchmarks" / "results" / "gpu_check_cpu_smoke.json"
    assert gpu_check._args(["--update-committed"]).out == gpu_check.RESULTS


@pytest.mark.slow  # imports torch in a child: several seconds
def test_a_step_past_the_budget_is_skipped_with_the_reason(tmp_path):
    done = _run("--cpu-smoke", "--budget-s", "0.001", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    steps = json.loads((tmp_path / "gpu_check_cpu_smoke.json").read_text())["steps"]
    assert list(steps) == [name for name, _ in gpu_check.STEPS]
    assert all(r["status"] == "skipped" and "time budget spent (--budget-s 0.001)" in r["reason"]
               for r in steps.values())


@pytest.mark.parametrize("name", sorted(gpu_check.UP_RUNS))
def test_the_gpu_recipes_validate(name, tmp_path):
    # On the GPU the first run must not fail on its own recipe: each `up` recipe of the
    # GPU form (cuda, the Qwen3-shaped toys, its dtype and quantization) validates here.
    from miniverl.common.recipe import load_recipe

    check = SimpleNamespace(cuda=True, smoke=False, device="cuda", tmp=tmp_path,
                            shapes=gpu_check.SHAPES["gpu"])
    dtype, lora, memory, quantization, teacher_quantization, updates = gpu_check.UP_RUNS[name]
    recipe = load_recipe(gpu_check.up_recipe(check, name, dtype, lora, memory, quantization,
                                             updates, teacher_quantization=teacher_quantization))
    assert (recipe.student.device, recipe.teacher.device) == ("cuda", "cuda")
    assert recipe.student.dtype == recipe.teacher.dtype == dtype
    assert recipe.student.quantization == quantization and recipe.teacher.memory == memory
    assert recipe.teacher.quantization == teacher_quantization
    assert recipe.student.model.toy.hidden == 1024 and recipe.teacher.model.toy.hidden == 2048
    assert recipe.train.cycles == updates and recipe.run.mode == "opd"


def test_the_gpu_shapes_are_qwen3_sized():
    # Parameters of the decoder layers (the toy vocabulary's embeddings left out).
    def decoder_params(s):
        head = s["hidden"] // s["heads"]
        attn = 2 * s["hidden"] * s["heads"] * head + 2 * s["hidden"] * s["kv_heads"] * head
        return s["layers"] * (attn + 3 * s["hidden"] * s["intermediate"])

    shapes = gpu_check.SHAPES["gpu"]
    assert math.isclose(decoder_params(shapes["student"]) / 1e9, 0.35, abs_tol=0.05)
    assert math.isclose(decoder_params(shapes["teacher"]) / 1e9, 1.41, abs_tol=0.05)


def test_a_bad_budget_is_one_line(tmp_path):
    done = _run("--budget-s", "0", "--output-dir", str(tmp_path), timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0
    assert "--budget-s 0.0 must be above 0" in done.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def test_a_float16_full_fine_tune_is_refused_before_it_runs(tmp_path):
    # Fail early: the recipe refuses what would turn NaN at the first step, with one line
    # naming the field and the fix; the same student with LoRA validates.
    from miniverl.common.errors import ConfigError
    from miniverl.common.recipe import Recipe
    from miniverl.testing.toy_recipe import recipe_dict

    data = recipe_dict("opd", tmp_path)
    data["student"]["dtype"] = "float16"
    with pytest.raises((ConfigError, ValueError), match="set dtype: bfloat16 or float32, or "
                                                         "train LoRA adapters"):
        Recipe.model_validate(data)
    data["student"]["lora"] = {"r": 4}
    assert Recipe.model_validate(data).student.dtype == "float16"


@pytest.mark.slow  # imports peft and builds a model: several seconds in a fresh process
def test_why_the_float16_full_fine_tune_fails_and_lora_does_not():
    # docs/gpu.md, "What the CPU form already found": AdamW's eps (1e-8) is 0 in float16,
    # so a float16 weight whose gradient is 0 becomes 0/0; bfloat16 keeps eps. A LoRA
    # student's adapters are float32 on a float16 base (PEFT), so it steps in float32.
    import torch
    from peft import LoraConfig, get_peft_model

    from miniverl.common.toy import build_toy_model

    for dtype, nan in ((torch.float16, True), (torch.bfloat16, False)):
        weight = torch.nn.Parameter(torch.ones(2, dtype=dtype))
        weight.grad = torch.zeros(2, dtype=dtype)
        torch.optim.AdamW([weight], lr=1e-4, weight_decay=0.0).step()
        assert bool(weight.isnan().all()) is nan, dtype
    base = build_toy_model(gpu_check.SHAPES["cpu"]["student"]).to(torch.float16)
    student = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"],
                                              task_type="CAUSAL_LM"))
    assert {p.dtype for p in student.parameters() if p.requires_grad} == {torch.float32}


@pytest.mark.parametrize("ending", ["sys.exit(0)", "os._exit(0)"])
def test_the_peak_hook_writes_at_either_exit(ending, tmp_path):
    # The allocator's peaks come from each process as it exits; the teacher ends with
    # os._exit, which skips atexit. A stand-in torch whose CUDA was used (no GPU needed).
    (tmp_path / "sitecustomize.py").write_text(gpu_check.SITECUSTOMIZE)
    peaks = tmp_path / "peaks"
    peaks.mkdir()
    fake = ("import os, sys, types; cuda = types.SimpleNamespace(is_initialized=lambda: True, "
            "max_memory_allocated=lambda: 3 * 2**20, max_memory_reserved=lambda: 4 * 2**20); "
            "sys.modules['torch'] = types.SimpleNamespace(cuda=cuda); ")
    done = subprocess.run(
        [sys.executable, "-c", fake + ending, "miniverl.teacher_server"], capture_output=True,
        text=True, timeout=60, env={"PYTHONPATH": str(tmp_path),
                                    "MINIVERL_GPU_CHECK_PEAKS": str(peaks), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert gpu_check.allocator_peaks(peaks) == {
        "teacher": {"max_allocated_mib": 3.0, "max_reserved_mib": 4.0}}


def test_the_vllm_engine_recipe_of_the_gpu_form_validates(tmp_path):
    # The sampling_engines step's vllm run: the GPU form's LoRA recipe with rollout.engine
    # vllm validates here, as its hf twin does.
    from miniverl.common.recipe import load_recipe

    check = SimpleNamespace(cuda=True, smoke=False, device="cuda", tmp=tmp_path,
                            shapes=gpu_check.SHAPES["gpu"])
    for engine in ("hf", "vllm"):
        recipe = load_recipe(gpu_check.up_recipe(check, f"opd_engine_{engine}", "bfloat16", True,
                                                 "resident", "none", 3, engine=engine))
        assert recipe.rollout.engine == engine and recipe.student.lora is not None


def test_without_cuda_the_check_exits_with_one_line(tmp_path):
    # It ran its steps on the CPU and called that a GPU check; now it says why it stops.
    done = _run("--output-dir", str(tmp_path), timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: torch sees no CUDA device (torch.cuda.is_available() is False); this check "
        "needs one (--cpu-smoke runs its CPU form)"]
    assert not list(tmp_path.iterdir())


def test_the_record_is_written_after_every_step(tmp_path, monkeypatch):
    # A check killed midway (a lent GPU's time ran out) keeps the steps it finished.
    out = tmp_path / "gpu_check_cpu_smoke.json"
    seen = {}

    def first(check):
        return {"figure": 1}

    def second(check):
        seen["before_second"] = json.loads(out.read_text())
        raise RuntimeError("this step fails")

    monkeypatch.setattr(gpu_check, "STEPS", [("first", first), ("second", second)])
    assert gpu_check.main(["--cpu-smoke", "--output-dir", str(tmp_path)]) == 0
    assert seen["before_second"]["steps"] == {"first": {"status": "ok", "figure": 1,
                                                        "step_s": 0.0}}
    final = json.loads(out.read_text())
    assert final["steps"]["second"]["status"] == "failed" and final["machine"]


def test_a_step_that_times_out_has_its_processes_ended(tmp_path):
    # `up` killed at its timeout left its teacher and student running; the whole process
    # group is ended now.
    pid_file = tmp_path / "child.pid"
    done = gpu_check.run_bounded(
        ["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], timeout_s=2)
    assert done.returncode == 124 and "timed out after 2 s" in done.stderr
    child = int(pid_file.read_text())
    import os
    import time

    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's child {child} is still running")


def test_the_estimate_fits_eight_minutes(capsys):
    assert sum(gpu_check.ESTIMATE_S[name] for name, _ in gpu_check.STEPS) <= 480


@pytest.mark.slow  # the CPU form ran the step (a child: two updates at the real vocabulary)
def test_the_recipe_shaped_update_reports_the_plan_beside_the_peak(cpu_form):
    row = cpu_form[1]["steps"]["recipe_update"]
    assert row["status"] == "ok", row
    assert row["config"]["vocab"] == 151_936 and row["config"]["checkpointing"]
    assert row["loss_finite"] and row["measured_peak_mib"] > 0
    assert 0.7 <= row["predicted_over_measured"] <= 1.3
