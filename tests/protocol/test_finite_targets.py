"""Finite targets, bounded temperatures and sequences within the model, on the wire.

A student trusts that nothing non-finite reaches its loss: the client refuses a
SCORE_OK holding a NaN or an infinity (counted in ``nonfinite_replies``, raised as a
teacher error), with the one documented exception of ``tail_logmass = -inf`` when
``k = V``. Temperatures outside [0.05, 20] never travel, a sequence longer than the
teacher's context is ``TOO_LARGE`` naming both numbers, and the optional
``deterministic`` field leaves a default SCORE byte-identical.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from miniverl.common.errors import ProtocolError, TeacherError
from miniverl.protocol import messages as m
from miniverl.protocol.checks import nonfinite_report
from miniverl.protocol.codec import decode, encode
from miniverl.protocol.limits import Limits
from miniverl.testing import FakeTeacher, ScoreJob, answer, next_token_targets
from tests.protocol.client_kit import CU, POS, TOKENS, VOCAB, run


def run_client(body, teacher: FakeTeacher) -> None:
    """``await body(client)`` on a connected client of ``teacher``."""

    async def connected(client, teacher):
        await client.connect()
        await body(client)

    run(connected, teacher)


def poisoned(name: str, value: float):
    """A step answering every SCORE with ``value`` in row 0 of ``name``."""

    def scorer(job: ScoreJob) -> dict:
        reply = next_token_targets(job.tokens_N, job.cu_seqlens_B1, job.positions_P,
                                   kind=job.kind, k=job.k, vocab_size=VOCAB)
        reply[name].reshape(reply[name].shape[0], -1)[0, 0] = value
        return reply

    return answer(scorer=scorer)


# -- the rule ------------------------------------------------------------------------------


def test_finite_replies_pass_and_each_kind_of_non_finite_is_named():
    good = {"ids": np.zeros((2, 4), np.int32), "logprobs": np.full((2, 4), -1.0, np.float32),
            "tail_logmass": np.full(2, -0.5, np.float32), "target_logprobs": np.zeros(2, np.float32)}
    assert nonfinite_report(good, kind="topk", k=4, vocab_size=VOCAB) is None
    bad = dict(good, logprobs=np.array([[np.nan, np.inf, -1, -1], [-np.inf, -1, -1, -1]],
                                       np.float32))
    assert nonfinite_report(bad, kind="topk", k=4, vocab_size=VOCAB) == \
        "logprobs: 1 NaN, 1 +inf, 1 -inf"


def test_tail_is_minus_inf_only_when_k_covers_the_vocabulary():
    # docs/protocol.md, "SCORE_OK": tail_logmass is -inf when k = V (no mass outside the
    # top-k), nowhere else.
    reply = {"tail_logmass": np.full(3, -np.inf, np.float32),
             "target_logprobs": np.zeros(3, np.float32)}
    assert nonfinite_report(reply, kind="topk", k=VOCAB, vocab_size=VOCAB) is None
    assert nonfinite_report(reply, kind="topk", k=VOCAB - 1, vocab_size=VOCAB) == \
        "tail_logmass: 3 -inf"
    plus = dict(reply, tail_logmass=np.full(3, np.inf, np.float32))
    assert nonfinite_report(plus, kind="topk", k=VOCAB, vocab_size=VOCAB) == "tail_logmass: 3 +inf"


# -- the client ----------------------------------------------------------------------------


def refused_then_usable(step, match: str, counter: str) -> None:
    """A reply made by ``step`` is refused (a ``TeacherError`` matching ``match``) and
    counted in ``counter``; the connection stays usable: the next, honest reply is
    accepted."""
    teacher = FakeTeacher()
    teacher.default = step

    async def body(client):
        rid = await client.submit(TOKENS, CU, POS, k=4)
        with pytest.raises(TeacherError, match=match):
            await client.wait([rid])
        assert client.counters[counter] == 1
        teacher.default = answer()
        rid = await client.submit(TOKENS, CU, POS, k=4)
        arrays = (await client.wait([rid]))[rid].arrays
        assert arrays["ids"].shape == arrays["logprobs"].shape == (len(POS), 4)

    run_client(body, teacher)


@pytest.mark.parametrize("name", ["target_logprobs", "logprobs", "tail_logmass"])
def test_client_never_accepts_a_nan_reply_and_counts_it(name):
    refused_then_usable(poisoned(name, np.nan), f"non-finite targets.*{name}: 1 NaN",
                        "nonfinite_replies")


@pytest.mark.parametrize("bad_id", [VOCAB, -1])
def test_client_never_accepts_ids_outside_the_vocabulary(bad_id):
    # An id past V would index out of bounds in the loss (a device-side assert on CUDA).
    refused_then_usable(poisoned("ids", bad_id), rf"ids outside \[0, {VOCAB}\).*e.g. {bad_id}",
                        "malformed")


def test_client_accepts_minus_inf_tail_when_k_is_the_vocabulary():
    teacher = FakeTeacher()
    teacher.default = poisoned("tail_logmass", -np.inf)

    async def body(client):
        rid = await client.submit(TOKENS, CU, POS, k=VOCAB)
        result = (await client.wait([rid]))[rid]
        assert result.arrays["tail_logmass"][0] == -np.inf
        assert client.counters["nonfinite_replies"] == 0

    run_client(body, teacher)


# -- temperature, sequence length, the deterministic flag ------------------------------------


@pytest.mark.parametrize("temperature", [1e-45, 0.049, 20.5])
def test_temperatures_outside_the_range_never_travel(temperature):
    header = {"v": 1, "t": "SCORE", "id": 7, "student_version": 0, "kind": "topk", "k": 4,
              "temperature": temperature}
    with pytest.raises(m.ProtocolViolation, match="temperature") as info:
        m.parse_header(header)
    assert info.value.code == m.ErrorCode.BAD_REQUEST and info.value.ref_id == 7

    async def body(client):
        with pytest.raises(ProtocolError, match=r"outside \[0.05, 20"):
            await client.submit(TOKENS, CU, POS, k=4, temperature=temperature)

    run_client(body, FakeTeacher())


def test_the_ends_of_the_temperature_range_are_allowed():
    for temperature in (m.TEMPERATURE_MIN, m.TEMPERATURE_MAX):
        assert m.Score(id=1, student_version=0, kind="topk", k=4,
                       temperature=temperature).temperature == temperature


def test_a_sequence_longer_than_the_context_is_too_large_naming_both_numbers():
    limits = Limits().for_context(1024)
    assert (limits.max_seq_len, limits.max_tokens) == (1024, 1024)  # max_tokens follows
    tokens = np.zeros(8192, np.int32)
    frames = encode(m.Score(id=3, student_version=0, kind="topk", k=4),
                    {"tokens": tokens, "cu_seqlens": np.array([0, 8192], np.int32),
                     "positions": np.array([0], np.int32)})
    with pytest.raises(m.ProtocolViolation) as info:
        decode(frames, limits)
    assert info.value.code == m.ErrorCode.TOO_LARGE and info.value.ref_id == 3
    assert "8192 tokens" in str(info.value) and "context is 1024 tokens" in str(info.value)


def test_an_explicit_max_tokens_is_kept_but_sequences_still_fit_the_context():
    limits = Limits(max_tokens=4096).for_context(1024)
    assert (limits.max_tokens, limits.max_seq_len) == (4096, 1024)
    two = {"tokens": np.zeros(2000, np.int32), "cu_seqlens": np.array([0, 1000, 2000], np.int32),
           "positions": np.array([0, 1000], np.int32)}
    decode(encode(m.Score(id=1, student_version=0, kind="topk", k=4), two), limits)  # fits


def test_deterministic_is_off_the_wire_unless_asked_for():
    # A default SCORE is byte-identical to one from before the field existed, so a
    # teacher that predates it still parses it; asked for, the flag travels.
    plain = msgpack.unpackb(encode(m.Score(id=1, student_version=0, kind="topk", k=4))[0])
    assert "deterministic" not in plain
    asked = m.Score(id=1, student_version=0, kind="topk", k=4, deterministic=True)
    header = msgpack.unpackb(encode(asked)[0])
    assert header["deterministic"] is True
    assert m.parse_header(header).deterministic is True
