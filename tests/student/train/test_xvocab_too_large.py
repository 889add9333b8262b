"""An xvocab episode over the teacher's ``max_episode_bytes`` is refused by the student,
before it is sent, with the teacher's own rule and words (docs/cross-tokenizer.md).

What a user relies on: the client checks each xvocab SCORE against the limits of the
teacher's ``HELLO_OK`` and raises the line the teacher would answer ``ERROR TOO_LARGE``
with, sending nothing (a frame the teacher could not read never leaves); the run's link
then sends that episode nothing and trains on it nowhere, counts it
(``xvocab_too_large``), says why (event ``xvocab_too_large``) and trains on the others.
Before, the refusal ended the run from inside the rollout.
"""

from __future__ import annotations

import numpy as np
import pytest

from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.common.toy import build_toy_tokenizer
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import ErrorCode, ProtocolViolation
from miniverl.student.environments import make_tasks
from miniverl.student.rollout.oracle import oracle_trajectories
from miniverl.student.train.teacher.xvocab import XvocabLink, XvocabRequests
from miniverl.testing import FakeBackend, TeacherHarness
from tests.common.cross_tokenizer_kit import byte_fallback_tokenizer

TEACHER_FP = "sha256:" + "cd" * 32
LIMIT = 1560  # between a calculator episode (about 1,500 bytes) and a jsonnav one (1,600)


@pytest.fixture(scope="module")
def episodes():
    """Two calculator and two jsonnav oracle episodes of the toy tokenizer, and it."""
    tok = build_toy_tokenizer()
    fp = fingerprint_tokenizer(tok)
    trajs = [t for env in ("calculator", "jsonnav") for t in oracle_trajectories(
        env, make_tasks(env, "train", 2, "easy", 0, {}), tok, fp, {})]
    return tok, trajs


def _teacher() -> TeacherHarness:
    teacher_tok = byte_fallback_tokenizer()
    return TeacherHarness(backend=FakeBackend(tokenizer=teacher_tok, tokenizer_fp=TEACHER_FP,
                                              vocab_size=len(teacher_tok)),
                          limits=Limits(max_episode_bytes=LIMIT))


def test_the_client_refuses_an_episode_over_max_episode_bytes_before_sending_it(episodes):
    tok, trajs = episodes
    req = XvocabRequests(tok, {"jsonnav": {}})(trajs[-1])
    assert req["episode"].nbytes > LIMIT
    with _teacher() as h, h.client(tokenizer_fp=fingerprint_tokenizer(tok),
                                   vocab_size=len(tok), xvocab=True) as client:
        assert client.hello.kinds.xvocab.max_episode_bytes == LIMIT
        with pytest.raises(ProtocolViolation) as info:
            client.submit_xvocab(req["episode"], req["student_cuts"], req["student_pieces"],
                                 k=4)
        served = client.status()["counters"]  # answered after anything sent before it
    assert info.value.code == ErrorCode.TOO_LARGE
    # The teacher's own words for it (protocol/xvocab.py, check_xvocab_sizes).
    assert str(info.value).startswith(f"the xvocab episode has {req['episode'].nbytes} bytes; "
                                      f"the limit is max_episode_bytes={LIMIT}")
    assert served["requests"] == 0 and served["errors"] == {}  # the SCORE never left


def test_the_link_skips_an_episode_over_the_limit_and_trains_on_the_others(episodes):
    tok, trajs = episodes
    said = []
    with _teacher() as h, h.client(tokenizer_fp=fingerprint_tokenizer(tok),
                                   vocab_size=len(tok), xvocab=True) as client:
        link = XvocabLink(client, kind="xvocab", k=4, temperature=1.0,
                          xvocab=XvocabRequests(tok, {"calculator": {}, "jsonnav": {}}),
                          on_too_large=said.append)
        link.begin_update(0)
        for traj in trajs:
            link.submit(traj, np.arange(len(traj.tokens) - 1))
        scored = link.collect()
        counters = link.counters()
    kept = [len(s.positions_P) for s in scored]
    assert [n > 0 for n in kept] == [True, True, False, False]  # jsonnav's: nothing
    assert counters["xvocab_sent"] == 2 and counters["xvocab_too_large"] == 2
    assert len(said) == 2 and all(f"max_episode_bytes={LIMIT}" in why for why in said)
