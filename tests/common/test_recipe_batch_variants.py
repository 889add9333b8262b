"""Recipe rules of the batch-side variants and the sampled eval: each misplaced or
impossible value is one line naming the value, the rule and the fix.

A user sweeping GKD's lambda, group sizes or SeqKD relies on a field that would be
ignored, or a batch that would not mix, being refused before anything runs.
"""

from __future__ import annotations

import pytest
import yaml

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe, loads_recipe


def base(mode: str = "offline_kd", *, teacher: bool = True, **sections) -> dict:
    data = {"run": {"name": "t", "mode": mode},
            "student": {"model": {"toy": {}}, "device": "cpu"}, **sections}
    if teacher:
        data["teacher"] = {"model": {"toy": {}}, "device": "cpu"}
    return data


def line(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        loads_recipe(yaml.safe_dump(data), "r.yaml")
    (only,) = str(info.value).splitlines()
    return only


@pytest.mark.parametrize(("data", "where", "fix"), [
    (base(train={"on_policy_fraction": 0.5}, run={"name": "t", "mode": "opd"}),
     "train.on_policy_fraction", "set run.mode: offline_kd"),
    (base(train={"on_policy_fraction": 1.0}), "train.on_policy_fraction", "set run.mode: opd"),
    (base(train={"on_policy_fraction": 0.05}), "train.on_policy_fraction",
     "rounds to 0 fresh episodes"),
    (base(train={"on_policy_fraction": 0.5, "fixed_set": "student"}),
     "train.on_policy_fraction", "mix with fixed_set oracle or teacher"),
    (base(train={"on_policy_fraction": 1.5}), "train.on_policy_fraction", "less than or equal"),
    (base("opd", train={"fixed_set": "teacher"}), "train.fixed_set", "offline_kd or sft"),
    (base("sft", teacher=False, train={"fixed_set": "teacher"}), "train.fixed_set",
     "add a teacher section"),
    (base("opd", rollout={"group_size": 3}), "train.rollouts_per_cycle",
     "make rollouts_per_cycle a multiple of it"),
    (base("offline_kd", rollout={"group_size": 2}), "rollout.group_size", "remove it"),
    (base("dpo", rollout={"group_size": 1}), "dpo.group_size", "raise it to 2 or more"),
    (base("dpo", rollout={"group_size": 2}, dpo={"group_size": 4}), "dpo.group_size",
     "keep one of them"),
    (base("opd", eval={"temperature": 1.0}), "eval.temperature", "set samples: N"),
    (base("opd", eval={"samples": 0}), "eval.samples", "greater than or equal to 1"),
])
def test_bad_values_are_one_line_with_the_fix(data, where, fix):
    got = line(data)
    assert got.startswith("r.yaml:") and where in got and fix in got, got


def test_good_values_validate():
    assert Recipe.model_validate(base(train={"on_policy_fraction": 0.5})).train.on_policy_fraction
    assert Recipe.model_validate(base(train={"on_policy_fraction": 0.0}))
    assert Recipe.model_validate(base("sft", train={"fixed_set": "teacher"}))
    assert Recipe.model_validate(base(train={"fixed_set": "teacher", "on_policy_fraction": 0.25}))
    # dpo's recipes stay valid; rollout.group_size may replace dpo.group_size.
    assert Recipe.model_validate(base("dpo", dpo={"group_size": 4}))
    assert Recipe.model_validate(base("dpo", rollout={"group_size": 2}))
    assert Recipe.model_validate(base("replay", rollout={"group_size": 2},
                                      train={"max_lag": 1}))
    assert Recipe.model_validate(base("sft", teacher=False, eval={"samples": 4,
                                                                  "temperature": 0.7}))


def test_validate_plans_name_the_batch_variants():
    from miniverl.cli.foundation import plan_lines  # what `miniverl validate` prints

    gkd = base(train={"fixed_set": "oracle", "on_policy_fraction": 0.5})
    seqkd = base("sft", train={"fixed_set": "teacher"}, eval={"samples": 4})
    grouped = base("opd", rollout={"group_size": 4})
    expected = {
        "gkd": ["batches      GKD mixing: 4 fresh of 8 per batch, 4 from the fixed set"],
        "seqkd": ["mode         sft (SeqKD: supervised on the teacher's own episodes",
                  "batches      SeqKD on the teacher's own episodes of the 256 training tasks",
                  "eval         greedy, and 4 samples per task at T=1"],
        "grouped": ["batches      2 tasks x 4 episodes per batch"],
    }
    for name, data in (("gkd", gkd), ("seqkd", seqkd), ("grouped", grouped)):
        plan = "\n".join(plan_lines(Recipe.model_validate(data)))
        assert all(want in plan for want in expected[name]), plan
    assert not any(line.startswith(("batches", "eval ")) for line in plan_lines(
        Recipe.model_validate(base("opd"))))
