"""A W&B run of a mixture is tagged with every environment it trains on (a run is found
by its tags), not the default single environment the recipe does not use."""

from __future__ import annotations

from types import SimpleNamespace

from miniverl.common.recipe import Recipe
from miniverl.student import tracker_backends
from tests.toy_kit import recipe_dict


def test_a_mixture_run_is_tagged_with_each_environment(tmp_path, monkeypatch):
    seen = {}
    fake = SimpleNamespace(init=lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(tracker_backends, "require", lambda *_: fake)
    data = recipe_dict("rl", tmp_path, teacher=None, sections={"rollout": {"group_size": 2}})
    del data["environment"]
    data["environments"] = [{"name": "sqlite"}, {"name": "jsonnav", "weight": 2}]
    run = SimpleNamespace(id="r1", path=tmp_path)
    tracker_backends.WandbBackend(run, Recipe.model_validate(data), {})
    assert seen["tags"] == ["rl", "sqlite", "jsonnav"]
