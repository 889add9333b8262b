"""The memory plan (docs/gpu.md, "The memory plan").

Users rely on: a recipe that cannot fit one device is refused before any work, in one
line naming the setting that would make it fit (``validate --device-memory``, and
``up``/``train`` on a CUDA student); what the recipe left null is chosen to fit;
``teacher.memory: auto`` follows the plan; the plan's student peak is within 15% of the
CPU's measured peak on a Qwen3-shaped and a SmolLM2-shaped model (slow).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from miniverl.common.errors import ConfigError
from miniverl.common.memory_plan import (
    CHECK_COPIES,
    CHECK_COPIES_TOP_P,
    CUDA_OVERHEAD_BYTES,
    GIB,
    KNOWN_CONFIGS,
    LORA_TARGETS,
    ModelShape,
    check_recipe,
    engine_needs,
    engine_refusal,
    parse_bytes,
    with_train_changes,
)
from miniverl.common.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
QWEN_RECIPE = ROOT / "recipes" / "qwen3_opd_calculator.yaml"


def test_shapes_count_the_real_models_parameters():
    # Qwen3-0.6B has 596,049,920 parameters (tied head), Qwen3-1.7B 1,720,574,976; PEFT
    # reports 10,092,544 trainable for LoRA r 16 on every projection of the 0.6B.
    small = ModelShape.from_config(KNOWN_CONFIGS["Qwen/Qwen3-0.6B"])
    assert small.params() == 596_049_920
    assert ModelShape.from_config(KNOWN_CONFIGS["Qwen/Qwen3-1.7B"]).params() == 1_720_574_976
    assert small.lora_params(16, LORA_TARGETS) == 10_092_544


def test_the_shipped_qwen_recipe_fits_24_and_80_gib():
    # As first shipped (every trajectory of an update in one forward, no checkpointing)
    # the update alone needed ~112 GiB; the recipe now sets what makes it fit.
    recipe = load_recipe(QWEN_RECIPE)
    for gib in (24, 80):
        lines, chosen, refused = check_recipe(recipe, gib * GIB)
        assert refused is None and chosen.fits and chosen.plan.peak < gib * GIB
        assert any("fits" in line for line in lines)
    original = with_train_changes(recipe, {"train.gradient_checkpointing": False,
                                           "train.micro_batch_tokens": 32 * 2048})
    _, chosen, refused = check_recipe(original, 80 * GIB)
    assert refused is not None and "train.gradient_checkpointing: true" in refused
    assert chosen.plan.student["update"].peak > 100 * GIB


def test_the_fp32_heads_kept_copies_are_counted_where_they_live():
    # One float32 copy of each half-precision head weight, held all run long: in both of
    # the student's phases, and with the teacher's weights (it parks with them).
    recipe = load_recipe(QWEN_RECIPE)
    plan = check_recipe(recipe, 80 * GIB)[1].plan
    vocab = KNOWN_CONFIGS["Qwen/Qwen3-0.6B"]["vocab_size"]
    assert plan.student["update"].parts["fp32_head"] == vocab * 1024 * 4
    assert plan.student["rollout"].parts["fp32_head"] == vocab * 1024 * 4
    assert plan.teacher.parts["fp32_head"] == vocab * 2048 * 4
    off = recipe.model_copy(update={"loss": recipe.loss.model_copy(update={"fp32_head": False})})
    plain = check_recipe(off, 80 * GIB)[1].plan
    assert plan.peak - plain.peak == vocab * (1024 + 2048) * 4  # a resident phase holds both


def test_null_settings_are_chosen_to_fit():
    recipe = load_recipe(QWEN_RECIPE)
    open_recipe = with_train_changes(recipe, {"train.gradient_checkpointing": None,
                                              "train.micro_batch_tokens": None})
    lines, chosen, refused = check_recipe(open_recipe, 24 * GIB)
    assert refused is None and chosen.changes == {"train.gradient_checkpointing": True}
    assert any(line.startswith("memory plan (chosen: train.gradient_checkpointing: true)")
               for line in lines)


def test_a_recipe_that_cannot_fit_is_refused_naming_what_would():
    recipe = load_recipe(QWEN_RECIPE)
    _, chosen, refused = check_recipe(recipe, 8 * GIB)
    assert not chosen.fits
    assert refused.startswith("the memory plan needs") and "of 8.0 GiB" in refused
    assert "rollout.max_total_tokens" in refused and "teacher.quantization: nf4" in refused
    assert "\n" not in refused


def test_the_teacher_is_on_the_device_while_the_student_samples():
    # swap wakes the teacher before sampling (steps.sample) and, pipelined, the teacher
    # scores finished episodes while the rest are sampled: the rollout phase holds the
    # teacher's scoring peak under either strategy; serial, its weights only.
    recipe = load_recipe(QWEN_RECIPE)
    plan = check_recipe(recipe, 80 * GIB)[1].plan
    t, s_roll = plan.teacher, plan.student["rollout"].peak
    t_weights = t.parts["weights"] + t.parts["fp32_head"]
    assert plan.settings.pipelined and plan.memory == "resident"
    assert plan.peak == s_roll + t.peak + 2 * CUDA_OVERHEAD_BYTES  # the recipe's peak
    assert replace(plan, memory="swap").peak == plan.peak  # parking does not lower it
    serial = check_recipe(with_train_changes(recipe, {"train.pipelining": False}),
                          80 * GIB)[1].plan
    assert not serial.settings.pipelined
    assert serial.peak == s_roll + t_weights + 2 * CUDA_OVERHEAD_BYTES < plan.peak


def test_parking_is_chosen_only_where_it_lowers_the_peak():
    recipe = load_recipe(QWEN_RECIPE)  # teacher.memory: auto
    # The rollouts are the peak: between the serial and the pipelined peaks, no parking
    # fits; serial scoring does, and the refusal names it alone.
    pipelined = check_recipe(recipe, 80 * GIB)[1].plan.peak
    serial = check_recipe(with_train_changes(recipe, {"train.pipelining": False}),
                          80 * GIB)[1].plan.peak
    device = (pipelined + serial) // 2
    _, chosen, refused = check_recipe(recipe, device)
    assert not chosen.fits and "teacher.memory" not in chosen.changes
    assert refused.endswith("set train.pipelining: false"), refused
    # The update is the peak (no checkpointing, 16,384 tokens per micro-batch): parked
    # during updates, the teacher's weights leave it, and auto picks swap.
    heavy = with_train_changes(recipe, {"train.gradient_checkpointing": False})
    resident = check_recipe(heavy, 80 * GIB)[1].plan
    parked = replace(resident, memory="swap")
    assert parked.peak < resident.peak
    _, chosen, refused = check_recipe(heavy, (parked.peak + resident.peak) // 2)
    assert refused is None and chosen.changes == {"teacher.memory": "swap"}


@pytest.mark.parametrize("text,value", [("24GiB", 24 * GIB), ("80GB", 80 * 10**9),
                                        ("16384MiB", 16 * GIB), ("1024", 1024)])
def test_sizes_parse(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "24XB", "-3GiB", "GiB"])
def test_bad_sizes_are_one_line(text):
    with pytest.raises(ConfigError, match="is not a size; write it like 24GiB"):
        parse_bytes(text)


def test_validate_prints_the_plan_and_refuses_in_one_line(capsys):
    from typer.testing import CliRunner

    from miniverl.cli.app import app

    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(QWEN_RECIPE), "--device-memory", "24GiB"])
    assert ok.exit_code == 0, ok.output
    assert "memory plan (as written):" in ok.output and "of 24.0 GiB: fits" in ok.output
    bad = runner.invoke(app, ["validate", str(QWEN_RECIPE), "--device-memory", "8GiB"])
    assert bad.exit_code == 1
    errors = [line for line in bad.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the memory plan needs" in errors[0]
    worse = runner.invoke(app, ["validate", str(QWEN_RECIPE), "--device-memory", "lots"])
    assert worse.exit_code == 1 and "is not a size" in worse.output


def test_auto_teacher_memory_follows_the_plan(monkeypatch):
    import torch

    from miniverl.student.train.teacher.connect import memory_strategy

    recipe = load_recipe(QWEN_RECIPE)
    cuda = SimpleNamespace(type="cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (0, 80 * GIB))
    strategy, reason = memory_strategy(recipe, cuda)
    assert strategy == "resident" and reason.startswith("the memory plan fits")
    # An update that is the peak (no checkpointing): below its resident peak, parking the
    # teacher during updates is what fits.
    heavy = with_train_changes(recipe, {"train.gradient_checkpointing": False})
    resident = check_recipe(heavy, 80 * GIB)[1].plan
    assert replace(resident, memory="swap").peak < resident.peak - GIB // 2
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda device: (0, resident.peak - GIB // 2))
    strategy, reason = memory_strategy(heavy, cuda)
    assert strategy == "swap" and "parked during updates" in reason
    # Where nothing fits, auto does not say it fits (up and train refuse such a plan
    # before they ask).
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (0, 4 * GIB))
    strategy, reason = memory_strategy(heavy, cuda)
    assert "does not fit" in reason and "fits" not in reason.replace("does not fit", "")


def test_a_cuda_student_is_planned_before_its_weights_load(monkeypatch, tmp_path):
    import torch

    from miniverl.student.train import state as state_mod
    from tests.toy_kit import make_recipe

    recipe = make_recipe("sft", tmp_path)
    recipe = recipe.model_copy(update={"student": recipe.student.model_copy(
        update={"device": "cuda"})})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    events = []
    run = SimpleNamespace(event=lambda name, **kw: events.append((name, kw)))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (0, 16 * GIB))
    planned = state_mod.planned_for_device(recipe, run, offline=True)
    assert planned.train == recipe.train and events[0][0] == "memory_plan"
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (0, GIB // 4))
    with pytest.raises(ConfigError, match=r"cuda: the memory plan needs .* of 0\.2 GiB"):
        state_mod.planned_for_device(recipe, run, offline=True)


def test_what_the_plan_fills_in_is_the_runs_recorded_recipe_and_resume_keeps_it(monkeypatch,
                                                                                 tmp_path):
    import torch

    from miniverl.common.manifest import read_manifest
    from miniverl.common.recipe import recipe_digest
    from miniverl.student.train import state as state_mod
    from miniverl.student.train.trainer import open_run, recipe_changes
    from tests.toy_kit import make_recipe

    recipe = make_recipe("sft", tmp_path / "runs")
    recipe = recipe.model_copy(update={"student": recipe.student.model_copy(
        update={"device": "cuda"})})
    assert recipe.train.gradient_checkpointing is None and recipe.train.micro_batch_tokens is None
    written = check_recipe(recipe, 1024 * GIB)[1].plan.peak
    run, _ = open_run(recipe, "planned", False, None)
    submitted = run.recipe_path.read_text()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (0, written - 1))
    planned = state_mod.planned_for_device(recipe, run, offline=True)
    filled = check_recipe(recipe, written - 1)[1].changes
    assert filled and planned == with_train_changes(recipe, filled)
    # What ran is the run's resolved recipe and its digest; the submitted text stays.
    manifest = read_manifest(run)
    assert manifest["recipe_digest"] == recipe_digest(planned) != recipe_digest(recipe)
    assert manifest["memory_plan"] == {"filled": filled}
    assert recipe_changes(run.recipe(), planned) == []
    assert run.recipe_path.read_text() == submitted
    run.release()
    # A resume of the submitted recipe goes on with what the plan filled in.
    resumed_run, resumed = open_run(recipe, "planned", True, None)
    assert resumed == planned
    resumed_run.release()


def _with_engine(recipe, engine_memory):
    rollout = recipe.rollout.model_copy(update={"engine": "vllm", "engine_memory": engine_memory})
    return recipe.model_copy(update={"rollout": rollout})


def test_a_vllm_engines_share_of_the_device_is_counted_in_the_rollouts():
    recipe = load_recipe(QWEN_RECIPE)
    hf = check_recipe(recipe, 80 * GIB)[1].plan
    for share in (None, 0.5):
        lines, chosen, refused = check_recipe(_with_engine(recipe, share), 80 * GIB)
        rollout = chosen.plan.student["rollout"].parts
        # The engine takes its share (unset: 0.3) in place of the student's KV cache.
        assert rollout["engine"] == int((share or 0.3) * 80 * GIB) and "kv_cache" not in rollout
        assert chosen.plan.peak > rollout["engine"] + hf.teacher.parts["weights"]
        assert chosen.plan.student["update"] == hf.student["update"]  # it sleeps there
        assert refused is None and any("engine" in line for line in lines)
    # A share that leaves no room beside the trainer and the teacher is refused, naming it.
    _, chosen, refused = check_recipe(_with_engine(recipe, 0.9), 24 * GIB)
    assert not chosen.fits and "lower rollout.engine_memory" in refused


def _with_check(recipe, on, top_p=1.0):
    rollout = recipe.rollout.model_copy(update={"engine_check": on, "top_p": top_p})
    return recipe.model_copy(update={"rollout": rollout})


def test_the_engines_logprob_check_is_counted_after_sampling_while_the_teacher_scores():
    # A share of 0.02 (1.6 GiB): the check's phase, not the rollouts', is the device's peak.
    recipe = _with_engine(load_recipe(QWEN_RECIPE), 0.02)
    off = check_recipe(_with_check(recipe, False), 80 * GIB)[1].plan
    assert "check" not in off.student
    lines, chosen, _ = check_recipe(recipe, 80 * GIB)  # engine_check null: on
    plan = chosen.plan
    check = plan.student["check"].parts
    # One episode of 2,048 tokens, each one counted as sampled: three float32
    # [2048, 151936] copies (3.5 GiB) and a no-grad forward; the engine is asleep, so its
    # share is not there.
    assert check["logprob_check"] == 3 * 2048 * 151_936 * 4 + 2048 * (3 * 3072 + 2 * 1024) * 2
    assert "engine" not in check and check["weights"] == plan.student["rollout"].parts["weights"]
    scoring = plan.student["check"].peak + plan.teacher.peak + 2 * CUDA_OVERHEAD_BYTES
    assert plan.peak == max(scoring, off.peak) and plan.peak > off.peak
    assert plan.student["update"] == off.student["update"]
    assert any(line.strip().startswith("student check") for line in lines)
    # Top-p's sort and masks double the copies.
    nucleus = check_recipe(_with_check(recipe, None, top_p=0.9), 80 * GIB)[1].plan
    assert nucleus.student["check"].parts["logprob_check"] - check["logprob_check"] \
        == 4 * 2048 * 151_936 * 4


@pytest.mark.slow
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_the_checks_float32_copies_are_the_cpus_measured_peak(top_p):
    # logprob_gap over one episode of a model whose forward is its float32 logits at every
    # position (the logits it keeps: each one sampled, the check's most),
    # in a child process (glibc hands freed tensors back at once): its peak resident
    # memory above its footing, in [T, V] float32 copies.
    code = f"""
import sys, types, torch
from miniverl.student.rollout.vllm_engine import logprob_gap
T, V = 256, 151936
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
    def forward(self, input_ids, logits_to_keep):
        return types.SimpleNamespace(logits=torch.randn(1, len(logits_to_keep), V))
class Episode:
    tokens, sampling_logprobs = list(range(T)), [-1.0] * (T - 1)
    def target_positions(self):
        return list(range(T - 1))
def hwm():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
model = Model()
before = hwm()
logprob_gap(model, [Episode()], temperature=1.0, top_p={top_p})
print((hwm() - before) / (T * V * 4))
"""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout
    copies = CHECK_COPIES if top_p == 1.0 else CHECK_COPIES_TOP_P
    assert 0.9 * copies <= float(out) <= 1.1 * copies, out


def test_an_engine_share_too_small_for_the_weights_and_one_episode_is_refused(capsys):
    # Qwen3-0.6B in bf16 (1.11 GiB) and one episode's KV cache (2,048 tokens x 28 layers
    # x 2 x 8 heads x 128 x 2 bytes, 0.22 GiB): 1.33 GiB, 0.02 of 80 GiB.
    recipe = load_recipe(QWEN_RECIPE)
    _, chosen, _ = check_recipe(_with_engine(recipe, 0.02), 80 * GIB)
    assert engine_needs(chosen.plan.shape, chosen.plan.settings) == 1_426_980_864
    assert engine_refusal(chosen.plan, 80 * GIB) is None
    _, _, refused = check_recipe(_with_engine(recipe, 0.01), 80 * GIB)
    assert refused.startswith("rollout.engine_memory gives the vLLM engine 0.80 GiB")
    assert refused.endswith("set rollout.engine_memory: 0.02 or more")
    # A device too small for any share names the hf engine.
    _, _, refused = check_recipe(_with_engine(recipe, 0.9), GIB)
    assert refused.endswith("no share of this device holds them: set rollout.engine: hf")


def _cuda_of(monkeypatch, total: int) -> None:
    """torch sees one CUDA device of ``total`` bytes (no CUDA here)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(total_memory=total))


def test_a_cpu_student_is_not_planned_by_up(monkeypatch):
    import glob

    import torch

    from miniverl.common import memory_plan

    def asked(*args):
        raise AssertionError("torch was asked about CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", asked)
    monkeypatch.setattr(glob, "glob", lambda pattern: [])  # no NVIDIA device node
    assert memory_plan.cuda_total_bytes("cpu") is None
    assert memory_plan.cuda_total_bytes("auto") is None
    _cuda_of(monkeypatch, 8 * GIB)
    monkeypatch.setattr(glob, "glob", lambda pattern: ["/dev/nvidia0"])
    assert memory_plan.cuda_total_bytes("auto") == memory_plan.cuda_total_bytes("cuda:0") \
        == 8 * GIB


def test_up_refuses_a_plan_that_cannot_fit_before_starting_anything(monkeypatch, tmp_path,
                                                                    capsys):
    import subprocess

    from miniverl.cli.app import run
    from miniverl.cli.supervisor import Supervisor

    def no_process(*args, **kwargs):
        raise AssertionError(f"up started a process: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    recipe = load_recipe(QWEN_RECIPE)
    both = check_recipe(recipe, GIB)[1].plan.peak  # the least the plan can do with both
    alone = check_recipe(recipe.model_copy(update={"teacher": recipe.teacher.model_copy(
        update={"endpoint": "tcp://127.0.0.1:5555"})}), GIB)[1].plan.peak
    assert alone < both
    _cuda_of(monkeypatch, (alone + both) // 2)
    runs = tmp_path / "runs"
    assert run(["up", str(QWEN_RECIPE), "--output-dir", str(runs)]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: cuda: the memory plan needs")
    assert not runs.exists()
    # A teacher attached to elsewhere is not on this device: the student alone fits.
    Supervisor(QWEN_RECIPE, output_dir=str(runs), teacher="tcp://127.0.0.1:5555")
    _cuda_of(monkeypatch, 80 * GIB)
    Supervisor(QWEN_RECIPE, output_dir=str(runs))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "smollm2"])
def test_plan_is_within_15_percent_of_the_cpus_measured_peak(arch):
    # Two updates of a 4-layer model with the real vocabulary in a child process; its
    # peak resident memory above its footing against the plan's student update peak.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import memory_plan_check

    row = memory_plan_check.run_case(arch, checkpointing=False)
    assert 0.85 <= row["predicted_over_measured"] <= 1.15, row


def test_trackers_log_the_digest_of_the_recipe_the_plan_filled_in(monkeypatch, tmp_path):
    # The trackers open after the plan has filled in what the recipe left null: the
    # digest they record is the run's (the manifest's), not the submitted recipe's.
    import torch

    from miniverl.common.manifest import read_manifest
    from miniverl.common.recipe import recipe_digest
    from miniverl.student import trackers as trackers_mod
    from miniverl.student.train import trainer as trainer_mod
    from tests.toy_kit import make_recipe

    recipe = make_recipe("sft", tmp_path / "runs")
    recipe = recipe.model_copy(update={"student": recipe.student.model_copy(
        update={"device": "cuda"})})
    written = check_recipe(recipe, 1024 * GIB)[1].plan.peak
    logged = {}

    def opened(run, planned):
        logged["digest"] = trackers_mod.run_config(run, planned)["recipe_digest"]
        logged["recipe"] = planned
        raise RuntimeError("stop before the model loads")

    monkeypatch.setattr(trainer_mod, "open_trackers", opened)
    with trainer_mod.Trainer(recipe, run_id="tracked", offline=True,
                             show_progress=False) as trainer:
        # A CUDA device whose memory the plan fills micro-batches and checkpointing for.
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (0, written - 1))
        with pytest.raises(RuntimeError, match="stop before"):
            trainer.train()
    assert logged["recipe"] != recipe  # the plan filled something in
    assert logged["digest"] == read_manifest(trainer.run)["recipe_digest"] \
        == recipe_digest(logged["recipe"]) != recipe_digest(recipe)


def test_docs_gpu_prints_the_qwen_recipes_plan():
    # docs/gpu.md's "The Qwen recipe" paragraph: each figure is the plan's, at one decimal.
    from miniverl.common.memory_plan import check_bytes

    text = " ".join((ROOT / "docs" / "gpu.md").read_text().split())
    recipe = load_recipe(QWEN_RECIPE)
    first = check_recipe(with_train_changes(recipe, {"train.gradient_checkpointing": False,
                                                     "train.micro_batch_tokens": 32 * 2048}),
                         80 * GIB)[1].plan
    first = replace(first, memory="resident")
    now = check_recipe(recipe, 24 * GIB)[1].plan
    null = check_recipe(with_train_changes(recipe, {"train.gradient_checkpointing": None,
                                                    "train.micro_batch_tokens": None}),
                        24 * GIB)[1].plan
    serial = check_recipe(with_train_changes(recipe, {"train.pipelining": False}),
                          24 * GIB)[1].plan
    check = check_recipe(_with_engine(recipe, 0.3), 80 * GIB)[1].plan
    check_copies = (check.student["check"].parts["logprob_check"]
                    - check.shape.no_grad_forward_bytes(2048, 2))

    def gib(value: int) -> str:
        return f"{value / GIB:.1f} GiB"

    said = [
        f"student's update {gib(first.student['update'].peak)} and the device {gib(first.peak)}",
        f"update is {gib(now.student['update'].peak)}",
        f"the rollouts {gib(now.student['rollout'].peak)} "
        f"({gib(now.student['rollout'].parts['kv_cache'])} of KV cache)",
        f"the teacher {gib(now.teacher.peak)}",
        f"copy {gib(now.teacher.parts['fp32_head'])} of it",
        f"the device {gib(now.peak)}, teacher resident",
        f"checkpointing alone ({gib(null.peak)} on 24 GiB)",
        f"the device needs {gib(serial.peak)}",
        f"{gib(check_copies)} at the Qwen recipe's",
    ]
    assert check_bytes(check.shape, check.settings) == check.student["check"].parts[
        "logprob_check"]
    missing = [phrase for phrase in said if phrase not in text]
    assert not missing, missing
