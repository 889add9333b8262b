"""The suite's two tiers, defined once: everything (``pytest -q``, what CI runs) and the
fast tier a developer runs while editing (``pytest -q -m "not slow"``).

A test is slow when it carries ``@pytest.mark.slow`` or one of ``SLOW_KINDS`` (it starts
real processes, a browser, a verl venv or a real model): ``tests/conftest.py`` adds
``slow`` to those at collection, so ``-m "not slow"`` leaves them all out. Mark a test
``slow`` when it takes more than ``SLOW_S`` seconds alone; a full run lists the unmarked
tests over that (``tests/conftest.py``), and ``--durations=25`` (``pyproject.toml``)
prints the slowest. Used by the README's test section, docs/development.md and
``tests/compat/test_lowest_versions.py``; ``tests/test_tiers.py`` keeps them in step.

Not a test module.
"""

from __future__ import annotations

SLOW_KINDS = ("integration", "browser", "verl", "real_model")
FAST_TIER = "not slow"
FAST_COMMAND = f'pytest -q -m "{FAST_TIER}"'
SLOW_S = 2.0
