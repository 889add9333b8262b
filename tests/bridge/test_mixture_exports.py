"""What leaves a mixture run: its model card names every environment with its weight and
its eval results one per environment; ``qualify`` (a record is one environment's success)
refuses a mixture with one line saying what to run instead. ``export-verl`` of a mixture
writes one bundle (test_mixture_bundle.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe
from tests.bridge.conftest import RECIPE

MIX = [{"name": "calculator", "weight": 2, "train_tasks": 4, "eval_tasks": 2},
       {"name": "sqlite", "weight": 1, "train_tasks": 4, "eval_tasks": 2}]


def _mixture() -> Recipe:
    data = {k: v for k, v in RECIPE.items() if k != "environment"}
    return Recipe.model_validate({**data, "environments": MIX})


def test_the_card_names_each_environment_and_its_success(tmp_path):
    from miniverl.bridge.model_card import card_text, write_model_card

    run = tmp_path / "mix-run"
    run.mkdir()
    by_env = {"calculator": {"success": 0.5, "n": 2, "weight": 2.0},
              "sqlite": {"success": 1.0, "n": 2, "weight": 1.0}}
    rows = [{"event": "eval", "version": 0, "split": "eval", "success": 0.25, "n": 4},
            {"event": "eval", "version": 4, "split": "eval", "success": 0.75, "n": 4,
             "by_environment": by_env}]
    (run / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = _mixture()
    base = {"source": "toy", "toy": {"hidden": 64}}
    text = card_text(run, recipe, kind="lora", step=4, bundle=False, base=base)
    assert ("a mixture: calculator (weight 2), difficulty easy, split seed 0; sqlite "
            "(weight 1), difficulty easy, split seed 0") in text
    card = write_model_card(run, tmp_path / "out", recipe, kind="lora", step=4, base=base)
    meta = yaml.safe_load(card.read_text().split("---")[1])
    results = meta["model-index"][0]["results"]
    assert [(r["dataset"]["type"], r["metrics"][0]["value"]) for r in results] == [
        ("miniverl/calculator", 0.5), ("miniverl/sqlite", 1.0)]
    assert {"calculator", "sqlite"} <= set(meta["tags"])


def test_qualify_refuses_a_mixture_recipe_before_playing():
    pytest.importorskip("torch")
    from miniverl.student.qualify import measure

    # No model is needed to be refused: the check comes before any episode.
    with pytest.raises(ConfigError, match="qualify it with a recipe of each environment"):
        measure(None, None, _mixture(), identity={}, model_dir=".")
