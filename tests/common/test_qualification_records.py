"""The competence gate reads only sound qualification records.

Users rely on ``teacher.min_success`` refusing a teacher that has no good-enough
measurement: a damaged or hand-edited record in the cache (a NaN, a string, a missing
field) must neither pass the gate nor crash it with a traceback; it counts as no record.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from miniverl.common.qualification import (
    RECORD_KIND,
    TeacherNotQualified,
    environment_signature,
    require_qualified,
)

IDENTITY = {"name": "t", "model": "org/teacher", "revision": None, "adapter_sha256": None}
RECIPE = SimpleNamespace(
    teacher=SimpleNamespace(min_success=0.9, min_recovery=None, mode="standard"),
    environment=SimpleNamespace(name="calculator", params={}, difficulty="easy", split_seed=0),
    rollout=SimpleNamespace(view=None),
)


def _write(folder, name, **over):
    record = {"kind": RECORD_KIND, "teacher": dict(IDENTITY), "model_dir_sha256": None,
              "environment": environment_signature(RECIPE), "split": "eval", "n": 8,
              "success": 0.95, "date": "2026-01-01T00:00:00+00:00", **over}
    record = {k: v for k, v in record.items() if v is not ...}
    (folder / f"{name}.json").write_text(json.dumps(record))  # NaN is written as NaN


def test_a_sound_record_passes_the_gate(records):
    _write(records, "good")
    assert require_qualified(RECIPE, IDENTITY)["success"] == 0.95


@pytest.mark.parametrize("bad", [{"success": math.nan}, {"success": "0.95"}, {"success": True},
                                 {"success": 1.5}, {"n": ...}, {"date": ...}, {"split": ...}])
def test_a_damaged_record_is_no_record(records, bad):
    _write(records, "damaged", **bad)
    with pytest.raises(TeacherNotQualified, match="has no qualification record"):
        require_qualified(RECIPE, IDENTITY)
