"""The ``miniverl`` pytest plugin: fixtures for testing teacher clients and teachers.

Registered through the ``pytest11`` entry point in ``pyproject.toml``, so any project
that installs miniverl gets these fixtures without a ``conftest.py``:

- ``fake_teacher`` — a fresh :class:`~miniverl.testing.FakeTeacher`;
- ``fake_teacher_client`` — a connected ``SyncTeacherClient`` talking to
  ``fake_teacher`` with fast test timings, closed after the test;
- ``teacher_harness`` — ``make(backend=None, **options) -> TeacherHarness``: the real
  teacher server around your backend, loader or scorer; every harness made is closed
  after the test.

pytest loads this module in every session, so the kit itself is imported only when a
fixture is used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def fake_teacher() -> Any:
    """A fresh in-memory :class:`~miniverl.testing.FakeTeacher` (script it in the test)."""
    # start-up: pytest imports every plugin in every session; load the kit on first use.
    from miniverl.testing.fake_teacher import FakeTeacher

    return FakeTeacher()


@pytest.fixture
def fake_teacher_client(fake_teacher: Any) -> Iterator[Any]:
    """A connected ``SyncTeacherClient`` of ``fake_teacher`` (FAST_SETTINGS timings)."""
    with fake_teacher.client() as client:
        yield client


@pytest.fixture
def teacher_harness() -> Iterator[Callable[..., Any]]:
    """``make(backend=None, *, loader=None, scorer=None, **options) -> TeacherHarness``."""
    # start-up: pytest imports every plugin in every session; load the kit on first use.
    from miniverl.testing.harness import TeacherHarness

    made: list[Any] = []

    def make(backend: Any = None, **options: Any) -> Any:
        harness = TeacherHarness(backend, **options)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()
