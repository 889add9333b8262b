"""``miniverl.testing.FakeTeacherClient``: the in-process teacher client the trainer tests use.

It must score like the served teacher (``score_positions``), hold its replies to the
client's staleness rule, drop and count the stale replies a test injects, and raise
``TeacherChanged`` when a test makes the next wait meet a reload (docs/testing.md,
"Testing a trainer with FakeTeacherClient").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from miniverl.protocol.scoring_client import ScoreResult, TeacherChanged
from miniverl.teacher_server.scoring import score_positions
from miniverl.testing import FakeTeacherClient
from tests.toy_kit import ONE_LAYER, bare_qwen3

VOCAB = 50
TOKENS = np.array([3, 1, 4, 1, 5, 9, 2, 6], np.int32)
CU = np.array([0, 8], np.int32)
POS = np.array([0, 2, 5], np.int32)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return bare_qwen3(ONE_LAYER, vocab=VOCAB, max_positions=64).eval()


def stale(result: ScoreResult, **changes) -> ScoreResult:
    return ScoreResult(**{**vars(result), **changes})


def test_replies_are_the_served_teachers_targets_for_the_version_that_asked(model):
    fake = FakeTeacherClient(model, "fp", VOCAB)
    fake.set_version(4)
    fake.bind()
    rid = fake.submit(TOKENS, CU, POS, kind="topk", k=5)
    (result,) = fake.wait([rid]).values()
    want = score_positions(model, TOKENS, CU, POS, "topk", 5)
    assert result.student_version == 4 and (result.instance, result.gen) == fake.bind()
    for name in want:
        np.testing.assert_array_equal(result.arrays[name], want[name])
    assert fake.scored_versions == [4]
    assert fake.counters["sent"] == fake.counters["received"] == 1


def test_injected_stale_replies_are_dropped_and_counted(model):
    fake = FakeTeacherClient(model, "fp", VOCAB)
    fake.set_version(2)
    identity = fake.bind()
    rid = fake.submit(TOKENS, CU, POS, kind="topk", k=5)
    good = ScoreResult(id=rid, student_version=2, instance=identity[0], gen=identity[1],
                       kind="topk", k=5, arrays={}, timing={})
    fake.injected = [stale(good, id=999),                     # not pending
                     stale(good, student_version=1),          # another version
                     stale(good, gen=identity[1] + 1)]        # another teacher
    (result,) = fake.wait([rid]).values()
    assert result.student_version == 2 and fake.counters["stale_dropped"] == 3
    assert fake.injected == []


def test_a_reload_before_the_wait_raises_teacher_changed(model):
    fake = FakeTeacherClient(model, "fp", VOCAB)
    old = fake.bind()
    rid = fake.submit(TOKENS, CU, POS, kind="topk", k=5)
    fake.reload_before_next_wait = True
    with pytest.raises(TeacherChanged) as info:
        fake.wait([rid])
    assert info.value.old == old and info.value.new == (old[0], old[1] + 1)
    assert info.value.how == "reload"
    # Rebound to the new gen, the old request is no longer acceptable from it.
    fake.bind()
    with pytest.raises(TeacherChanged):
        fake.wait([rid])
    assert fake.counters["stale_dropped"] == 1
