"""The adapter fields of ``mvl-score/1`` (docs/protocol.md, "Adapters") and the client's
``adapter=`` setting.

What a user relies on: a client or teacher that names no adapter sends the bytes it sent
before the fields existed (HELLO, SCORE, HELLO_OK, STATUS_OK); any adapter name the wire
allows round-trips, and anything else is a ``BAD_REQUEST`` the codec raises as a
``ProtocolViolation``, never another error; ``SyncTeacherClient(adapter=NAME)`` says the
name in HELLO and in every SCORE, exposes ``hello.adapters``, and fails at connect with
``AdapterNotServed`` when the teacher does not serve it, whether the teacher refuses the
HELLO or answers a HELLO_OK that does not list it (a teacher that ignores the field).
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miniverl.common.errors import AdapterNotServed, TeacherError
from miniverl.common.names import NAME
from miniverl.protocol import messages as m
from miniverl.protocol.codec import decode, decode_header_only, encode
from miniverl.protocol.messages import ErrorCode, ProtocolViolation
from miniverl.testing import (
    FAKE_TOKENIZER_FP,
    FAKE_VOCAB,
    FakeBackend,
    FakeTeacher,
    TeacherHarness,
)

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SERVED = {"calc": "sha256:" + "1" * 64, "chat": "sha256:" + "2" * 64}
# Every name the one pattern allows (common/names.py); anything else is BAD_REQUEST.
NAMES = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
ARRAYS = {"tokens": np.arange(6, dtype=np.int32), "cu_seqlens": np.array([0, 6], np.int32),
          "positions": np.arange(5, dtype=np.int32)}


def hello(**fields):
    return m.Hello(id=1, client="s", tokenizer_fp=FAKE_TOKENIZER_FP, vocab_size=32, **fields)


def hello_ok(**fields):
    return m.HelloOk(id=1, teacher=m.TeacherInfo(name="t", model="t"), instance="i", gen=0,
                     tokenizer_fp=FAKE_TOKENIZER_FP, vocab_size=32,
                     kinds=m.Kinds(topk=m.TopkKind(k_max=8)),
                     limits=m.ServerLimits(max_tokens=64, max_positions=64, max_inflight=4),
                     heartbeat_ms=1000, server_version="v", **fields)


def score(**fields):
    return m.Score(id=2, student_version=0, kind="topk", k=4, **fields)


def status_ok(**fields):
    return m.StatusOk(id=3, instance="i", gen=0, state="READY", inflight=0, queue_depth=0,
                      last_progress_ms=0.0, **fields)


@pytest.mark.parametrize("make", [hello, hello_ok, score, status_ok])
def test_a_message_without_adapters_is_the_bytes_it_was_before_them(make):
    # The header an old peer sends: the model's other fields, in order, without the key.
    msg = make()
    header = msg.model_dump(mode="json")
    assert "adapter" not in header and "adapters" not in header
    arrays = ARRAYS if isinstance(msg, m.Score) else None
    specs = [[name, "i4", list(a.shape)] for name, a in (arrays or {}).items()]
    frames = encode(msg, arrays)
    assert frames[0] == msgpack.packb({**header, "arrays": specs})
    assert decode(frames)[0] == msg


def test_hello_and_score_without_an_adapter_are_the_literal_v1_headers():
    # Spelled out as a client written from docs/protocol.md before the field sends them.
    old_hello = {"v": 1, "id": 1, "t": "HELLO", "client": "s", "tokenizer_fp": FAKE_TOKENIZER_FP,
                 "vocab_size": 32, "arrays": []}
    assert encode(hello())[0] == msgpack.packb(old_hello)
    old_score = {"v": 1, "id": 2, "t": "SCORE", "student_version": 0, "kind": "topk", "k": 4,
                 "temperature": 1.0, "deadline_ms": None,
                 "arrays": [["tokens", "i4", [6]], ["cu_seqlens", "i4", [2]],
                            ["positions", "i4", [5]]]}
    assert encode(score(), ARRAYS)[0] == msgpack.packb(old_score)


@FAST
@given(name=NAMES)
def test_any_wire_name_round_trips_in_hello_and_score(name):
    for msg in (hello(adapter=name), score(adapter=name)):
        frames = encode(msg, ARRAYS if isinstance(msg, m.Score) else None)
        assert decode_header_only(frames[0])["adapter"] == name
        assert decode(frames)[0] == msg


@FAST
@given(adapters=st.lists(st.tuples(NAMES, NAMES), max_size=m.MAX_ADAPTERS))
def test_adapter_lists_round_trip_in_hello_ok_and_status_ok(adapters):
    listed = [m.AdapterInfo(name=name, adapter_sha256=digest) for name, digest in adapters]
    for msg in (hello_ok(adapters=listed), status_ok(adapters=listed)):
        frames = encode(msg)
        if len(frames[0]) > 65536:  # long names: the header's own limit answers
            continue
        assert decode(frames)[0] == msg


INTS = st.integers(-(2**63), 2**63 - 1)  # what msgpack packs
# A name outside the pattern (a path, an empty or an overlong one) is as malformed as a
# number: a peer's adapter name never reaches a path or a log as anything else.
HOSTILE_NAMES = (st.sampled_from(["", "../x", "a/b", ".hidden", "-x", "a=b", "a b", "x" * 65,
                                  "calc\n", "\u00e9"])
                 | st.text(min_size=1).filter(lambda t: not NAME.fullmatch(t)))
BAD_VALUES = (st.booleans() | INTS | st.floats() | st.text(min_size=1025, max_size=1100)
              | HOSTILE_NAMES
              | st.lists(INTS, min_size=1, max_size=3)
              | st.dictionaries(st.text(max_size=4), INTS, max_size=2))


@FAST
@given(value=BAD_VALUES, t=st.sampled_from(["HELLO", "SCORE", "HELLO_OK", "STATUS_OK"]))
def test_a_malformed_adapter_field_is_bad_request(value, t):
    base = {"HELLO": hello, "SCORE": score, "HELLO_OK": hello_ok, "STATUS_OK": status_ok}[t]
    header = base().model_dump(mode="json")
    header["adapters" if t in ("HELLO_OK", "STATUS_OK") else "adapter"] = value
    if t == "SCORE":
        specs = [[name, "i4", list(a.shape)] for name, a in ARRAYS.items()]
        frames = [msgpack.packb({**header, "arrays": specs}),
                  *(a.tobytes() for a in ARRAYS.values())]
    else:
        frames = [msgpack.packb({**header, "arrays": []})]
    with pytest.raises(ProtocolViolation) as info:
        decode(frames)
    assert info.value.code == ErrorCode.BAD_REQUEST


def test_more_than_64_adapters_are_refused_on_the_wire():
    many = [m.AdapterInfo(name=str(i), adapter_sha256="d") for i in range(m.MAX_ADAPTERS + 1)]
    header = hello_ok().model_dump(mode="json")
    header["adapters"] = [a.model_dump() for a in many]
    with pytest.raises(ProtocolViolation, match="adapters"):
        decode([msgpack.packb({**header, "arrays": []})])


@pytest.fixture
def served():
    backend = FakeBackend(adapters=SERVED)
    with TeacherHarness(backend=backend) as h:
        yield h, backend


def test_the_client_says_its_adapter_in_hello_and_every_score(served):
    h, backend = served
    with h.client(adapter="chat") as client:
        assert [(a.name, a.adapter_sha256) for a in client.hello.adapters] == list(SERVED.items())
        assert client.hello.teacher.adapter_sha256 == SERVED["chat"]
        assert client.hello.teacher.name == "fake/chat"
        ids = [client.submit(ARRAYS["tokens"], ARRAYS["cu_seqlens"], ARRAYS["positions"], k=4)
               for _ in range(3)]
        client.wait(ids)
    assert {adapter for batch in backend.batch_adapters for adapter in batch} == {"chat"}


@pytest.mark.parametrize("adapters", [SERVED, None], ids=["other-adapters", "no-adapters"])
def test_an_adapter_the_teacher_does_not_serve_fails_connect(adapters):
    with TeacherHarness(backend=FakeBackend(adapters=adapters)) as h:
        client = h.client(adapter="nope")
        with pytest.raises(AdapterNotServed) as info:
            client.connect(timeout_s=5)
    message = str(info.value)
    assert "'nope'" in message and "\n" not in message
    if adapters:
        assert "'calc', 'chat'" in message
    else:
        assert "serves no named adapters" in message
    assert isinstance(info.value, TeacherError)


def test_a_hello_ok_without_the_adapter_fails_connect():
    # A teacher that predates the field or ignores it (the scriptable fake answers any
    # HELLO with a HELLO_OK listing nothing): the client checks the list itself.
    teacher = FakeTeacher()
    from miniverl.protocol.sync_client import SyncTeacherClient

    client = SyncTeacherClient("tcp://127.0.0.1:5555", tokenizer_fp=FAKE_TOKENIZER_FP,
                               vocab_size=FAKE_VOCAB, adapter="calc",
                               transport_factory=teacher.transport_factory)
    try:
        with pytest.raises(AdapterNotServed, match="does not serve adapter 'calc'; it serves "
                                                   "no named adapters"):
            client.connect(timeout_s=5)
    finally:
        client.close()
