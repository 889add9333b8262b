"""The ``xvocab`` kind of ``mvl-score/1`` (docs/protocol.md, "xvocab"): negotiated in
HELLO, refused where it was not, computed by the real teacher server over its own
tokenizer, and checked by the client like a stale reply when it names another request.

The old handshake is replayed from ``fixtures/hello_pair_v1.json``: the HELLO and the
HELLO_OK frames the code sent before the kind existed (commit 3c5085d), which an old
client and a new teacher must still exchange byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from miniverl.common.alignment import align_episode
from miniverl.common.errors import ProtocolError, TokenizerMismatch
from miniverl.protocol import messages as m
from miniverl.protocol.codec import decode, encode
from miniverl.protocol.pending import PendingTable
from miniverl.protocol.xvocab import (
    alignment_of_groups,
    groups_of_alignment,
    xvocab_request,
)
from miniverl.testing import FAKE_TOKENIZER_FP, FAKE_VOCAB, FakeBackend, TeacherHarness
from tests.common.cross_tokenizer_kit import (
    LOADERS,
    SKIPS,
    TOOLS,
    byte_fallback_tokenizer,
    hostile_episode,
    toy_tokenizer,
)

FIXTURE = Path(__file__).parent / "fixtures" / "hello_pair_v1.json"
TEACHER_FP = "sha256:" + "cd" * 32


def _teacher_backend() -> FakeBackend:
    tok = byte_fallback_tokenizer()
    return FakeBackend(tokenizer=tok, tokenizer_fp=TEACHER_FP, vocab_size=len(tok))


@pytest.fixture
def served():
    made = []

    def make(backend, **config):
        h = TeacherHarness(backend=backend, **config)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def _raw_hello(conn, *, fp=FAKE_TOKENIZER_FP, vocab=FAKE_VOCAB, understands=None, rid=1):
    header = {"v": 1, "t": "HELLO", "id": rid, "client": "test", "tokenizer_fp": fp,
              "vocab_size": vocab}
    if understands is not None:
        header["understands"] = understands
    return conn.call(header)[0]


def test_old_client_handshake_is_byte_for_byte_unchanged(served):
    record = json.loads(FIXTURE.read_text())
    hello_frames = [bytes.fromhex(f) for f in record["hello"]]
    # The HELLO a client builds without the opt-in (protocol/link.py) is the recorded one.
    hello = m.Hello(id=1, client="student", tokenizer_fp=FAKE_TOKENIZER_FP,
                    vocab_size=FAKE_VOCAB, understands=None)
    assert [bytes(f) for f in encode(hello)] == hello_frames
    # A teacher that can serve xvocab answers the recorded HELLO with the recorded HELLO_OK.
    tok = byte_fallback_tokenizer()
    backend = FakeBackend(tokenizer=tok)
    assert backend.vocab_size == FAKE_VOCAB
    h = served(backend, server_version=record["server_version"])
    h.server.srv.instance = record["instance"]
    conn = h.raw()
    conn.send_multipart(hello_frames)
    reply = conn.recv_multipart()
    assert [bytes(f) for f in reply] == [bytes.fromhex(f) for f in record["hello_ok"]]
    assert decode(reply)[0].kinds.xvocab is None


def test_hello_ok_advertises_xvocab_only_to_a_client_that_announced_it(served):
    h = served(_teacher_backend())
    ok = _raw_hello(h.raw(), fp=TEACHER_FP, vocab=len(byte_fallback_tokenizer()),
                    understands=["xvocab"])
    assert ok.t == "HELLO_OK" and ok.kinds.xvocab is not None
    assert ok.kinds.xvocab.max_episode_bytes >= 1 << 16
    plain = _raw_hello(h.raw(), fp=TEACHER_FP, vocab=len(byte_fallback_tokenizer()))
    assert plain.t == "HELLO_OK" and plain.kinds.xvocab is None
    assert "xvocab" not in m.header_dict(plain)["kinds"]


def test_hello_understands_is_validated():
    with pytest.raises(m.ProtocolViolation, match="understands"):
        m.parse_header({"v": 1, "t": "HELLO", "id": 1, "client": "c", "tokenizer_fp": "x",
                        "vocab_size": 3, "understands": ["everything"]})
    with pytest.raises(m.ProtocolViolation, match="understands"):
        m.parse_header({"v": 1, "t": "HELLO", "id": 1, "client": "c", "tokenizer_fp": "x",
                        "vocab_size": 3, "understands": []})


def test_tokenizer_mismatch_without_the_opt_in_is_refused_as_before(served):
    h = served(_teacher_backend())
    reply = _raw_hello(h.raw())  # another tokenizer, no understands
    assert reply.t == "ERROR" and reply.code == m.ErrorCode.TOKENIZER_MISMATCH
    assert "cross-tokenizer distillation is refused" in reply.message
    client = h.client(tokenizer_fp=FAKE_TOKENIZER_FP, vocab_size=FAKE_VOCAB)
    with pytest.raises(TokenizerMismatch, match="cross-tokenizer distillation is refused"):
        client.connect(timeout_s=5)


def test_opt_in_to_a_teacher_without_a_tokenizer_is_still_a_mismatch(served):
    h = served(FakeBackend(tokenizer_fp=TEACHER_FP))  # no tokenizer: no xvocab
    reply = _raw_hello(h.raw(), understands=["xvocab"])
    assert reply.t == "ERROR" and reply.code == m.ErrorCode.TOKENIZER_MISMATCH


def _episode_arrays():
    req = xvocab_request(toy_tokenizer(), hostile_episode("Café 👍🏽 done."), TOOLS)
    return req, {name: req[name] for name in ("episode", "student_cuts", "student_pieces")}


def test_xvocab_on_a_connection_that_did_not_negotiate_it_is_an_error(served):
    h = served(FakeBackend(tokenizer=byte_fallback_tokenizer()))
    conn = h.raw()
    assert _raw_hello(conn).t == "HELLO_OK"  # same tokenizer, no understands
    _, arrays = _episode_arrays()
    reply, _ = conn.call({"v": 1, "t": "SCORE", "id": 2, "student_version": 0,
                          "kind": "xvocab", "k": 4, "temperature": 1.0}, arrays)
    assert reply.t == "ERROR" and reply.code == m.ErrorCode.UNSUPPORTED
    assert "'xvocab' was not negotiated" in reply.message and not reply.retryable


def test_token_id_targets_are_refused_for_a_student_with_another_tokenizer(served):
    h = served(_teacher_backend())
    conn = h.raw()
    assert _raw_hello(conn, understands=["xvocab"]).t == "HELLO_OK"
    arrays = {"tokens": np.arange(6, dtype=np.int32), "cu_seqlens": np.array([0, 6], np.int32),
              "positions": np.array([0, 1], np.int32)}
    reply, _ = conn.call({"v": 1, "t": "SCORE", "id": 2, "student_version": 0, "kind": "topk",
                          "k": 2, "temperature": 1.0}, arrays)
    assert reply.t == "ERROR" and reply.code == m.ErrorCode.UNSUPPORTED
    assert "ask for kind 'xvocab'" in reply.message


@pytest.mark.parametrize("teacher_name", ["byte_fallback", "qwen3"])
def test_xvocab_round_trip_matches_the_local_alignment(served, teacher_name):
    teacher_tok = LOADERS[teacher_name]()
    if teacher_tok is None:
        pytest.skip(SKIPS[teacher_name])  # Qwen3's: tests/extras.py names the install
    h = served(FakeBackend(tokenizer=teacher_tok, tokenizer_fp=TEACHER_FP,
                           vocab_size=len(teacher_tok)))
    messages = hostile_episode("Café 👍🏽 done.")
    req, arrays = _episode_arrays()
    with h.client(tokenizer_fp=FAKE_TOKENIZER_FP, vocab_size=FAKE_VOCAB, xvocab=True) as client:
        assert client.hello.tokenizer_fp == TEACHER_FP and client.hello.kinds.xvocab
        with pytest.raises(ProtocolError, match="kind='xvocab'"):
            client.submit(np.arange(4), np.array([0, 4]), np.array([0]), kind="topk", k=2)
        rid = client.submit_xvocab(arrays["episode"], arrays["student_cuts"],
                                   arrays["student_pieces"], k=4)
        result = client.wait([rid], timeout_s=10)[rid]
    local = align_episode(toy_tokenizer(), teacher_tok, messages, TOOLS)
    got = result.arrays
    assert result.kind == "xvocab"
    np.testing.assert_array_equal(got["teacher_ids"], local["teacher_ids"])
    np.testing.assert_array_equal(got["groups"], groups_of_alignment(local["alignment"]))
    assert alignment_of_groups(got["groups"]).digest() == local["alignment"].digest()
    # Every scored position predicts a teacher token of a trainable group.
    group_T = local["alignment"].teacher_group_T()
    assert got["positions"].size and np.all(local["alignment"].trainable_G[
        group_T[got["positions"] + 1]])
    # The fake backend is sure of the next token: its top-1 is the teacher's own token.
    np.testing.assert_array_equal(got["ids"][:, 0], got["teacher_ids"][got["positions"] + 1])
    assert np.isfinite(got["target_logprobs"]).all()


def test_an_episode_the_student_pieces_do_not_hold_is_bad_request(served):
    h = served(_teacher_backend())
    conn = h.raw()
    assert _raw_hello(conn, understands=["xvocab"]).t == "HELLO_OK"
    _, arrays = _episode_arrays()
    pieces = arrays["student_pieces"].copy()
    pieces[1, 2] += 1  # claims the content starts one byte later
    reply, _ = conn.call({"v": 1, "t": "SCORE", "id": 3, "student_version": 0,
                          "kind": "xvocab", "k": 4, "temperature": 1.0},
                         {**arrays, "student_pieces": pieces})
    assert reply.t == "ERROR" and reply.code == m.ErrorCode.BAD_REQUEST
    assert "student piece 1" in reply.message
    bad_json = {**arrays, "episode": np.frombuffer(b'{"messages": NaN}', np.uint8)}
    reply, _ = conn.call({"v": 1, "t": "SCORE", "id": 4, "student_version": 0,
                          "kind": "xvocab", "k": 4, "temperature": 1.0}, bad_json)
    assert reply.t == "ERROR" and reply.code == m.ErrorCode.BAD_REQUEST
    assert "not UTF-8 JSON" in reply.message


def test_an_episode_the_template_cannot_render_is_bad_request_not_silence(served):
    h = served(_teacher_backend())
    conn = h.raw()
    assert _raw_hello(conn, understands=["xvocab"]).t == "HELLO_OK"
    episode = {"messages": [{"role": "assistant", "content": "x", "tool_calls": ["oops"]}],
               "tools": None, "text": "x"}
    arrays = {"episode": np.frombuffer(json.dumps(episode).encode(), np.uint8),
              "student_cuts": np.array([0, 1], np.int32),
              "student_pieces": np.array([[0, 1, 0]], np.int32)}
    reply, _ = conn.call({"v": 1, "t": "SCORE", "id": 5, "student_version": 0,
                          "kind": "xvocab", "k": 4, "temperature": 1.0}, arrays)
    assert reply.t == "ERROR" and reply.code == m.ErrorCode.BAD_REQUEST
    assert "cannot be aligned" in reply.message


def _reply_for(digest: str, groups: np.ndarray, n_teacher: int, rid: int = 7):
    alignment = alignment_of_groups(groups)
    msg = m.ScoreOk(id=rid, student_version=0, instance="i", gen=0, kind="xvocab", k=2,
                    timing={"queue_ms": 0.0, "compute_ms": 0.0}, episode_sha256=digest,
                    alignment_sha256=alignment.digest())
    arrays = {"teacher_ids": np.zeros(n_teacher, np.int32), "groups": groups,
              "positions": np.array([0], np.int32), "ids": np.zeros((1, 2), np.int32),
              "logprobs": np.log(np.full((1, 2), 0.25, np.float32)),
              "tail_logmass": np.log(np.full(1, 0.5, np.float32)),
              "target_logprobs": np.log(np.full(1, 0.25, np.float32))}
    return msg, arrays


def test_a_reply_for_another_episode_is_dropped_like_a_stale_one():
    table = PendingTable()
    groups = np.array([[0, 2, 0, 3, 2, 1]], np.int32)
    table.file_score([b""], rid=7, kind="xvocab", k=2, positions=2, digest="sha256:" + "1" * 64)
    msg, arrays = _reply_for("sha256:" + "2" * 64, groups, 3)
    table.on_score_ok(msg, arrays, vocab_size=32, teacher_vocab_size=40)
    assert table.counters()["stale_dropped"] == 1
    assert table._rows[7].open  # still waiting for the reply to what was sent
    msg, arrays = _reply_for("sha256:" + "1" * 64, groups, 3)
    table.on_score_ok(msg, arrays, vocab_size=32, teacher_vocab_size=40)
    assert not table._rows[7].open and table._rows[7].error is None


def test_xvocab_reply_whose_groups_do_not_tile_is_malformed():
    table = PendingTable()
    digest = "sha256:" + "1" * 64
    table.file_score([b""], rid=7, kind="xvocab", k=2, positions=3, digest=digest)
    msg, arrays = _reply_for(digest, np.array([[0, 2, 0, 3, 2, 1]], np.int32), 3)
    table.on_score_ok(msg, arrays, vocab_size=32, teacher_vocab_size=40)  # 2 of 3 students
    assert table.counters()["malformed"] == 1 and table._rows[7].open


def test_score_ok_digests_belong_to_xvocab_alone():
    with pytest.raises(m.ProtocolViolation, match="episode_sha256"):
        m.parse_header({"v": 1, "t": "SCORE_OK", "id": 1, "student_version": 0,
                        "instance": "i", "gen": 0, "kind": "xvocab", "k": 2,
                        "timing": {"queue_ms": 0.0, "compute_ms": 0.0}})
    plain = m.ScoreOk(id=1, student_version=0, instance="i", gen=0, kind="topk", k=2,
                      timing={"queue_ms": 0.0, "compute_ms": 0.0})
    assert "episode_sha256" not in m.header_dict(plain)
