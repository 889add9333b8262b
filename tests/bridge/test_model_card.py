"""Model cards on every export, and the verl bundle's logger choice.

A user who shares an exported adapter (on the hub or in a folder) relies on its
``README.md`` to say what it is: the hub's own parser (``huggingface_hub.ModelCard.load``)
must read the base model, the library, the license of the base and the held-out result
from its metadata, and the text must say how it was trained and how to reproduce it,
with no local path in it. The bundle's ``trainer.logger`` must carry the run's
``run.loggers`` to verl, and come back on import.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from miniverl.bridge import profile
from miniverl.common.recipe import Recipe, diff_recipes, load_recipe
from miniverl.common.redact import redact_text

REV = "0123456789abcdef0123456789abcdef01234567"
HUB_ID = "Qwen/Qwen3-0.6B"


def _append_events(run: Path, *events: dict) -> None:
    with (run / "events.jsonl").open("a", encoding="utf-8") as fh:
        for event in events:
            fh.write(json.dumps({"ts": "2025-01-01T00:00:00+00:00", **event}) + "\n")


@pytest.fixture
def hub_run(toy_run, tmp_path, monkeypatch) -> Path:
    """toy_run's checkpoints under a recipe whose base is a pinned hub model, with that
    model's card (license apache-2.0) in a local Hugging Face cache, a qualified teacher,
    a teacher reload and an eval before training."""
    import huggingface_hub.constants

    from miniverl.common.modeling import resolve_model_dir

    run = tmp_path / "hub-run"
    shutil.copytree(toy_run, run)
    recipe = yaml.safe_load((run / "recipe.resolved.yaml").read_text())
    toy_base = resolve_model_dir(Recipe.model_validate(recipe).student.model)
    recipe["student"]["model"] = {"hub_id": HUB_ID, "revision": REV}
    (run / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    shutil.copytree(toy_base, run / "checkpoints" / "step_4" / "tokenizer",
                    ignore=shutil.ignore_patterns("*.safetensors"))
    snapshot = tmp_path / "hf" / "models--Qwen--Qwen3-0.6B" / "snapshots" / REV
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Qwen3-0.6B\n")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    old = {"name": "toy-teacher", "model": "/home/someone/models/teacher", "revision": None,
           "adapter_sha256": None, "instance": "aaaa1111", "gen": 0}
    _append_events(
        run,
        {"event": "eval", "version": 0, "split": "eval", "success": 0.25, "n": 6},
        {"event": "teacher_connected", "teacher": old, "version": 0},
        {"event": "teacher_qualified", "teacher": old, "success": 0.8, "split": "eval", "n": 5,
         "date": "2025-01-01T00:00:00+00:00", "min_success": 0.5, "version": 0},
        {"event": "teacher_changed", "how": "reload", "old": old, "new": {**old, "gen": 1},
         "version": 2},
    )
    return run


def test_adapter_card_parses_with_base_model_license_and_metrics(hub_run, tmp_path):
    from huggingface_hub import ModelCard

    from miniverl.bridge.artifacts import export_adapter

    out = tmp_path / "adapter"
    export_adapter(hub_run, out)
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == HUB_ID and card.data.base_model_revision == REV
    assert card.data.library_name == "peft" and card.data.license == "apache-2.0"
    assert {"miniverl", "lora", "on-policy-distillation", "calculator"} <= set(card.data.tags)
    (result,) = card.data.eval_results
    assert result.metric_type == "success" and result.metric_value == 0.5
    assert result.dataset_split == "eval"
    text = card.text
    manifest = json.loads((hub_run / "manifest.json").read_text())
    for needle in ("opd (on-policy)", "calculator, difficulty mixed", "| optimizer steps | 4 |",
                   "25.0% (version 0, 6 tasks)", "50.0% (version 4, 6 tasks)",
                   manifest["recipe_digest"], "80.0% held-out success on the eval split",
                   "min_success 0.5", "| teacher changes | 1 (last: toy-teacher (~/models/teacher, gen 1))",
                   "miniverl up recipe.yaml"):
        assert needle in text, needle
    assert redact_text(card.content) == card.content  # nothing local, nothing secret
    assert "/home/someone" not in card.content
    # The recipe in the card is the run's recipe: the reproduce command can use it as is.
    shown = re.search(r"```yaml\n(.*?)```", text, flags=re.S).group(1)
    differing = diff_recipes(Recipe.model_validate(yaml.safe_load(shown)),
                             load_recipe(hub_run / "recipe.resolved.yaml"))
    assert set(differing) <= {"run.output_dir"}  # "runs": where it lived is local
    summary = json.loads((out / "miniverl_export.json").read_text())
    assert "README.md" in summary["files"]


def test_toy_base_card_names_no_hub_model(toy_run, tmp_path):
    from huggingface_hub import ModelCard

    from miniverl.bridge.artifacts import export_adapter

    export_adapter(toy_run, tmp_path / "adapter")
    card = ModelCard.load(tmp_path / "adapter" / "README.md")
    assert card.data.base_model is None and card.data.library_name == "peft"
    assert card.data.license is None  # a toy base has no license to inherit
    assert "a toy Qwen3 built from" in card.text
    assert card.data.eval_results is None  # one eval only: no after-training result
    assert "held-out success after | not measured" in card.text


def test_full_fine_tune_sft_card_says_transformers_and_miniverl_train(tmp_path):
    from huggingface_hub import ModelCard

    from miniverl.bridge.artifacts import export_adapter
    from miniverl.common.modeling import resolve_model_dir
    from miniverl.common.rundir import RunDir
    from tests.bridge.conftest import RECIPE

    data = {k: v for k, v in RECIPE.items() if k != "teacher"}
    data["run"] = {**RECIPE["run"], "mode": "sft"}
    data["student"] = {**RECIPE["student"], "lora": None}
    recipe = Recipe.model_validate(data)
    run = RunDir.create(tmp_path / "runs", recipe, run_id="full-sft")
    shutil.copytree(resolve_model_dir(recipe.student.model),
                    run.checkpoints_dir / "step_1" / "model")
    export_adapter(run.path, tmp_path / "out")
    card = ModelCard.load(tmp_path / "out" / "README.md")
    assert card.data.library_name == "transformers" and "sft" in card.data.tags
    assert "lora" not in card.data.tags and "| teacher" not in card.text
    assert "miniverl train recipe.yaml" in card.text and "full fine-tune" in card.text


def test_bundle_has_a_card_listed_in_sha256sums_and_passes_doctor(toy_bundle):
    from huggingface_hub import ModelCard

    from miniverl.bridge.doctor import doctor

    card = ModelCard.load(toy_bundle / "README.md")
    assert card.data.library_name == "peft" and "verl 0.8.0 bundle" in card.text
    assert "model/adapter" in card.text
    assert "README.md" in (toy_bundle / "SHA256SUMS").read_text()
    result = doctor(toy_bundle)
    assert {c["name"]: c["status"] for c in result["checks"]}["privacy"] == "pass"


def test_bundle_carries_the_run_loggers_to_verl(toy_run, toy_bundle, tmp_path):
    from miniverl.bridge.bundle import build_overrides
    from miniverl.bridge.doctor import _check_overrides

    overrides = yaml.safe_load((toy_bundle / "recipe/verl-overrides.yaml").read_text())
    assert overrides["trainer"]["logger"] == ["console"]  # jsonl only -> verl's console
    recipe = load_recipe(toy_run / "recipe.resolved.yaml")
    tracked = recipe.model_copy(update={"run": recipe.run.model_copy(
        update={"loggers": ["jsonl", "wandb", "tensorboard", "mlflow", "trackio"]})})
    flat = profile.flatten(build_overrides(tracked, None, max_prompt=64, run_name="x"))
    assert flat["trainer.logger"] == ["console", "wandb", "tensorboard", "mlflow", "trackio"]
    # doctor refuses a logger verl 0.8.0 has no backend for
    copy = tmp_path / "bundle"
    shutil.copytree(toy_bundle, copy)
    path = copy / "recipe/verl-overrides.yaml"
    path.write_text(path.read_text().replace("  - console", "  - console\n  - neptune"))
    status, detail = _check_overrides(copy)
    assert status == "fail" and "trainer.logger" in detail


def test_verl_logger_list_imports_as_run_loggers():
    from miniverl.bridge.import_fields import HANDLERS, ImportResult

    result = ImportResult({"run": {"name": "x", "mode": "opd"}})
    HANDLERS["trainer.logger"]("trainer.logger", ["console", "wandb", "swanlab"], result)
    assert result.recipe["run"]["loggers"] == ["jsonl", "wandb"]
    (finding,) = result.findings
    assert finding.label == "derived" and "swanlab" in finding.note
    result = ImportResult({"run": {"name": "x", "mode": "opd"}})
    HANDLERS["trainer.logger"]("trainer.logger", "console", result)
    assert result.recipe["run"]["loggers"] == ["jsonl"] and result.findings[0].label == "exact"


def test_card_recipe_hides_values_under_secret_named_keys(tmp_path):
    # A card is made to be shared: an environment param named like a secret (a plugin
    # environment's `auth_token`) must not reach its resolved recipe, though as YAML
    # text `auth_token: ...` matches no secret pattern.
    from miniverl.bridge.model_card import card_text
    from tests.bridge.conftest import RECIPE

    recipe = Recipe.model_validate(RECIPE)
    env = recipe.environment.model_copy(update={"params": {"auth_token": "tok-4f9a2c77e1"}})
    recipe = recipe.model_copy(update={"environment": env})
    run = tmp_path / "card-run"
    run.mkdir()
    text = card_text(run, recipe, kind="lora", step=1, bundle=False,
                     base={"source": "toy", "toy": {"hidden": 64}})
    assert "auth_token" in text and "tok-4f9a2c77e1" not in text
