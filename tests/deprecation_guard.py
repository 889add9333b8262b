"""Deprecated library APIs called by miniverl's own code fail the test suite.

``pyproject.toml`` turns a DeprecationWarning or FutureWarning that Python attributes
to a miniverl module into an error. A library usually attributes its own deprecation
warning to itself (transformers' ``past_key_values`` warning names
``torch/nn/modules/module.py``), so :func:`install_deprecation_guard` also looks at who
called the library: when the first frame outside the warning library (and torch's module-call
plumbing) is miniverl's code, the warning is raised as an error there. A library that
calls another library's deprecated API (peft reading a transformers property) is that
library's business and stays a warning.

This module is test support, not a test; ``tests/conftest.py`` installs it once.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWN_DIRS = tuple(
    f"{ROOT / name}{os.sep}"
    for name in ("common", "protocol", "teacher_server", "student", "bridge", "cli")
)
PLUMBING = {"torch", "functools", "contextlib", "typing"}  # frames between caller and API
_warn = warnings.warn


def own_caller(frame) -> str | None:
    """``file:line`` of miniverl code that called the library issuing a warning, if any.

    ``frame`` is the frame that called ``warnings.warn``; its top-level package is the
    library that issued the warning.
    """
    issuer = str(frame.f_globals.get("__name__", "")).split(".")[0]
    while frame is not None:
        package = str(frame.f_globals.get("__name__", "")).split(".")[0]
        if package != issuer and package not in PLUMBING:
            path = frame.f_code.co_filename
            return f"{path}:{frame.f_lineno}" if path.startswith(OWN_DIRS) else None
        frame = frame.f_back
    return None


def _strict_warn(message, category=None, stacklevel=1, source=None, **kwargs):
    if category is None:
        category = type(message) if isinstance(message, Warning) else UserWarning
    if issubclass(category, (DeprecationWarning, FutureWarning)):
        caller = own_caller(sys._getframe(1))
        if caller is not None:
            raise category(f"{message} [deprecated API called by miniverl at {caller}]")
    return _warn(message, category, stacklevel + 1, source, **kwargs)




def install_deprecation_guard() -> None:
    """Route ``warnings.warn`` through :func:`_strict_warn` (idempotent)."""
    warnings.warn = _strict_warn
