"""Shared pytest setup: one CPU thread per process, a session-wide toy cache, and
deprecations in miniverl's own calls as errors.

Two OpenMP threads on a small machine made tiny-model steps 10-40x slower than one,
so the environment is set before any test imports torch. Toy models are built once
per session under pytest's temporary directory (``MINIVERL_CACHE``), never in the
user's real cache. Keep this file small; add fixtures only when several test
folders need them.

Deprecations: ``pyproject.toml`` turns a DeprecationWarning or FutureWarning that
Python attributes to a miniverl module into an error, and
:mod:`tests.deprecation_guard` also catches a library's own deprecation warning when
miniverl's code is its caller.
"""

from __future__ import annotations

import os

import pytest

from tests.deprecation_guard import install_deprecation_guard

install_deprecation_guard()

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"


@pytest.fixture(scope="session", autouse=True)
def _single_thread_torch():
    """torch.set_num_threads(1) if a test module already imported torch."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session", autouse=True)
def miniverl_cache(tmp_path_factory):
    """A session-wide MINIVERL_CACHE (toy models and tokenizers are built here once)."""
    path = tmp_path_factory.mktemp("miniverl-cache")
    old = os.environ.get("MINIVERL_CACHE")
    os.environ["MINIVERL_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("MINIVERL_CACHE", None)
    else:
        os.environ["MINIVERL_CACHE"] = old
