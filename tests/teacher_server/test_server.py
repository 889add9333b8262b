"""The server loop and admission, in ``miniverl.testing``'s harness with its numpy backend.

HELLO/SCORE/PING/STATUS, the per-client limit, resends, every refusal a malformed or
hostile message gets, and the bind rules. Each test runs a real TeacherServer and
talks to it through a raw in-memory connection (``harness.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

from miniverl.common.errors import ConfigError
from miniverl.protocol.codec import encode
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import TeacherState
from miniverl.teacher_server.server import TeacherServer
from miniverl.teacher_server.server_state import ServerConfig
from miniverl.testing import FakeBackend
from tests.teacher_server.harness import (
    FP,
    VOCAB,
    busy,
    call,
    hello,
    recv,
    score_arrays,
    score_header,
    send,
)


def test_hello_score_ping_status(harness):
    h, backend = harness()
    sock = h.raw()
    ok = hello(sock)
    assert ok.t == "HELLO_OK" and ok.tokenizer_fp == FP and ok.vocab_size == VOCAB
    assert ok.instance == h.instance and ok.gen == 0
    assert ok.kinds.exact is not None and ok.kinds.exact.max_vocab >= VOCAB
    msg, arrays = call(sock, score_header(2), score_arrays())
    assert msg.t == "SCORE_OK" and msg.id == 2 and msg.student_version == 3 and msg.k == 4
    assert arrays["ids"].shape == (3, 4) and arrays["tail_logmass"].dtype == np.float32
    msg, arrays = call(sock, score_header(3, kind="exact", k=0), score_arrays())
    assert msg.t == "SCORE_OK" and arrays["logprobs"].shape == (3, VOCAB)
    pong, _ = call(sock, {"v": 1, "t": "PING", "id": 4})
    assert pong.t == "PONG" and pong.state == TeacherState.READY and pong.inflight == 0
    status, _ = call(sock, {"v": 1, "t": "STATUS", "id": 5})
    assert status.counters.requests == 2 and status.counters.positions == 6
    assert status.counters.bytes_received > 0 and status.teacher.name == "fake"
    assert status.memory.device == "cpu"


def test_ping_answered_while_a_batch_computes(harness):
    h, backend, gate, sock = busy(harness, first_id=2)
    t0 = time.monotonic()
    pong, _ = call(sock, {"v": 1, "t": "PING", "id": 3}, timeout_s=2)
    assert time.monotonic() - t0 < 1.0
    assert pong.t == "PONG" and pong.inflight == 1 and pong.last_progress_ms >= 0
    gate.set()
    msg, _ = recv(sock)
    assert msg.t == "SCORE_OK" and msg.id == 2


def test_overloaded_beyond_max_inflight(harness):
    gate = threading.Event()
    h, backend = harness(FakeBackend(gate=gate), limits=Limits(max_inflight=2))
    sock = h.raw()
    hello(sock)
    for rid in (10, 11, 12):
        send(sock, score_header(rid), score_arrays())
    err, _ = recv(sock)
    assert err.t == "ERROR" and err.code.value == "OVERLOADED" and err.id == 12 and err.retryable
    other = h.raw()  # the limit is per client
    hello(other)
    send(other, score_header(10), score_arrays())
    gate.set()
    got = sorted(recv(sock)[0].id for _ in range(2))
    assert got == [10, 11]
    assert recv(other)[0].t == "SCORE_OK"


def test_duplicate_ids_are_not_computed_twice(harness):
    h, backend, gate, sock = busy(harness, first_id=7)
    send(sock, score_header(7), score_arrays())  # resent while in flight
    pong, _ = call(sock, {"v": 1, "t": "PING", "id": 8})  # the resend has been read
    assert pong.inflight == 1
    gate.set()
    first, arrays1 = recv(sock)
    assert first.t == "SCORE_OK" and first.id == 7
    assert recv(sock, 0.3) is None  # one reply only
    again, arrays2 = call(sock, score_header(7), score_arrays())  # resent after the answer
    assert again == first and np.array_equal(arrays1["ids"], arrays2["ids"])
    assert sum(batch.count(7) for batch in backend.batches) == 1


def test_need_hello_version_mismatch_and_tokenizer_mismatch(harness):
    h, _ = harness()
    sock = h.raw()
    err, _ = call(sock, score_header(1), score_arrays())
    assert err.code.value == "NEED_HELLO" and err.id == 1 and err.ref_id == 1
    err, _ = call(sock, {"v": 2, "t": "PING", "id": 2})
    assert err.code.value == "VERSION_MISMATCH" and err.id == 2
    other_fp = "sha256:" + "ee" * 32
    err = hello(sock, fp=other_fp, rid=3)
    assert err.code.value == "TOKENIZER_MISMATCH" and FP in err.message and other_fp in err.message
    err = hello(sock, vocab=VOCAB + 1, rid=4)
    assert err.code.value == "TOKENIZER_MISMATCH"
    err, _ = call(sock, score_header(5), score_arrays())
    assert err.code.value == "NEED_HELLO"  # a refused HELLO does not count


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda hd, ar: ({**hd, "t": "NOPE"}, ar), "BAD_REQUEST"),
        (lambda hd, ar: ({**hd, "extra": 1}, ar), "BAD_REQUEST"),
        (lambda hd, ar: (hd, {**ar, "tokens": ar["tokens"] + VOCAB}), "BAD_REQUEST"),
        (lambda hd, ar: (hd, {**ar, "positions": np.array([11], np.int32)}), "BAD_REQUEST"),
        (lambda hd, ar: (hd, {**ar, "positions": np.array([-1], np.int32)}), "BAD_REQUEST"),
        (lambda hd, ar: (hd, {**ar, "cu_seqlens": np.array([0, 5], np.int32)}), "BAD_REQUEST"),
        (lambda hd, ar: (hd, {k: v for k, v in ar.items() if k != "positions"}), "BAD_REQUEST"),
        (lambda hd, ar: ({**hd, "k": 0}, ar), "BAD_REQUEST"),
        (lambda hd, ar: ({**hd, "k": VOCAB + 1}, ar), "BAD_REQUEST"),
        (lambda hd, ar: ({**hd, "k": 100000}, ar), "TOO_LARGE"),
        (lambda hd, ar: ({**hd, "t": "HELLO_OK"}, ar), "BAD_REQUEST"),
    ],
)
def test_bad_requests_get_error_with_id(harness, mutate, code):
    h, _ = harness()
    sock = h.raw()
    hello(sock)
    header, arrays = mutate(score_header(42), score_arrays())
    err, _ = call(sock, header, arrays)
    assert err.t == "ERROR" and err.code.value == code and err.ref_id == 42, err.message


def test_frames_that_break_the_codec(harness):
    h, _ = harness()
    sock = h.raw()
    hello(sock)
    frames = encode(score_header(9), score_arrays())
    sock.send_multipart(frames[:-1])  # one data frame missing
    err, _ = recv(sock)
    assert err.code.value == "BAD_REQUEST" and err.id == 9
    sock.send_multipart([frames[0], frames[1], frames[2], b"\x00" * 5])  # size mismatch
    assert recv(sock)[0].code.value == "BAD_REQUEST"
    sock.send_multipart([b"\xc1\xff garbage"])  # no header parses: dropped silently
    assert recv(sock, 0.2) is None
    sock.send_multipart([msgpack.packb({"v": 1, "t": "PING"})])  # a map without an id
    err, _ = recv(sock)
    assert err.t == "ERROR" and err.id is None and err.ref_id is None
    assert call(sock, {"v": 1, "t": "PING", "id": 10})[0].t == "PONG"


def _fuzz_messages(rng: np.random.Generator, n: int):
    valid = encode(score_header(1), score_arrays())
    head = bytes(valid[0])
    for i in range(n):
        choice = i % 6
        if choice == 0:  # random bytes
            yield [rng.bytes(int(rng.integers(0, 64)))]
        elif choice == 1:  # bit flips in a valid header
            buf = bytearray(head)
            for _ in range(int(rng.integers(1, 6))):
                buf[int(rng.integers(0, len(buf)))] = int(rng.integers(0, 256))
            yield [bytes(buf), *(bytes(f) for f in valid[1:])]
        elif choice == 2:  # truncated header
            yield [head[: int(rng.integers(0, len(head)))], *(bytes(f) for f in valid[1:])]
        elif choice == 3:  # wrong frame count or sizes
            frames = [head, *(bytes(f) for f in valid[1:])]
            cut = int(rng.integers(0, len(frames)))
            extra = [rng.bytes(int(rng.integers(0, 16)))] * int(rng.integers(0, 3))
            yield (frames[:cut] + extra) or [b""]
        elif choice == 4:  # random maps with plausible keys and values
            keys = ["v", "t", "id", "kind", "k", "arrays", "temperature", "student_version", "x"]
            values = [1, -1, "SCORE", "PING", None, 2**63, [1], {"a": 1}, 1.5, True]
            header = {
                keys[int(rng.integers(len(keys)))]: values[int(rng.integers(len(values)))]
                for _ in range(int(rng.integers(0, 6)))
            }
            yield [msgpack.packb(header)]
        else:  # valid header, hostile shapes
            bad = msgpack.unpackb(head)
            bad["arrays"] = [
                ["tokens", "i4", [2**40]],
                ["cu_seqlens", "i4", [2]],
                ["positions", "i4", [int(rng.integers(0, 9))]],
            ]
            yield [msgpack.packb(bad), b"", b"", b""]


def test_fuzzed_messages_never_kill_the_loop(harness):
    # Users rely on: nothing a client sends can stop the teacher.
    h, backend = harness()
    sock = h.raw()
    hello(sock)
    rng = np.random.default_rng(0)
    for frames in _fuzz_messages(rng, 1000):
        sock.send_multipart(frames)
    # Replies to the fuzz arrive in order before the answer to this PING.
    send(sock, {"v": 1, "t": "PING", "id": 999_999})
    while True:
        reply = recv(sock, 10)
        assert reply is not None
        if reply[0].t == "PONG" and reply[0].id == 999_999:
            break
    msg, arrays = call(sock, score_header(123_456), score_arrays())
    assert msg.t == "SCORE_OK" and arrays["ids"].shape == (3, 4)
    assert h.running


def test_the_zeromq_router_serves_the_same_wire():
    # The other tests run the server on miniverl.testing's in-memory ROUTER; this one
    # keeps the ZeroMQ socket path (zmq.Frame bodies, ROUTER_MANDATORY) under test.
    ctx = zmq.asyncio.Context()
    server = TeacherServer(ServerConfig(endpoint="inproc://zmq-path"),
                           lambda request: FakeBackend(), context=ctx)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while server.endpoint is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    sock = zmq.Context.shadow(ctx.underlying).socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.endpoint)
    try:
        assert hello(sock).t == "HELLO_OK"
        msg, arrays = call(sock, score_header(2), score_arrays())
        assert msg.t == "SCORE_OK" and arrays["ids"].shape == (3, 4)
        sock.send_multipart([b"\xc1 garbage"])  # dropped, the loop goes on
        assert call(sock, {"v": 1, "t": "PING", "id": 3})[0].t == "PONG"
    finally:
        sock.close(0)
        server.shutdown_threadsafe("abort")
        thread.join(10)
        ctx.term()
    assert not thread.is_alive()


def test_bind_rules(tmp_path):
    # Users rely on: a teacher never listens on the network without CURVE, and its
    # ipc socket directory is private.
    server = TeacherServer(ServerConfig(endpoint="tcp://0.0.0.0:5599"), lambda r: FakeBackend())
    with pytest.raises(ConfigError, match="CURVE"):
        asyncio.run(server.serve())
    sock_dir = tmp_path / "run" / "sub"
    ctx = zmq.asyncio.Context()
    server = TeacherServer(
        ServerConfig(endpoint=f"ipc://{sock_dir}/t.sock"), lambda r: FakeBackend(), context=ctx
    )

    async def bind_and_stop():
        task = asyncio.create_task(server.serve())
        while server.endpoint is None:
            await asyncio.sleep(0.005)
        server.request_shutdown("abort")
        return await task

    assert asyncio.run(bind_and_stop()) == 0
    assert stat.S_IMODE(os.stat(sock_dir).st_mode) == 0o700
    with contextlib.suppress(Exception):
        ctx.term()
