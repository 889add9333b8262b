"""A recipe's mixture of environments (``environments:``): it validates beside every
other rule, round-trips through its resolved dump, leaves a single-environment recipe's
digest alone, and each bad mixture is refused with one line naming the field and the
fix, by ``miniverl validate`` too (exit 1, no traceback)."""

from __future__ import annotations

import copy

import pytest
import yaml
from typer.testing import CliRunner

from miniverl.cli.app import app
from miniverl.common.errors import ConfigError
from miniverl.common.recipe import dump_resolved, loads_recipe, recipe_dict, recipe_digest
from tests.toy_kit import recipe_dict as toy_recipe

MIX = [{"name": "calculator", "weight": 2, "train_tasks": 8, "eval_tasks": 2},
       {"name": "sqlite", "weight": 1, "difficulty": "mixed", "train_tasks": 4, "eval_tasks": 2}]


def _mixture(tmp_path, mode="rl", environments=MIX, **sections):
    data = toy_recipe(mode, tmp_path, teacher=None if mode == "rl" else
                      toy_recipe("opd", tmp_path)["teacher"]["model"]["toy"],
                      sections={"rollout": {"group_size": 2}} if mode == "rl" else None)
    del data["environment"]
    data["environments"] = copy.deepcopy(environments)
    for name, update in sections.items():
        data.setdefault(name, {}).update(update)
    return data


def test_a_mixture_validates_and_its_resolved_dump_loads_back(tmp_path):
    recipe = loads_recipe(yaml.safe_dump(_mixture(tmp_path)))
    assert [(e.name, e.weight) for e in recipe.environments] == [("calculator", 2.0),
                                                                 ("sqlite", 1.0)]
    assert recipe.environments[1].difficulty == "mixed"
    # recipe.resolved.yaml names the mixture alone, so it loads back as the same recipe.
    assert "environment" not in recipe_dict(recipe)
    again = loads_recipe(dump_resolved(recipe))
    assert again == recipe and recipe_digest(again) == recipe_digest(recipe)


def test_a_single_environment_recipe_keeps_its_digest(tmp_path):
    # Checkpoints and cached teachers are keyed by the digest: the new field, unset,
    # must not move it.
    recipe = loads_recipe(yaml.safe_dump(toy_recipe("rl", tmp_path, teacher=None,
                                                    sections={"rollout": {"group_size": 2}})))
    assert recipe.environments is None
    assert recipe_digest(recipe) == recipe_digest(recipe, leave_out=("environments",))


def test_a_mixture_keeps_its_digest_beside_the_unset_route_fields(tmp_path, monkeypatch):
    # environments[].teacher and .adapter and the top-level teachers (several teachers)
    # came after mixtures were hashed: unset, the digest is what it was without them.
    from miniverl.common import recipe as recipe_module

    recipe = loads_recipe(yaml.safe_dump(_mixture(tmp_path)))
    digest = recipe_digest(recipe)
    dump = recipe_module.recipe_dict

    def as_before(r):
        data = dump(r)
        assert data.pop("teachers") is None
        for member in data["environments"]:
            assert member.pop("teacher") is None and member.pop("adapter") is None
        return data

    monkeypatch.setattr(recipe_module, "recipe_dict", as_before)
    assert recipe_digest(recipe) == digest


@pytest.mark.parametrize(("edit", "where", "words"), [
    ({"environment": {"name": "calculator"}}, "environments:",
     "keep one: environment for one, environments"),
    ({"environments": [{"name": "calculator", "weight": 0}, {"name": "sqlite", "weight": 0}]},
     "environments:", "the weights sum to 0"),
    ({"environments": [{"name": "calculator", "weight": float("inf")}]},
     "environments[0].weight:", "finite number"),
    ({"environments": [{"name": "calculator", "weight": float("nan")}]},
     "environments[0].weight:", "finite number"),
    ({"environments": [{"name": "calculator", "weight": -1}]},
     "environments[0].weight:", "greater than or equal to 0"),
    ({"environments": [{"name": "calculator"}, {"name": "calculator", "weight": 3}]},
     "environments[1].name:", "name each environment once"),
    ({"environments": []}, "environments:", "at least 1 item"),
    ({"environments": [{"name": "calculator", "wieght": 2}]}, "environments[0].wieght:",
     "unknown field 'wieght'"),
])
def test_a_bad_mixture_is_one_line_naming_the_field(tmp_path, edit, where, words):
    data = _mixture(tmp_path)
    data.update(edit)
    with pytest.raises(ConfigError) as caught:
        loads_recipe(yaml.safe_dump(data))
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and where in lines[0] and words in lines[0], lines


@pytest.mark.parametrize(("mode", "teacher", "words"), [
    ("opd", {"min_success": 0.5}, "teacher.min_success"),
    ("opd", {"min_recovery": 0.5}, "teacher.min_recovery"),
    ("opd", {"mode": "privileged_context"}, "teacher.mode 'privileged_context'"),
    ("offline_kd", {}, "mode 'offline_kd' reads one environment's tasks"),
])
def test_a_mixture_where_one_environment_is_read_is_refused(tmp_path, mode, teacher, words):
    data = _mixture(tmp_path, mode=mode)
    if mode == "sft":
        data.pop("teacher", None)
    else:
        data["teacher"].update(teacher)
    with pytest.raises(ConfigError, match="use environment: with one environment") as caught:
        loads_recipe(yaml.safe_dump(data))
    assert words in str(caught.value)


def test_one_teacher_with_another_tokenizer_may_score_a_mixture(tmp_path):
    # Each episode is rendered with its own environment's tools (student/train/teacher/xvocab.py), so
    # one teacher of another tokenizer scores every member of a mixture.
    data = _mixture(tmp_path, mode="opd", loss={"estimator": "sampled_token",
                                                "divergence": "reverse_kl"})
    data["teacher"]["tokenizer"] = "other"
    assert loads_recipe(yaml.safe_dump(data)).teacher.tokenizer == "other"


def test_both_ways_at_once_still_reports_every_other_problem(tmp_path):
    # One `validate` shows every problem, this one beside the others.
    data = _mixture(tmp_path, environment={"name": "calculator"}, train={"lr": -1})
    with pytest.raises(ConfigError) as caught:
        loads_recipe(yaml.safe_dump(data))
    lines = str(caught.value).splitlines()
    assert len(lines) == 2
    assert "environments: environment and environments both name" in lines[0]
    assert "train.lr:" in lines[1]


def test_sft_and_the_warm_up_take_a_mixtures_oracle_traces_but_not_one_environments_set(
        tmp_path):
    # Oracle traces of a mixture are drawn by weight, each played in its environment
    # (tests/student/train/test_mixture_run.py); what counts or plays one environment's
    # set, or shows one environment's privileged view, stays with environment:.
    data = _mixture(tmp_path, mode="opd", train={"sft_warmup_steps": 2})
    assert loads_recipe(yaml.safe_dump(data)).train.sft_warmup_steps == 2
    sft = _mixture(tmp_path, mode="sft")
    sft.pop("teacher", None)
    assert loads_recipe(yaml.safe_dump(sft)).run.mode == "sft"
    for train, words in (({"oracle_tasks": 4}, "train.oracle_tasks: oracle_tasks 4 counts one "
                          "environment's first tasks"),
                         ({"fixed_set": "oracle"}, "train.fixed_set: fixed_set 'oracle' plays "
                          "or reads one environment's set")):
        bad = _mixture(tmp_path, mode="opd", train={"sft_warmup_steps": 2, **train})
        with pytest.raises(ConfigError, match=words):
            loads_recipe(yaml.safe_dump(bad))
    view = {**sft, "rollout": {**sft.get("rollout", {}), "view": "privileged_context"}}
    with pytest.raises(ConfigError, match="rollout.view privileged_context prepares one "
                                          "privileged teacher of one environment"):
        loads_recipe(yaml.safe_dump(view))


def test_validate_prints_one_line_and_exits_1(tmp_path):
    data = _mixture(tmp_path)
    data["environments"][1]["weight"] = -2
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "environments[1].weight" in errors[0]


def test_validate_checks_every_environment_and_plans_each(tmp_path):
    data = _mixture(tmp_path)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "calculator (easy, weight 2)" in result.output
    assert "sqlite (mixed, weight 1)" in result.output
    data["environments"][1]["name"] = "nosuch"
    good.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["validate", str(good)])
    assert result.exit_code == 1
    assert "environments[1].name: 'nosuch' is not a registered environment" in result.output
