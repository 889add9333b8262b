"""Message models, SCORE semantics, limits and endpoint rules of mvl-score/1.

The properties pinned here are the ones a hand-written client relies on: the field
names of docs/protocol.md on the wire, the error code for each kind of bad request, and
the bind rules that keep a teacher off the network without CURVE keys.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from miniverl.common.errors import ConfigError
from miniverl.protocol import checks
from miniverl.protocol import messages as m
from miniverl.protocol.endpoints import (
    check_bind_endpoint,
    check_endpoint,
    ipc_endpoint,
    load_curve_client_keys,
    load_curve_server_keys,
)
from miniverl.protocol.limits import Limits

VOCAB = 16


def score_arrays(tokens=(1, 2, 3, 4, 5, 6), cu=(0, 3, 6), positions=(0, 1, 3, 4)):
    return {
        "tokens": np.array(tokens, np.int32),
        "cu_seqlens": np.array(cu, np.int32),
        "positions": np.array(positions, np.int32),
    }


def score(**kw):
    fields = dict(id=5, student_version=0, kind="topk", k=4)
    fields.update(kw)
    return m.Score(**fields)


def test_every_design_type_has_a_model_with_design_field_names():
    assert set(m.MESSAGE_TYPES) == {
        "HELLO", "HELLO_OK", "SCORE", "SCORE_OK", "ERROR", "PING", "PONG", "STATUS",
        "STATUS_OK", "RELOAD", "RELOAD_OK", "PARK", "PARK_OK", "WAKE", "WAKE_OK",
        "SHUTDOWN", "SHUTDOWN_OK",
    }  # fmt: skip
    assert {"client", "tokenizer_fp", "vocab_size"} <= set(m.Hello.model_fields)
    assert {"student_version", "kind", "k", "temperature", "deadline_ms"} <= set(
        m.Score.model_fields
    )
    assert {"ref_id", "code", "message", "retryable", "instance", "gen"} <= set(
        m.ErrorReply.model_fields
    )
    assert {c.value for c in m.ErrorCode} >= {"NEED_HELLO", "TOKENIZER_MISMATCH", "UNAUTHORIZED"}
    assert [s.value for s in m.TeacherState] == [
        "LOADING", "READY", "RELOADING", "PARKED", "DRAINING",
    ]  # fmt: skip


def test_parse_header_dispatches_on_t_and_round_trips():
    msg = m.parse_header({"v": 1, "t": "HELLO", "id": 1, "client": "s", "tokenizer_fp": "fp",
                          "vocab_size": 8, "arrays": []})  # fmt: skip
    assert isinstance(msg, m.Hello) and msg.client == "s"
    err = m.parse_header({"v": 1, "t": "ERROR", "id": None, "ref_id": None,
                          "code": "BAD_REQUEST", "message": "x"})  # fmt: skip
    assert err.code is m.ErrorCode.BAD_REQUEST
    assert m.parse_header(m.header_dict(err)) == err


@pytest.mark.parametrize(
    "header, code",
    [
        ({"v": 2, "t": "PING", "id": 1}, m.ErrorCode.VERSION_MISMATCH),
        ({"v": "1", "t": "PING", "id": 1}, m.ErrorCode.VERSION_MISMATCH),
        ({"t": "PING", "id": 1}, m.ErrorCode.BAD_REQUEST),
        ({"v": 1, "t": "NOPE", "id": 1}, m.ErrorCode.BAD_REQUEST),
        ({"v": 1, "t": "PING", "id": 1, "extra": 0}, m.ErrorCode.BAD_REQUEST),
        ({"v": 1, "t": "PING"}, m.ErrorCode.BAD_REQUEST),
        ({"v": 1, "t": "PING", "id": True}, m.ErrorCode.BAD_REQUEST),
        ({"v": 1, "t": "SCORE", "id": 1, "student_version": 0, "kind": "topk", "k": 0},
         m.ErrorCode.BAD_REQUEST),
        ({"v": 1, "t": "SCORE", "id": 1, "student_version": 0, "kind": "full"},
         m.ErrorCode.BAD_REQUEST),
        ({"v": 1, "t": "ERROR", "id": 1, "code": "OOPS", "message": ""}, m.ErrorCode.BAD_REQUEST),
        ([1, 2], m.ErrorCode.BAD_REQUEST),
    ],
)  # fmt: skip
def test_parse_header_error_codes(header, code):
    with pytest.raises(m.ProtocolViolation) as info:
        m.parse_header(header)
    assert info.value.code == code
    if isinstance(header, dict) and type(header.get("id")) is int:
        assert info.value.ref_id == header["id"]


def test_validate_score_accepts_a_packed_batch():
    checks.validate_score(score(), score_arrays(), VOCAB)


@pytest.mark.parametrize(
    "arrays, needle",
    [
        (score_arrays(tokens=(1, 2, 3, 4, 5, VOCAB)), "token ids"),
        (score_arrays(tokens=(1, 2, 3, 4, 5, -1)), "token ids"),
        (score_arrays(cu=(1, 3, 6)), "start at 0"),
        (score_arrays(cu=(0, 3, 5)), "end at N"),
        (score_arrays(cu=(0, 4, 3, 6)), "non-decreasing"),
        (score_arrays(positions=(2,)), "position 2"),  # last token of sequence 0
        (score_arrays(positions=(5,)), "position 5"),  # last token overall
        (score_arrays(positions=(-1,)), "position -1"),
        (score_arrays(positions=(99,)), "position 99"),
        (score_arrays(positions=()), "empty"),
        (score_arrays(cu=(0,)), "B\\+1"),
    ],
)  # fmt: skip
def test_validate_score_refuses_bad_requests(arrays, needle):
    with pytest.raises(m.ProtocolViolation, match=needle) as info:
        checks.validate_score(score(), arrays, VOCAB)
    assert info.value.code == m.ErrorCode.BAD_REQUEST and info.value.ref_id == 5


def test_validate_score_limits_and_kinds():
    with pytest.raises(m.ProtocolViolation) as info:
        checks.validate_score(score(k=8), score_arrays(), VOCAB, Limits(max_k=4))
    assert info.value.code == m.ErrorCode.TOO_LARGE
    with pytest.raises(m.ProtocolViolation, match="vocabulary"):
        checks.validate_score(score(k=VOCAB + 1), score_arrays(), VOCAB)
    with pytest.raises(m.ProtocolViolation) as info:
        checks.validate_score(score(), score_arrays(), VOCAB, Limits(max_tokens=4))
    assert info.value.code == m.ErrorCode.TOO_LARGE
    with pytest.raises(m.ProtocolViolation) as info:
        checks.validate_score(score(kind="exact", k=0), score_arrays(), VOCAB, Limits(max_exact_vocab=8))
    assert info.value.code == m.ErrorCode.UNSUPPORTED
    checks.validate_score(score(kind="exact", k=0), score_arrays(), VOCAB)


def test_limits_narrow_to_what_the_teacher_advertised():
    hello = m.HelloOk(
        id=1,
        teacher={"name": "t", "model": "m"},
        instance="i",
        gen=0,
        tokenizer_fp="fp",
        vocab_size=8,
        kinds={"topk": {"k_max": 32}, "exact": None},
        limits={"max_tokens": 100, "max_positions": 50, "max_inflight": 2},
        heartbeat_ms=1000,
        server_version="x",
    )
    limits = Limits.from_hello(hello)
    assert (limits.max_tokens, limits.max_positions, limits.max_inflight, limits.max_k) == (
        100, 50, 2, 32,
    )  # fmt: skip


def test_bind_rules(tmp_path):
    assert check_bind_endpoint("tcp://127.0.0.1:5555", curve_configured=False)
    assert check_bind_endpoint("tcp://[::1]:5555", curve_configured=False)
    assert check_bind_endpoint("tcp://localhost:5555", curve_configured=False)
    for endpoint in ("tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://10.1.2.3:5555"):
        with pytest.raises(ConfigError, match="CURVE"):
            check_bind_endpoint(endpoint, curve_configured=False)
        assert check_bind_endpoint(endpoint, curve_configured=True) == endpoint
    sock_dir = tmp_path / "run" / "sub"
    check_bind_endpoint(f"ipc://{sock_dir}/teacher.sock", curve_configured=False)
    assert stat.S_IMODE(os.stat(sock_dir).st_mode) == 0o700
    assert ipc_endpoint(tmp_path).endswith("/teacher.sock")
    for bad in ("127.0.0.1:5555", "udp://x:1", "tcp://host", "tcp://h:99999", "ipc://" + "a" * 200):
        with pytest.raises(ConfigError):
            check_endpoint(bad)


def test_curve_keys_load_from_zmq_certificates(tmp_path):
    import zmq.auth

    server_public, server_secret = zmq.auth.create_certificates(tmp_path, "server")
    clients = tmp_path / "clients"
    clients.mkdir()
    client_public, client_secret = zmq.auth.create_certificates(tmp_path, "client")
    os.replace(client_public, clients / "client.key")
    keys = load_curve_server_keys(server_secret, clients)
    assert keys.secret and keys.public and keys.authorized_dir == clients
    client = load_curve_client_keys(client_secret, server_public)
    assert client.server_public == keys.public
    with pytest.raises(ConfigError, match="secret"):
        load_curve_server_keys(server_public, clients)
    with pytest.raises(ConfigError, match="authorized"):
        load_curve_server_keys(server_secret, tmp_path / "nowhere")


def test_replies_dropped_is_on_the_wire_only_when_a_reply_was_dropped():
    from miniverl.protocol.messages import Counters

    assert "replies_dropped" not in Counters().model_dump(mode="json")
    assert Counters(replies_dropped=3).model_dump(mode="json")["replies_dropped"] == 3
    for counters in (Counters(), Counters(replies_dropped=3)):
        assert Counters.model_validate(counters.model_dump(mode="json")) == counters
