"""Server transport over inproc:// with a numpy-only fake backend (no torch, no processes).

Each test runs a real :class:`TeacherServer` on its own event-loop thread and talks to
it with a raw DEALER socket and the codec, so what is asserted is what any client
written from DESIGN §3 would see on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import threading
import time
import uuid

import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

from miniverl.common.errors import ConfigError
from miniverl.protocol.codec import decode, encode
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import TeacherState
from miniverl.protocol.server import BackendError, ServerConfig, TeacherServer

FP = "sha256:" + "cd" * 32
VOCAB = 50


class FakeBackend:
    """Uniform distribution over VOCAB tokens; ``gate`` (when set) blocks each batch."""

    def __init__(self, name="fake", fp=FP, vocab=VOCAB, gate=None):
        self.info = {"name": name, "model": name, "revision": None, "adapter_sha256": None}
        self.tokenizer_fp = fp
        self.vocab_size = vocab
        self.gate = gate
        self.batches: list[list[int]] = []
        self.entered = threading.Event()
        self.parked = False
        self.calls: list[str] = []

    def score_batch(self, jobs):
        self.batches.append([job.id for job in jobs])
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        out = []
        for job in jobs:
            if job.temperature == 7.0:  # a scripted per-job failure
                out.append(BackendError("UNSUPPORTED", "temperature 7 is not served"))
                continue
            n_pos = job.positions_P.shape[0]
            lp = np.float32(-np.log(self.vocab_size))
            target = np.full(n_pos, lp, np.float32)
            if job.kind == "exact":
                out.append(
                    {
                        "logprobs": np.full((n_pos, self.vocab_size), lp, np.float32),
                        "target_logprobs": target,
                    }
                )
                continue
            ids = np.tile(np.arange(job.k, dtype=np.int32), (n_pos, 1))
            tail = np.log1p(-job.k / self.vocab_size) if job.k < self.vocab_size else -np.inf
            out.append(
                {
                    "ids": ids,
                    "logprobs": np.full((n_pos, job.k), lp, np.float32),
                    "tail_logmass": np.full(n_pos, tail, np.float32),
                    "target_logprobs": target,
                }
            )
        return out

    def park(self):
        self.calls.append("park")
        self.parked = True

    def wake(self):
        self.calls.append("wake")
        self.parked = False

    def memory(self):
        return {"device": "cpu"}

    def close(self):
        self.calls.append("close")


class Harness:
    """A server on a background loop plus raw DEALER clients."""

    def __init__(self, loader, log=None, **config):
        self.ctx = zmq.asyncio.Context()
        self.sync_ctx = zmq.Context.shadow(self.ctx.underlying)
        self.endpoint = f"inproc://teacher-{uuid.uuid4().hex[:8]}"
        self.server = TeacherServer(
            ServerConfig(endpoint=self.endpoint, **config), loader, context=self.ctx, log=log
        )
        self.result: list = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 5
        while self.server.endpoint is None and self.thread.is_alive():
            assert time.monotonic() < deadline
            time.sleep(0.002)
        self.sockets: list = []
        self._next = 1000

    def _run(self):
        try:
            self.result.append(asyncio.run(self.server.serve()))
        except BaseException as exc:  # surfaced by close()
            self.result.append(exc)

    def client(self):
        sock = self.sync_ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        self.sockets.append(sock)
        return sock

    def next_id(self):
        self._next += 1
        return self._next

    def close(self):
        if self.thread.is_alive():
            self.server.shutdown_threadsafe("abort")
            self.thread.join(10)
        for sock in self.sockets:
            sock.close(0)
        self.ctx.term()


def send(sock, header, arrays=None):
    sock.send_multipart(encode(header, arrays))


def recv(sock, timeout_s=5.0):
    """One decoded reply, or None when nothing arrives in time."""
    if not sock.poll(int(timeout_s * 1000)):
        return None
    return decode(sock.recv_multipart())


def call(sock, header, arrays=None, timeout_s=5.0):
    send(sock, header, arrays)
    reply = recv(sock, timeout_s)
    assert reply is not None, f"no reply to {header}"
    return reply


def hello(sock, fp=FP, vocab=VOCAB, rid=1):
    msg, _ = call(
        sock,
        {
            "v": 1,
            "t": "HELLO",
            "id": rid,
            "client": "test",
            "tokenizer_fp": fp,
            "vocab_size": vocab,
        },
    )
    return msg


def score_arrays(n=12, positions=(0, 3, 7)):
    return {
        "tokens": np.arange(n, dtype=np.int32) % VOCAB,
        "cu_seqlens": np.array([0, n], np.int32),
        "positions": np.array(positions, np.int32),
    }


def score_header(rid, kind="topk", k=4, **extra):
    return {
        "v": 1,
        "t": "SCORE",
        "id": rid,
        "student_version": 3,
        "kind": kind,
        "k": k,
        "temperature": 1.0,
        **extra,
    }


@pytest.fixture
def harness():
    made = []

    def make(backend=None, loader=None, **config):
        backend = backend or FakeBackend()
        h = Harness(loader or (lambda request: backend), **config)
        made.append(h)
        return h, backend

    yield make
    for h in made:
        h.close()


def test_hello_score_ping_status(harness):
    h, backend = harness()
    sock = h.client()
    ok = hello(sock)
    assert ok.t == "HELLO_OK" and ok.tokenizer_fp == FP and ok.vocab_size == VOCAB
    assert ok.instance == h.server.instance and ok.gen == 0
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


def test_a_backends_own_counters_are_logged_with_each_batch(harness):
    class Counting(FakeBackend):
        def stats(self):
            return {"prefix_cache": {"hits": 7}}

    lines = []
    h, _ = harness(backend=Counting(), log=lambda level, event, **f: lines.append((event, f)))
    sock = h.client()
    hello(sock)
    call(sock, score_header(2), score_arrays())
    batches = [f for event, f in lines if event == "batch"]
    assert batches and batches[0]["backend"] == {"prefix_cache": {"hits": 7}}
    assert batches[0]["jobs"] == 1


def test_loading_state_pings_and_held_hello(harness):
    # Users rely on: a loading teacher is never mistaken for a dead one.
    release = threading.Event()
    backend = FakeBackend()

    def slow_loader(request):
        release.wait(10)
        return backend

    h, _ = harness(loader=slow_loader)
    sock = h.client()
    pong, _ = call(sock, {"v": 1, "t": "PING", "id": 1})
    assert pong.state == TeacherState.LOADING
    err, _ = call(sock, score_header(2), score_arrays())
    assert err.t == "ERROR" and err.code.value == "RELOADING" and err.retryable
    send(
        sock,
        {"v": 1, "t": "HELLO", "id": 3, "client": "c", "tokenizer_fp": FP, "vocab_size": VOCAB},
    )
    assert recv(sock, 0.2) is None  # held until the model is there
    release.set()
    ok, _ = recv(sock)
    assert ok.t == "HELLO_OK" and ok.id == 3


def test_ping_answered_while_a_batch_computes(harness):
    gate = threading.Event()
    h, backend = harness(FakeBackend(gate=gate))
    sock = h.client()
    hello(sock)
    send(sock, score_header(2), score_arrays())
    assert backend.entered.wait(5)
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
    sock = h.client()
    hello(sock)
    for rid in (10, 11, 12):
        send(sock, score_header(rid), score_arrays())
    err, _ = recv(sock)
    assert err.t == "ERROR" and err.code.value == "OVERLOADED" and err.id == 12 and err.retryable
    other = h.client()  # the limit is per client
    hello(other)
    send(other, score_header(10), score_arrays())
    gate.set()
    got = sorted(recv(sock)[0].id for _ in range(2))
    assert got == [10, 11]
    assert recv(other)[0].t == "SCORE_OK"


def test_duplicate_ids_are_not_computed_twice(harness):
    gate = threading.Event()
    h, backend = harness(FakeBackend(gate=gate))
    sock = h.client()
    hello(sock)
    send(sock, score_header(7), score_arrays())
    assert backend.entered.wait(5)
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
    sock = h.client()
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
    sock = h.client()
    hello(sock)
    header, arrays = mutate(score_header(42), score_arrays())
    err, _ = call(sock, header, arrays)
    assert err.t == "ERROR" and err.code.value == code and err.ref_id == 42, err.message


def test_frames_that_break_the_codec(harness):
    h, _ = harness()
    sock = h.client()
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
    sock = h.client()
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
    assert h.thread.is_alive()


def test_coalescing_queued_requests_into_one_batch(harness):
    gate = threading.Event()
    h, backend = harness(FakeBackend(gate=gate), batch_tokens=30)
    sock = h.client()
    hello(sock)
    send(sock, score_header(1), score_arrays())
    assert backend.entered.wait(5)
    for rid in (2, 3, 4):  # 12 tokens each: two fit the 30-token budget
        send(sock, score_header(rid), score_arrays())
    time.sleep(0.1)
    gate.set()
    ids = sorted(recv(sock)[0].id for _ in range(4))
    assert ids == [1, 2, 3, 4]
    assert backend.batches == [[1], [2, 3], [4]]


def test_backend_error_is_per_request(harness):
    h, _ = harness()
    sock = h.client()
    hello(sock)
    header = {**score_header(5), "temperature": 7.0}
    err, _ = call(sock, header, score_arrays())
    assert err.code.value == "UNSUPPORTED" and err.id == 5
    assert call(sock, score_header(6), score_arrays())[0].t == "SCORE_OK"


def test_park_wake_and_implicit_wake(harness):
    h, backend = harness()
    sock = h.client()
    hello(sock)
    ok, _ = call(sock, {"v": 1, "t": "PARK", "id": 2})
    assert ok.t == "PARK_OK" and ok.state == TeacherState.PARKED and backend.parked
    assert call(sock, {"v": 1, "t": "PING", "id": 3})[0].state == TeacherState.PARKED
    ok, _ = call(sock, {"v": 1, "t": "WAKE", "id": 4})
    assert ok.state == TeacherState.READY and not backend.parked
    call(sock, {"v": 1, "t": "PARK", "id": 5})
    msg, _ = call(sock, score_header(6), score_arrays())  # SCORE while parked wakes it
    assert msg.t == "SCORE_OK" and not backend.parked
    assert call(sock, {"v": 1, "t": "PING", "id": 7})[0].state == TeacherState.READY


def test_reload_bumps_gen_and_refuses_another_tokenizer(harness):
    backends = {
        "first": FakeBackend("first"),
        "second": FakeBackend("second"),
        "alien": FakeBackend("alien", fp="sha256:" + "00" * 32),
    }

    def loader(request):
        if request is None:
            return backends["first"]
        if request["model"] == "broken":
            raise ConfigError("model 'broken' has no config.json")
        return backends[request["model"]]

    h, _ = harness(loader=loader)
    sock = h.client()
    hello(sock)
    ok, _ = call(sock, {"v": 1, "t": "RELOAD", "id": 2, "model": "second", "mode": "drain"})
    assert ok.t == "RELOAD_OK" and ok.gen == 1 and ok.teacher.name == "second"
    assert backends["first"].calls == ["park", "close"]
    msg, _ = call(sock, score_header(3), score_arrays())
    assert msg.gen == 1
    err, _ = call(sock, {"v": 1, "t": "RELOAD", "id": 4, "model": "alien"})
    assert err.code.value == "TOKENIZER_MISMATCH" and "keeps serving" in err.message
    err, _ = call(sock, {"v": 1, "t": "RELOAD", "id": 5, "model": "broken", "mode": "abort"})
    assert err.code.value == "BAD_REQUEST" and "no config.json" in err.message
    msg, _ = call(sock, score_header(6), score_arrays())
    assert msg.t == "SCORE_OK" and msg.gen == 1 and not backends["second"].parked
    status, _ = call(sock, {"v": 1, "t": "STATUS", "id": 7})
    assert status.teacher.name == "second" and status.state == TeacherState.READY


def test_reload_passes_every_pin_to_the_loader(harness):
    requests = []

    def loader(request):
        requests.append(request)
        return FakeBackend("first" if request is None else "second")

    h, _ = harness(loader=loader)
    sock = h.client()
    hello(sock)
    pins = {"model": "org/teacher", "revision": "a" * 40, "adapter": "org/lora",
            "adapter_revision": "b" * 40}
    ok, _ = call(sock, {"v": 1, "t": "RELOAD", "id": 2, **pins})
    assert ok.t == "RELOAD_OK"
    assert requests == [None, pins]


def test_reload_abort_fails_queued_requests_retryably(harness):
    gate = threading.Event()
    first = FakeBackend("first", gate=gate)
    h, _ = harness(loader=lambda r: first if r is None else FakeBackend("second"))
    sock = h.client()
    hello(sock)
    send(sock, score_header(1), score_arrays())
    assert first.entered.wait(5)
    send(sock, score_header(2), score_arrays())
    send(sock, {"v": 1, "t": "RELOAD", "id": 3, "model": "second", "mode": "abort"})
    errors = [recv(sock)[0] for _ in range(2)]
    assert {(e.id, e.code.value, e.retryable) for e in errors} == {
        (1, "RELOADING", True),
        (2, "RELOADING", True),
    }
    gate.set()
    ok, _ = recv(sock)
    assert ok.t == "RELOAD_OK" and ok.gen == 1
    assert recv(sock, 0.2) is None  # the aborted batch's result is never sent


def test_shutdown_drains_open_requests(harness):
    gate = threading.Event()
    h, backend = harness(FakeBackend(gate=gate))
    sock = h.client()
    hello(sock)
    send(sock, score_header(1), score_arrays())
    assert backend.entered.wait(5)
    send(sock, {"v": 1, "t": "SHUTDOWN", "id": 2, "mode": "drain"})
    err, _ = call(sock, score_header(3), score_arrays())
    assert err.code.value == "SHUTTING_DOWN" and err.retryable
    gate.set()
    first, _ = recv(sock)
    second, _ = recv(sock)
    assert (first.t, second.t) == ("SCORE_OK", "SHUTDOWN_OK")
    h.thread.join(5)
    assert not h.thread.is_alive() and h.result == [0]
    assert "close" in backend.calls


def test_deadline_exceeded_while_queued(harness):
    gate = threading.Event()
    h, backend = harness(FakeBackend(gate=gate))
    sock = h.client()
    hello(sock)
    send(sock, score_header(1), score_arrays())
    assert backend.entered.wait(5)
    send(sock, score_header(2, deadline_ms=1), score_arrays())
    time.sleep(0.05)
    gate.set()
    replies = {msg.id: msg for msg, _ in (recv(sock), recv(sock))}
    assert replies[1].t == "SCORE_OK" and replies[2].code.value == "DEADLINE_EXCEEDED"


def test_failed_initial_load_exits_nonzero(harness):
    def loader(request):
        raise ConfigError("model path '/nope' has no config.json")

    h, _ = harness(loader=loader)
    h.thread.join(5)
    assert h.result == [1]


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
