"""``teacher.tokenizer`` (docs/recipes.md; docs/cross-tokenizer.md): the opt-in to a
teacher with another tokenizer. Unset or ``same`` is the recipe it always was (same
digest); ``other`` counts, and the combinations that cannot work are one-line errors."""

from __future__ import annotations

import pytest

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe, recipe_digest


def _recipe(**teacher):
    return {"run": {"name": "t", "mode": "opd"}, "student": {"model": {"toy": {}}},
            "teacher": {"model": {"toy": {}}, **teacher}}


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


def test_an_unknown_value_is_refused():
    with pytest.raises((ConfigError, ValueError), match="tokenizer"):
        Recipe.model_validate(_recipe(tokenizer="qwen"))
