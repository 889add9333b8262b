"""Fixtures for the teacher server's tests: ``harness`` starts servers and stops them."""

from __future__ import annotations

import pytest

from miniverl.testing import FakeBackend, TeacherHarness
from tests.teacher_server.harness import unsupported_at_7


@pytest.fixture
def harness():
    """``make(backend=None, loader=None, log=None, **config) -> (TeacherHarness, backend)``;
    the default backend fails a job whose temperature is 7 with ``UNSUPPORTED``."""
    made = []

    def make(backend=None, loader=None, **config):
        backend = backend or FakeBackend(fail=unsupported_at_7)
        h = TeacherHarness(loader=loader or (lambda request: backend), **config)
        made.append(h)
        return h, backend

    yield make
    for h in made:
        h.close()
