"""Fixtures for the teacher server's tests: ``harness`` starts servers and stops them."""

from __future__ import annotations

import pytest

from tests.teacher_server.fake_backend import FakeBackend
from tests.teacher_server.harness import Harness


@pytest.fixture
def harness():
    """``make(backend=None, loader=None, log=None, **config) -> (Harness, backend)``."""
    made = []

    def make(backend=None, loader=None, **config):
        backend = backend or FakeBackend()
        h = Harness(loader or (lambda request: backend), **config)
        made.append(h)
        return h, backend

    yield make
    for h in made:
        h.close()
