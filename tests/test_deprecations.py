"""The deprecation guard (``tests/deprecation_guard.py``): a deprecated library API that
miniverl's code calls fails the suite; one that a library calls inside another library
does not. What users rely on: the next transformers deprecation in our own calls fails
CI the day it appears, not the day the API is removed.
"""

from __future__ import annotations

import types
import warnings

import pytest

from tests.deprecation_guard import ROOT


def _module(name: str, source: str, filename: str, **names) -> types.SimpleNamespace:
    namespace = {"__name__": name, "warnings": warnings, **names}
    exec(compile(source, filename, "exec"), namespace)
    return types.SimpleNamespace(**namespace)


# A library whose API is deprecated, a second library that calls it, and code that
# compiles as if it lived in miniverl/common/.
LIB = _module(
    "fakelib.api",
    "def old_api():\n"
    "    warnings.warn('old_api is deprecated; use new_api', FutureWarning, stacklevel=2)\n"
    "    return 1\n",
    "/site-packages/fakelib/api.py",
)
OTHER = _module(
    "otherlib.core", "def uses_old_api():\n    return old_api()\n",
    "/site-packages/otherlib/core.py", old_api=LIB.old_api,
)
OURS = _module(
    "miniverl.common.fake", "def direct():\n    return old_api()\n"
    "def through_a_library():\n    return uses_old_api()\n",
    str(ROOT / "common" / "fake_for_test.py"),
    old_api=LIB.old_api, uses_old_api=OTHER.uses_old_api,
)


def test_our_call_into_a_deprecated_api_is_an_error():
    with pytest.raises(FutureWarning, match="deprecated API called by miniverl at .*common"):
        OURS.direct()


def test_a_library_calling_another_library_stays_a_warning():
    with pytest.warns(FutureWarning, match="old_api is deprecated"):
        assert OURS.through_a_library() == 1


def test_a_test_calling_a_deprecated_api_stays_a_warning():
    with pytest.warns(FutureWarning):
        LIB.old_api()
