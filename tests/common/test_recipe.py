"""Recipe schema: each rule, all errors at once with YAML locations, digests and diffs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import (
    Recipe,
    check_vocab,
    diff_recipes,
    dump_resolved,
    load_recipe,
    loads_recipe,
    recipe_digest,
    recipe_json_schema,
)

ROOT = Path(__file__).resolve().parents[2]
REV = "c1899de289a04d12100db370d81485cdf75e47ca"


def base() -> dict:
    return {
        "run": {"name": "t", "mode": "opd"},
        "student": {"model": {"toy": {}}, "device": "cpu"},
        "teacher": {"model": {"toy": {"hidden": 128}}, "device": "cpu"},
    }


def with_(**sections) -> dict:
    """``base()`` with ``section__field=value`` overrides, e.g. ``with_(train__lr=1e-3)``."""
    data = base()
    for dotted, value in sections.items():
        section, field = dotted.split("__")
        data.setdefault(section, {})[field] = value
    return data


def rule_error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        loads_recipe(yaml.safe_dump(data), "r.yaml")
    return str(info.value)


@pytest.mark.parametrize("name", ["toy_cpu_opd.yaml", "qwen3_opd_calculator.yaml"])
def test_shipped_recipes_validate(name):
    recipe = load_recipe(ROOT / "recipes" / name)
    assert recipe.run.mode == "opd" and recipe.on_policy
    assert recipe.train.updates_per_batch == 1


def test_shipped_recipes_are_short_and_open_with_their_command():
    # docs/design.md, "How the code is written": recipes open with the command that runs
    # them and stay within 80 lines.
    for path in (ROOT / "recipes").glob("*.yaml"):
        lines = path.read_text().splitlines()
        assert len(lines) <= 80, path
        assert lines[0] in (
            f"# miniverl up recipes/{path.name}",
            f"# miniverl train recipes/{path.name}",  # teacher preparation (sft)
        ), path


def test_defaults_fill_in():
    recipe = Recipe.model_validate(base())
    assert recipe.schema_version == 1
    assert recipe.loss.objective == "bucketed_topk_tail"
    assert recipe.runtime.cpu_threads == 1
    assert recipe.student.lora is not None


def test_strict_opd_takes_one_update_per_batch():
    msg = rule_error(with_(train__updates_per_batch=2))
    assert "train.updates_per_batch" in msg and "strict on-policy" in msg


def test_replay_needs_lag_and_opd_allows_none():
    data = with_(train__max_lag=0)
    data["run"]["mode"] = "replay"
    assert "train.max_lag" in rule_error(data)
    data["train"]["max_lag"] = 2
    Recipe.model_validate(data)
    assert "applies only to replay" in rule_error(with_(train__max_lag=1))


def test_replay_lag_covers_every_update_of_a_batch():
    # A user relies on `validate` catching what once failed only at Trainer start: with
    # 3 updates per batch the last one trains on targets 2 versions old, so max_lag 1
    # would silently drop (or, worse, train on) targets older than the recipe allows.
    data = with_(train__updates_per_batch=3, train__max_lag=1)
    data["run"]["mode"] = "replay"
    msg = rule_error(data)
    assert "r.yaml:" in msg and "train.updates_per_batch: updates_per_batch 3 with max_lag 1" in msg
    assert "2 versions old; raise max_lag to at least 2 or lower updates_per_batch" in msg
    data["train"]["max_lag"] = 2
    assert Recipe.model_validate(data).train.updates_per_batch == 3


def test_replay_lag_rule_is_reported_with_the_other_errors():
    data = with_(train__updates_per_batch=4, train__max_lag=1, train__lr=-1)
    data["run"]["mode"] = "replay"
    lines = rule_error(data).splitlines()
    assert len(lines) == 2
    assert any("train.lr" in line for line in lines)
    assert any("raise max_lag to at least 3" in line for line in lines)


@pytest.mark.parametrize("mode", ["opd", "replay", "offline_kd", "dpo"])
def test_teacher_modes_need_a_teacher(mode):
    data = base()
    del data["teacher"]
    data["run"]["mode"] = mode
    if mode == "replay":
        data["train"] = {"max_lag": 1}
    assert "needs a teacher section" in rule_error(data)


def test_sft_needs_no_teacher():
    data = base()
    del data["teacher"]
    data["run"]["mode"] = "sft"
    assert Recipe.model_validate(data).teacher is None


def test_quantization_needs_cuda_or_opt_in():
    msg = rule_error(with_(student__quantization="nf4"))
    assert "student.quantization" in msg and "allow_cpu_quantization" in msg
    Recipe.model_validate(with_(student__quantization="int8", student__allow_cpu_quantization=True))
    Recipe.model_validate(with_(teacher__quantization="nf4", teacher__device="cuda:0"))


def test_total_tokens_exceed_turn_tokens():
    msg = rule_error(with_(rollout__max_new_tokens_per_turn=256, rollout__max_total_tokens=256))
    assert "rollout.max_total_tokens" in msg


def test_rollout_fits_toy_positions():
    data = with_(rollout__max_total_tokens=2048)
    assert "max_positions" in rule_error(data)


def test_hub_id_needs_pinned_revision():
    assert "pinned revision" in rule_error(with_(student__model={"hub_id": "Qwen/Qwen3-0.6B"}))
    bad = rule_error(with_(student__model={"hub_id": "Qwen/Qwen3-0.6B", "revision": "main"}))
    assert "student.model.revision" in bad
    Recipe.model_validate(with_(student__model={"hub_id": "Qwen/Qwen3-0.6B", "revision": REV}))


def test_model_source_is_exactly_one():
    msg = rule_error(with_(student__model={"path": "/m", "toy": {}}))
    assert "exactly one of path, hub_id, gguf or toy" in msg


def test_a_prepared_teacher_takes_no_adapter():
    # The prepared directory is served as merged weights: an adapter beside it would be
    # dropped without a word, so the recipe is refused instead.
    msg = rule_error(with_(teacher__prepare="prep.yaml", teacher__adapter="/adapters/a"))
    assert "teacher.adapter" in msg and "cannot go with prepare" in msg


def test_exact_vocab_checked_against_known_vocab():
    recipe = Recipe.model_validate(
        with_(loss__objective="exact_full_vocab", loss__exact_max_vocab=300)
    )
    check_vocab(recipe, 263)
    with pytest.raises(ConfigError, match="exact_max_vocab"):
        check_vocab(recipe, 151936)
    topk = Recipe.model_validate(with_(loss__top_k=512))
    with pytest.raises(ConfigError, match="top_k"):
        check_vocab(topk, 263)


def test_loss_combinations():
    assert "positions: uniform" in rule_error(with_(loss__position_ratio=0.5))
    assert "reverse KL" in rule_error(with_(loss__estimator="sampled_token"))


def test_unknown_field_suggests_the_right_one():
    msg = rule_error(with_(train__learning_rate=0.1))
    assert "unknown field 'learning_rate'" in msg


def test_three_mistakes_reported_at_once_with_locations(tmp_path):
    # A user fixing a recipe must see every problem in one run, each with line:col.
    text = (ROOT / "recipes" / "toy_cpu_opd.yaml").read_text()
    text = text.replace("updates_per_batch: 1 ", "updates_per_batch: 3 ")
    text = text.replace("  temperature: 1.0\n  top_p", "  temprature: 1.0\n  top_p")
    text = text.replace("cpu_threads: 1 ", "cpu_threads: 0 ")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 3, lines
    by_field = {line.split(": ")[1]: line for line in lines}
    assert set(by_field) == {"rollout.temprature", "train.updates_per_batch", "runtime.cpu_threads"}
    source = text.splitlines()
    for field, line in by_field.items():
        where = line.split(": ")[0]
        file, lineno, col = where.rsplit(":", 2)
        assert file == str(path)
        assert field.split(".")[-1] in source[int(lineno) - 1], (field, line)
        assert int(col) >= 1


def test_rule_and_type_errors_in_one_section_both_reported():
    data = with_(rollout__max_new_tokens_per_turn=512, rollout__max_total_tokens=256)
    data["rollout"]["top_p"] = 5
    msg = rule_error(data)
    assert "rollout.top_p" in msg and "rollout.max_total_tokens" in msg


def test_rule_on_a_broken_field_is_not_reported_twice():
    data = with_(rollout__max_total_tokens="lots", rollout__max_new_tokens_per_turn=4096)
    lines = rule_error(data).splitlines()
    assert len(lines) == 1 and "rollout.max_total_tokens" in lines[0]


def test_duplicate_keys_and_bad_yaml():
    with pytest.raises(ConfigError, match="duplicate key 'seed'"):
        loads_recipe("run: {name: t, mode: sft, seed: 1, seed: 2}\nstudent: {model: {toy: {}}}\n")
    with pytest.raises(ConfigError, match=r"r.yaml:\d+:\d+: not valid YAML"):
        loads_recipe("run:\n  - [unclosed\n", "r.yaml")
    with pytest.raises(ConfigError, match="YAML mapping"):
        loads_recipe("- 1\n")


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_recipe("/nonexistent/recipe.yaml")


def test_digest_dump_and_diff_round_trip():
    recipe = Recipe.model_validate(base())
    again = loads_recipe(dump_resolved(recipe))
    assert recipe_digest(again) == recipe_digest(recipe)
    assert recipe_digest(recipe).startswith("sha256:")
    other_data = copy.deepcopy(base())
    other_data["train"] = {"lr": 0.5}
    other_data["environment"] = {"params": {"max_operand": 9}}
    other = Recipe.model_validate(other_data)
    assert diff_recipes(recipe, other) == ["environment.params.max_operand", "train.lr"]
    assert diff_recipes(recipe, again) == []


def test_json_schema_describes_every_field():
    schema = recipe_json_schema()
    assert schema["additionalProperties"] is False
    for name, model in schema["$defs"].items():
        if "properties" not in model:
            continue
        for field, spec in model["properties"].items():
            assert spec.get("description"), f"{name}.{field} has no description"


def test_docs_cover_every_field():
    # docs/recipes.md is the reference; a field missing there is a field nobody finds.
    text = (ROOT / "docs" / "recipes.md").read_text()
    for name, model in recipe_json_schema()["$defs"].items():
        for field in model.get("properties", {}):
            assert f"| `{field}` |" in text, f"{name}.{field} is not in docs/recipes.md"
