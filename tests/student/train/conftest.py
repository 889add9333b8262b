"""Fixtures for the trainer tests: ``toy``, the toy teacher scored in process."""

from __future__ import annotations

import pytest

from tests.student.train.trainer_kit import ToyTeacher, load_toy_teacher


@pytest.fixture(scope="module")
def toy() -> ToyTeacher:
    """The toy teacher (``toy_kit.TEACHER``, ``trainer_kit.load_toy_teacher``), loaded once
    per test module."""
    return load_toy_teacher()
