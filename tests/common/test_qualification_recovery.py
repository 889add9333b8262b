"""``teacher.min_recovery``: a teacher that cannot recover from a tool error is refused.

The recovery benchmark only means something if its teacher recovers: the gate reads the
record's recovery rate (measured on an environment with faults) and refuses, in one
line naming the rate, the threshold and the fix, a teacher below it or one whose record
has no recovery rate at all.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from miniverl.common.qualification import (
    RECORD_KIND,
    TeacherNotQualified,
    environment_signature,
    require_qualified,
)
from miniverl.student.qualify import record_from_eval

IDENTITY = {"name": "t", "model": "org/teacher", "revision": None, "adapter_sha256": None}
ENV = SimpleNamespace(name="calculator", params={"faults": 0.5}, difficulty="easy", split_seed=0)


def recipe(min_success=None, min_recovery=None):
    return SimpleNamespace(teacher=SimpleNamespace(min_success=min_success,
                                                   min_recovery=min_recovery, mode="standard"),
                           environment=ENV, rollout=SimpleNamespace(view=None))


def write(folder, **over):
    record = {"kind": RECORD_KIND, "teacher": dict(IDENTITY), "model_dir_sha256": None,
              "environment": environment_signature(recipe()), "split": "eval", "n": 256,
              "success": 0.95, "date": "2026-01-01T00:00:00+00:00", **over}
    (folder / "r.json").write_text(json.dumps({k: v for k, v in record.items() if v is not ...}))


def test_a_teacher_that_recovers_passes(records):
    write(records, recovery=0.9)
    assert require_qualified(recipe(0.9, 0.8), IDENTITY)["recovery"] == 0.9
    assert require_qualified(recipe(None, 0.8), IDENTITY)["recovery"] == 0.9
    assert require_qualified(recipe(), IDENTITY) is None  # no gate set


def test_a_teacher_below_min_recovery_is_refused_in_one_line(records):
    write(records, recovery=0.25)
    with pytest.raises(TeacherNotQualified) as info:
        require_qualified(recipe(0.5, 0.8), IDENTITY)
    text = str(info.value)
    assert len(text.splitlines()) == 1
    assert "recovery rate 0.250" in text and "teacher.min_recovery 0.8" in text
    assert "faults (teacher.prepare)" in text


@pytest.mark.parametrize("recovery", [..., None, "0.9", True, float("nan")])
def test_a_record_without_a_recovery_rate_is_refused(records, recovery):
    write(records, recovery=recovery)
    with pytest.raises(TeacherNotQualified, match="no measured recovery rate.*faults"):
        require_qualified(recipe(None, 0.8), IDENTITY)
    assert require_qualified(recipe(0.9), IDENTITY)["success"] == 0.95  # success gate only


def test_the_record_of_an_eval_with_faults_holds_its_recovery_rate():
    faults = {"faulted": {"success": 0.5, "n": 2}, "fault_free": {"success": 1.0, "n": 2},
              "recovery": {"rate": 0.5, "n_error_episodes": 2, "n_recovered": 1}}
    summary = {"split": "eval", "n": 4, "success": 0.75, "by_difficulty": {},
               "stop_reasons": {}, "faults": faults}
    record = record_from_eval(summary, recipe(), identity=IDENTITY, model_dir=None,
                              tokenizer_fp=None)
    assert record["recovery"] == 0.5 and record["faults"] == faults
    plain = record_from_eval({**summary, "faults": None}, recipe(), identity=IDENTITY,
                             model_dir=None, tokenizer_fp=None)
    assert "recovery" not in plain
