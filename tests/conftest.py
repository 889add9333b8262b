"""Shared pytest setup: one CPU thread per process, a session-wide toy cache,
deprecations in miniverl's own calls as errors, and the tiers.

Two OpenMP threads on a small machine made tiny-model steps 10-40x slower than one,
so the environment is set before any test imports torch. Toy models are built once
per session under pytest's temporary directory (``MINIVERL_CACHE``), never in the
user's real cache. Keep this file small; add fixtures only when several test
folders need them.

Deprecations: ``pyproject.toml`` turns a DeprecationWarning or FutureWarning that
Python attributes to a miniverl module into an error, and
:mod:`tests.deprecation_guard` also catches a library's own deprecation warning when
miniverl's code is its caller.

Tiers (:mod:`tests.tiers`): a test with one of ``SLOW_KINDS`` is marked ``slow`` here at
collection, so ``pytest -q -m "not slow"`` is the fast tier; the end of a run lists the
tests that took over ``SLOW_S`` seconds without the mark. ``MINIVERL_TEST_HIDE`` hides
optional modules (:mod:`tests.extras`) before any test module imports them.
"""

from __future__ import annotations

import os

import pytest

from tests.deprecation_guard import install_deprecation_guard
from tests.extras import hide_from_env
from tests.tiers import SLOW_KINDS, SLOW_S

install_deprecation_guard()
hide_from_env()

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


def pytest_collection_modifyitems(items):
    """Mark ``slow`` every test that carries one of ``SLOW_KINDS``."""
    for item in items:
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)


_UNMARKED: dict[str, float] = {}  # nodeid -> setup + call + teardown seconds


def pytest_runtest_logreport(report):
    # On the xdist controller too: reports carry the markers among their keywords. Setup
    # counts: a module fixture that trains a model is paid by the fast tier too.
    if "slow" not in report.keywords:
        _UNMARKED[report.nodeid] = _UNMARKED.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    over = sorted(((s, n) for n, s in _UNMARKED.items() if s > SLOW_S), reverse=True)
    if over:
        terminalreporter.section(f"over {SLOW_S:g} s without @pytest.mark.slow "
                                 "(tests/tiers.py)")
        for seconds, nodeid in over:
            terminalreporter.write_line(f"{seconds:7.2f}s {nodeid}")
