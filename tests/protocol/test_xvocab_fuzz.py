"""Generated xvocab SCOREs at the teacher server (the cross-tokenizer kind).

What a user relies on (docs/protocol.md, "`xvocab`: a teacher with another tokenizer",
and "Where each check runs": nothing a client sends kills the server loop): an xvocab SCORE with any part changed — its episode's bytes or JSON, a message,
the student's cuts or pieces, a header field, an array's dtype — is answered (SCORE_OK
or ERROR) within a bounded time, and the teacher keeps serving: a valid SCORE after the
generated ones gets the same arrays as before them. The fast tier runs a few dozen;
``benchmarks/http_fuzz.py`` runs 10,000+.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from miniverl.protocol import messages as m
from miniverl.protocol.xvocab import xvocab_request
from miniverl.testing import FAKE_TOKENIZER_FP, FAKE_VOCAB, FakeBackend, TeacherHarness
from tests.common.cross_tokenizer_kit import (
    TOOLS,
    byte_fallback_tokenizer,
    hostile_episode,
    toy_tokenizer,
)
from tests.protocol.xvocab_frames import HEADER, xvocab_scores

TEACHER_FP = "sha256:" + "cd" * 32
REPLY_WITHIN_S = 10.0
IDS = itertools.count(100)


def valid_arrays() -> dict[str, np.ndarray]:
    req = xvocab_request(toy_tokenizer(), hostile_episode("Café 👍🏽 done."), TOOLS)
    return {name: req[name] for name in ("episode", "student_cuts", "student_pieces")}


BASE = valid_arrays()


@pytest.fixture(scope="module")
def conn():
    tok = byte_fallback_tokenizer()
    h = TeacherHarness(backend=FakeBackend(tokenizer=tok, tokenizer_fp=TEACHER_FP,
                                           vocab_size=len(tok)))
    raw = h.raw()
    hello = raw.call({"v": 1, "t": "HELLO", "id": 1, "client": "fuzz",
                      "tokenizer_fp": FAKE_TOKENIZER_FP, "vocab_size": FAKE_VOCAB,
                      "understands": ["xvocab"]})[0]
    assert hello.t == "HELLO_OK"
    before = raw.call({**HEADER, "id": next(IDS)}, BASE)
    assert before[0].t == "SCORE_OK"
    yield raw
    after = raw.call({**HEADER, "id": next(IDS)}, BASE)
    assert after[0].t == "SCORE_OK"
    for name in before[1]:
        np.testing.assert_array_equal(before[1][name], after[1][name])
    h.close()


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(example=xvocab_scores(BASE))
def test_generated_xvocab_scores_are_answered_and_the_teacher_keeps_serving(conn, example):
    header, arrays = example
    rid = next(IDS)
    header = {**header, "id": rid}
    conn.send(header, arrays)
    reply = conn.recv(REPLY_WITHIN_S)
    if reply is None:  # only a message without a readable header may go unanswered
        pong = conn.call({"v": 1, "t": "PING", "id": next(IDS)}, timeout_s=REPLY_WITHIN_S)[0]
        assert pong.t == "PONG" and pong.state == m.TeacherState.READY
        return
    msg, _ = reply
    assert msg.t in ("SCORE_OK", "ERROR"), msg
    if msg.t == "ERROR":
        assert msg.code != m.ErrorCode.INTERNAL, msg.message
        assert "\n" not in msg.message
