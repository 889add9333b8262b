"""Fixtures for the bridge tests: a synthetic run directory shaped like the trainer's.

The run has a toy Qwen3 student, a LoRA adapter saved by peft's ``save_pretrained`` under
``checkpoints/step_N/adapter`` (two steps, so "latest" is tested), the toy tokenizer
beside the base model, ``recipe.resolved.yaml`` valid for common/recipe.py and a
manifest. Built once per session; tests copy nothing into it. ``prepared_run`` is the
same run as if its teacher had been a prepared directory in the cache (``teacher.prepare``).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.toy_kit import ONE_LAYER

# Student and teacher are the same tiny shape, initialised from different seeds.
TOY = ONE_LAYER
RECIPE = {
    "schema_version": 1,
    "run": {"name": "toy-bridge", "mode": "opd", "seed": 3},
    "student": {
        "model": {"toy": {**TOY, "seed": 0}},
        "dtype": "float32",
        "device": "cpu",
        "lora": {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]},
    },
    "teacher": {
        "model": {"toy": {**TOY, "seed": 1}},
        "dtype": "float32",
        "device": "cpu",
    },
    "environment": {
        "name": "calculator",
        "difficulty": "mixed",
        "train_tasks": 12,
        "eval_tasks": 6,
        "test_tasks": 2,
    },
    "rollout": {"max_turns": 3, "max_new_tokens_per_turn": 64, "max_total_tokens": 1024},
    "loss": {"top_k": 8},
    "train": {"cycles": 4, "rollouts_per_cycle": 4, "lr": 1e-3, "save_every": 2, "eval_every": 2},
}


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory) -> Path:
    """A finished-looking LoRA run directory (see the module docstring)."""
    os.environ.setdefault("MINIVERL_CACHE", str(tmp_path_factory.mktemp("cache")))
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from miniverl.common.modeling import resolve_model_dir
    from miniverl.common.recipe import Recipe
    from miniverl.common.rundir import RunDir

    torch.set_num_threads(1)
    recipe = Recipe.model_validate(RECIPE)
    run = RunDir.create(tmp_path_factory.mktemp("runs"), recipe, run_id="toy-bridge-run")
    base_dir = resolve_model_dir(recipe.student.model)
    lora = recipe.student.lora
    for step in (2, 4):
        torch.manual_seed(step)
        base = AutoModelForCausalLM.from_pretrained(base_dir)
        model = get_peft_model(
            base,
            LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                target_modules=list(lora.target_modules),
                init_lora_weights=False,
            ),
        )
        model.save_pretrained(run.checkpoints_dir / f"step_{step}" / "adapter")
    run.event("eval", version=4, split="eval", success=0.5, n=6, by_difficulty={})
    run.set_status("running")
    run.set_status("completed")
    return run.path


@pytest.fixture(scope="session")
def toy_bundle(toy_run, tmp_path_factory) -> Path:
    """A verl bundle exported from ``toy_run`` (read-only for tests: copy before editing)."""
    from miniverl.bridge.bundle import export_verl

    out = tmp_path_factory.mktemp("bundles") / "bundle"
    export_verl(toy_run, out)
    return out


def prepared_teacher_dir(name: str, spec: dict) -> Path:
    """A prepared teacher in the cache, laid out as student/teacher_prep.py leaves it."""
    from miniverl.bridge import teacher_source
    from miniverl.common.toy import cache_root, toy_model_dir

    path = cache_root() / "teachers" / name
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(toy_model_dir(spec), path)
    (path / teacher_source.PREPARED_FILE).write_text(json.dumps({
        "prep_recipe": "/home/someone/lab/toy_cpu_opd_teacher.yaml",
        "prep_digest": "sha256:" + "ab" * 32, "steps": 40, "eval": {"success": 0.95},
        "wall_s": 12.0,
    }))
    (path / teacher_source.QUALIFICATION_FILE).write_text(json.dumps({
        "kind": "miniverl.teacher_qualification",
        "teacher": {"name": name, "model": str(path), "revision": None, "adapter_sha256": None},
        "model_dir": str(path), "model_dir_sha256": teacher_source.weights_digest(path),
        "split": "eval", "n": 6, "success": 0.95,
    }))
    return path


@pytest.fixture
def prepared_run(toy_run, tmp_path) -> tuple[Path, Path]:
    """``(run, prepared dir)``: toy_run's checkpoints in a run whose manifest says its
    teacher was a prepared directory in the cache (as `up` with teacher.prepare records)."""
    from miniverl.bridge.artifacts import load_run_recipe
    from miniverl.common.manifest import record_teacher
    from miniverl.common.rundir import RunDir

    recipe = load_run_recipe(toy_run)
    prepared = prepared_teacher_dir(
        "prepared-0123456789abcdef0123", recipe.teacher.model.toy.model_dump()
    )
    run = RunDir.create(tmp_path / "runs", recipe, run_id="prepared-run")
    shutil.copytree(toy_run / "checkpoints", run.checkpoints_dir, dirs_exist_ok=True)
    run.event("teacher_prepared", cached=True, model_dir=str(prepared), steps=40,
              eval_success=0.95)
    record_teacher(run, 0, {"name": prepared.name, "model": str(prepared), "revision": None,
                            "adapter_sha256": None}, "hello")
    return run.path, prepared


# A mixture of two environments (weights 2:1, rows 1:1), for bundles of several
# environments; TEACHERS routes each to its own toy teacher (seeds 1 and 2).
MIXTURE = [
    {"name": "calculator", "weight": 2, "difficulty": "easy", "train_tasks": 6,
     "eval_tasks": 3, "test_tasks": 2},
    {"name": "jsonnav", "weight": 1, "difficulty": "easy", "train_tasks": 6,
     "eval_tasks": 3, "test_tasks": 2},
]
TEACHERS = {"calc": {**RECIPE["teacher"], "model": {"toy": {**TOY, "seed": 1}}},
            "nav": {**RECIPE["teacher"], "model": {"toy": {**TOY, "seed": 2}}}}


def mixture_recipe(teachers: bool, mixture: list[dict] | None = None) -> dict:
    """RECIPE with MIXTURE instead of one environment; ``teachers``: each environment
    routed to its own teacher of TEACHERS (calculator -> calc, jsonnav -> nav)."""
    data = copy.deepcopy({k: v for k, v in RECIPE.items() if k != "environment"})
    members = [dict(m) for m in (mixture or MIXTURE)]
    if teachers:
        del data["teacher"]
        data["teachers"] = copy.deepcopy(TEACHERS)
        for member, name in zip(members, ("calc", "nav"), strict=False):
            member.setdefault("teacher", name)
    return {**data, "environments": members}


def make_run(toy_run: Path, root: Path, recipe_data: dict, run_id: str) -> Path:
    """A run of ``recipe_data`` holding toy_run's checkpoints (and its last eval)."""
    from miniverl.common.recipe import Recipe
    from miniverl.common.rundir import RunDir

    run = RunDir.create(root, Recipe.model_validate(recipe_data), run_id=run_id)
    shutil.copytree(toy_run / "checkpoints", run.checkpoints_dir, dirs_exist_ok=True)
    run.set_status("running")
    run.set_status("completed")
    return run.path


@pytest.fixture(scope="session")
def mixture_run(toy_run, tmp_path_factory) -> Path:
    """toy_run's weights in a run of a mixture with one teacher."""
    return make_run(toy_run, tmp_path_factory.mktemp("mix-runs"), mixture_recipe(False),
                    "mixture-run")


@pytest.fixture(scope="session")
def two_teacher_run(toy_run, tmp_path_factory) -> Path:
    """toy_run's weights in a run of a mixture routed to two teachers (calc, nav)."""
    return make_run(toy_run, tmp_path_factory.mktemp("two-runs"), mixture_recipe(True),
                    "two-teacher-run")
