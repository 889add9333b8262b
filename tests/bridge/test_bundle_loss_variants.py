"""The verl export refuses a run trained with a loss variant it cannot carry: verl's
distillation fields are not mapped from them, so exporting would drop them silently."""

from __future__ import annotations

import pytest

from miniverl.bridge.bundle import _loss_mode
from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe
from miniverl.testing.toy_recipe import recipe_dict


def test_a_plain_run_exports_its_loss_mode():
    assert _loss_mode(Recipe.model_validate(recipe_dict("opd", "runs"))) == "forward_kl_topk"


def test_a_loss_variant_is_refused_in_one_line():
    loss = {"estimator": "sampled_token", "divergence": "reverse_kl", "log_ratio_clamp": 10.0}
    recipe = Recipe.model_validate(recipe_dict("opd", "runs", sections={"loss": loss}))
    with pytest.raises(ConfigError, match="loss.log_ratio_clamp 10.0 has no counterpart") as info:
        _loss_mode(recipe)
    assert "\n" not in str(info.value)
