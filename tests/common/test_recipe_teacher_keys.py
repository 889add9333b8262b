"""The recipe's CURVE fields for a remote teacher: ``teacher.curve_secret_key`` and
``teacher.curve_server_key``, set together or not at all."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from miniverl.common.recipe import Recipe
from tests.toy_kit import recipe_dict


def test_both_curve_fields_are_accepted(tmp_path):
    data = recipe_dict("opd", tmp_path)
    data["teacher"].update(endpoint="tcp://10.0.0.5:5555", curve_secret_key="k/student.key_secret",
                           curve_server_key="k/server.key")
    teacher = Recipe.model_validate(data).teacher
    assert (teacher.curve_secret_key, teacher.curve_server_key) == (
        "k/student.key_secret", "k/server.key")


def test_one_curve_field_alone_is_refused_with_the_fix(tmp_path):
    data = recipe_dict("opd", tmp_path)
    data["teacher"].update(curve_secret_key="k/student.key_secret")
    with pytest.raises(ValidationError, match="set both or neither"):
        Recipe.model_validate(data)
