"""``teacher.tokenizer`` (docs/recipes.md; docs/cross-tokenizer.md): the opt-in to a
teacher with another tokenizer. Unset or ``same`` is the recipe it always was (same
digest); ``other`` counts, and the combinations that cannot work are one-line errors."""

from __future__ import annotations

import pytest

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe, recipe_digest

SAMPLED = {"estimator": "sampled_token", "divergence": "reverse_kl"}


def _recipe(run_mode="opd", loss=None, **teacher):
    return {"run": {"name": "t", "mode": run_mode}, "student": {"model": {"toy": {}}},
            "teacher": {"model": {"toy": {}}, **teacher}, "loss": dict(SAMPLED, **(loss or {}))}


def _digest(data):
    return recipe_digest(Recipe.model_validate(data))


def test_same_and_unset_keep_the_digest_and_other_changes_it():
    unset = _digest(_recipe())
    assert _digest(_recipe(tokenizer="same")) == unset
    assert Recipe.model_validate(_recipe(tokenizer="same")).teacher.tokenizer is None
    assert _digest(_recipe(tokenizer="other")) != unset


@pytest.mark.parametrize(("teacher", "words"), [
    ({"endpoint": "http://127.0.0.1:8000", "api": "vllm", "model": {"path": "m"}},
     "engine server"),
    ({"mode": "privileged_context"}, "privileged_context"),
])
def test_combinations_that_cannot_work_are_refused(teacher, words):
    with pytest.raises((ConfigError, ValueError), match=words) as info:
        Recipe.model_validate(_recipe(tokenizer="other", **teacher))
    assert "tokenizer" in str(info.value)


@pytest.mark.parametrize(("mode", "loss", "words"), [
    ("offline_kd", {}, "not run.mode 'offline_kd'"),
    ("opd", {"estimator": "full", "divergence": "forward_kl"}, "estimator: sampled_token"),
    ("opd", {"importance_ratio_cap": 2.0}, "drop loss.importance_ratio_cap"),
])
def test_other_trains_by_opd_with_the_group_estimator(mode, loss, words):
    with pytest.raises((ConfigError, ValueError), match=words):
        Recipe.model_validate(_recipe(run_mode=mode, loss=loss, tokenizer="other"))
    Recipe.model_validate(_recipe(run_mode=mode, loss=loss))  # fine with the same tokenizer


def test_an_unknown_value_is_refused():
    with pytest.raises((ConfigError, ValueError), match="tokenizer"):
        Recipe.model_validate(_recipe(tokenizer="qwen"))
