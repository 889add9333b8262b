"""The loss variants' recipe rules: the rollout and the loss temperatures are tied where
the student's samples are trained on (one line naming both values and the fix), a
variant field set where nothing reads it is an error, the task reward needs episodes
that have a baseline, and unset variants leave every recipe digest as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from miniverl.cli.app import run
from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe, loads_recipe, recipe_dict, recipe_digest
from miniverl.common.recipe_sections import LOSS_VARIANT_FIELDS
from miniverl.testing.toy_recipe import recipe_dict as toy_recipe

ROOT = Path(__file__).resolve().parents[2]
SAMPLED = {"estimator": "sampled_token", "divergence": "reverse_kl"}


def _data(mode="opd", loss=None, rollout=None, **train):
    return toy_recipe(mode, "runs", sections={"loss": loss or {}, "rollout": rollout or {}},
                      **train)


def _error(data) -> str:
    with pytest.raises(ConfigError) as info:
        loads_recipe(yaml.safe_dump(data), "r.yaml")
    return str(info.value)


@pytest.mark.parametrize("loss", [SAMPLED, {**SAMPLED, "importance_ratio_cap": 2.0},
                                  {"use_task_rewards": True, "reward_baseline": "batch"}])
def test_a_sampled_estimator_at_another_temperature_is_one_line_naming_both(loss):
    # The estimator's gradient is unbiased only for tokens drawn at the loss temperature.
    message = _error(_data(loss={**loss, "temperature": 1.0}, rollout={"temperature": 0.7}))
    (line,) = message.splitlines()
    assert "loss.temperature 1 and rollout.temperature 0.7 differ" in line
    assert line.endswith("set both to the same value")
    # Even the flag for full-distribution losses does not allow it.
    flagged = {**loss, "temperature": 1.0, "allow_temperature_mismatch": True}
    assert "differ" in _error(_data(loss=flagged, rollout={"temperature": 0.7}))


def test_a_full_loss_at_another_temperature_needs_the_flag():
    data = _data(loss={"temperature": 2.0})
    assert "loss.allow_temperature_mismatch: true if that is on purpose" in _error(data)
    assert Recipe.model_validate(_data(loss={"temperature": 2.0,
                                             "allow_temperature_mismatch": True}))
    # Where the student's samples are not trained on, the temperatures are unrelated.
    assert Recipe.model_validate(_data("offline_kd", loss={"temperature": 2.0}))
    # A frozen student set is sampled at rollout.temperature too.
    refused = _error(_data("offline_kd", loss={"temperature": 2.0}, fixed_set="student"))
    assert refused.startswith("r.yaml") and "train.fixed_set: fixed_set student:" in refused


def test_a_sampled_estimator_refuses_a_truncated_sampler():
    assert "rollout.top_p 0.9 truncates it" in _error(_data(loss=SAMPLED,
                                                            rollout={"top_p": 0.9}))


@pytest.mark.parametrize("loss,needle", [
    ({"log_ratio_clamp": 5.0}, "loss.log_ratio_clamp: log_ratio_clamp 5 clamps"),
    ({"importance_ratio_cap": 2.0}, "loss.importance_ratio_cap: importance_ratio_cap 2 weighs"),
    ({"reward_baseline": "batch"}, "set use_task_rewards: true or remove reward_baseline"),
    ({"distillation_loss_coef": 0.5}, "remove distillation_loss_coef"),
    ({**SAMPLED, "importance_ratio_cap": 0.5}, "importance_ratio_cap"),  # a cap below 1
])
def test_a_variant_field_nothing_reads_is_an_error(loss, needle):
    assert needle in _error(_data(loss=loss))


def test_task_rewards_need_the_students_episodes_and_a_baseline():
    reward = {"use_task_rewards": True}
    assert "mode 'offline_kd' does not train on" in _error(_data("offline_kd", loss=reward))
    assert "rollout.group_size is unset" in _error(_data(loss=reward))
    replay = _data("replay", loss=reward, max_lag=1)
    assert "set reward_baseline: batch" in _error(replay)
    assert Recipe.model_validate(_data(loss={**reward, "reward_baseline": "batch"}))
    assert Recipe.model_validate(_data("replay", loss={**reward, "reward_baseline": "batch"},
                                       max_lag=1))


def test_unset_variants_leave_the_digest_and_set_ones_count():
    recipe = Recipe.model_validate(_data())
    data = recipe_dict(recipe)
    assert all(data["loss"][name] is None for name in LOSS_VARIANT_FIELDS)
    for name, value in (("importance_ratio_cap", 2.0), ("log_ratio_clamp", 5.0),
                        ("aggregation", "sequence")):
        loss = {**SAMPLED, name: value}
        changed = Recipe.model_validate(_data(loss=loss))
        assert recipe_digest(changed) != recipe_digest(Recipe.model_validate(_data(loss=SAMPLED)))


def test_the_shipped_sampled_token_recipe_validates_and_its_plan_names_the_variants(capsys):
    # recipes/toy_cpu_opd_sampled_token.yaml is the recipe docs/losses.md points to.
    assert run(["validate", str(ROOT / "recipes" / "toy_cpu_opd_sampled_token.yaml")]) == 0
    assert ("variants     sampled-token estimator; importance ratio capped at 2; log-ratio "
            "clamped to +-10") in capsys.readouterr().out


def test_a_group_baseline_with_groups_and_gkd_mixing_are_checked_too():
    grouped = _data(loss={"use_task_rewards": True}, rollout={"group_size": 2})
    assert Recipe.model_validate(grouped).loss.reward_baseline is None  # null = group
    # GKD's fresh share is sampled at rollout.temperature as well.
    mixed = _data("offline_kd", loss={"temperature": 2.0}, on_policy_fraction=0.5)
    assert "train.on_policy_fraction: on_policy_fraction 0.5: loss.temperature 2" in _error(mixed)
