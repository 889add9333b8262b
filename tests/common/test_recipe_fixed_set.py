"""Recipe rules of the recovery benchmark's fields: ``train.fixed_set`` and
``teacher.min_recovery``; both stay out of the digest while unset.

A user relies on a misplaced field being an error with its fix (not silently ignored),
and on a recipe that does not use the new fields keeping its digest (its prepared
teacher stays cached, its checkpoints still resume).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from miniverl.cli.app import run
from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe, loads_recipe, recipe_dict, recipe_digest
from miniverl.common.recipe_sections import LOSS_VARIANT_FIELDS


def base(mode: str = "offline_kd", **train) -> dict:
    return {
        "run": {"name": "t", "mode": mode},
        "student": {"model": {"toy": {}}, "device": "cpu"},
        "teacher": {"model": {"toy": {}}, "device": "cpu"},
        "train": train,
    }


def errors(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        loads_recipe(yaml.safe_dump(data), "r.yaml")
    return str(info.value).splitlines()


@pytest.mark.parametrize("value", ["oracle", "student"])
def test_fixed_set_is_an_offline_kd_source(value):
    assert Recipe.model_validate(base(fixed_set=value)).train.fixed_set == value
    (line,) = errors(base("opd", fixed_set=value))
    assert "train.fixed_set" in line and "set run.mode: offline_kd" in line


def test_fixed_set_with_trajectories_or_a_wall_budget_is_refused_with_the_fix():
    (line,) = errors(base(fixed_set="oracle", trajectories="t.jsonl"))
    assert "train.fixed_set" in line and "keep one of them" in line
    (line,) = errors(base(fixed_set="student", max_wall_s=60))
    assert "wall-time budget" in line and "remove max_wall_s" in line
    assert Recipe.model_validate(base(fixed_set="oracle", max_wall_s=60))
    assert "fixed_set" in " ".join(errors(base(fixed_set="teachers")))


@pytest.mark.parametrize("value", [-0.1, 1.5, "high"])
def test_min_recovery_is_a_rate(value):
    data = base()
    data["teacher"]["min_recovery"] = value
    assert any("teacher.min_recovery" in line for line in errors(data))


def test_unset_new_fields_leave_the_digest_as_it_was():
    recipe = Recipe.model_validate(base())
    data = recipe_dict(recipe)
    assert data["runtime"].pop("warmup_cpu_threads") is None
    assert data["rollout"].pop("view") is None
    # The batch-side variants and the sampled eval (tests/student/train/test_batch_variants.py).
    assert data["rollout"].pop("group_size") is None
    assert data["train"].pop("on_policy_fraction") is None
    assert data["eval"].pop("samples") is None and data["eval"].pop("temperature") is None
    assert data["eval"].pop("before") is None  # the benchmark's shared start eval
    # The loss variants (docs/losses.md).
    assert all(data["loss"].pop(name) is None for name in LOSS_VARIANT_FIELDS)
    # Scarce demonstrations and lazy fixed-set scoring (docs/distillbench.md).
    assert data["train"].pop("oracle_tasks") is None
    assert data["train"].pop("score_fixed_set") is None
    del data["train"]["fixed_set"], data["teacher"]["min_recovery"]
    assert data["teacher"].pop("tokenizer") is None  # cross-tokenizer opt-in (xvocab)
    assert data["loss"].pop("cross_vocab") is None  # its target (docs/cross-tokenizer.md)
    assert data.pop("environments") is None  # a mixture (docs/environments.md)
    # Several teachers (docs/several-teachers.md).
    assert data.pop("teachers") is None and data["teacher"].pop("adapters") is None
    # Precision and memory (docs/gpu.md), the sampling engine (docs/rollouts.md).
    assert data["loss"].pop("fp32_head") is None
    assert data["train"].pop("micro_batch_tokens") is None
    assert data["train"].pop("gradient_checkpointing") is None
    assert all(data["rollout"].pop(name) is None
               for name in ("engine", "engine_memory", "engine_check"))
    for side in ("student", "teacher"):  # the toy spec's optional fields, unset
        toy = data[side]["model"]["toy"]
        assert toy.pop("init_std") is None and toy.pop("rope_theta") is None
    before = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    assert recipe_digest(recipe) == "sha256:" + before.hexdigest()
    sft = Recipe.model_validate({"run": {"name": "t", "mode": "sft"},
                                 "student": {"model": {"toy": {}}}})
    assert recipe_digest(sft).startswith("sha256:")  # no teacher section: nothing to drop
    # Set, they count.
    data = base(fixed_set="student")
    data["teacher"]["min_recovery"] = 0.8
    assert recipe_digest(Recipe.model_validate(data)) != recipe_digest(recipe)
    threads = base()
    threads.setdefault("runtime", {})["warmup_cpu_threads"] = 2
    assert recipe_digest(Recipe.model_validate(threads)) != recipe_digest(recipe)
    viewed = {**base("sft"), "rollout": {"view": "privileged_context"}}
    assert recipe_digest(Recipe.model_validate(viewed)) != recipe_digest(
        Recipe.model_validate(base("sft")))


@pytest.mark.parametrize("mode", ["offline_kd", "opd", "replay", "dpo"])
def test_only_a_teachers_sft_preparation_plays_the_privileged_view(mode):
    # The privileged view shows the answer: a student trained on it learns nothing it can
    # use, so only an SFT run (preparing a privileged teacher) may set rollout.view.
    assert Recipe.model_validate({**base("sft"), "rollout": {"view": "privileged_context"}})
    (line,) = [e for e in errors({**base(mode), "rollout": {"view": "privileged_context"}})
               if "rollout.view" in e]
    assert "run.mode: sft" in line and f"not a {mode} run" in line


def test_validate_says_it_in_one_line_and_exits_1(tmp_path: Path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(base("opd", fixed_set="student")))
    assert run(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "train.fixed_set" in err and "Traceback" not in err
