"""A hand-written fake teacher and in-memory transport for client tests (no ZeroMQ).

``FakeTeacher`` answers decoded requests the way DESIGN §3 says a teacher does and
lets a test script misbehaviour (drop, stall, reply twice, restart, reload).
``FakeTransport`` is what the client's ``transport_factory`` returns: sends go
straight into the teacher, replies come back through an anyio memory stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

from miniverl.protocol import messages as m
from miniverl.protocol.codec import decode, encode

FP = "sha256:" + "ab" * 32
VOCAB = 32


class FakeTransport:
    def __init__(self, teacher: FakeTeacher):
        self.teacher = teacher
        self.closed = False
        self._send, self._recv = anyio.create_memory_object_stream(1000)
        teacher.transports.append(self)

    async def send_multipart(self, frames: list[Any]) -> None:
        if self.closed:
            raise RuntimeError("send on a closed transport")
        self.teacher.receive(self, [bytes(f) for f in frames])

    async def recv_multipart(self) -> list[Any]:
        return await self._recv.receive()

    def deliver(self, frames: list[Any]) -> None:
        if not self.closed:
            self._send.send_nowait(frames)

    def close(self) -> None:
        self.closed = True
        self._send.close()


class FakeTeacher:
    """Scripted teacher. ``on_score(conn, msg, arrays)`` may return a list of frame
    lists to send instead of the default reply, or None for the default."""

    def __init__(self, tokenizer_fp: str = FP, vocab_size: int = VOCAB, instance: str = "inst-A"):
        self.tokenizer_fp = tokenizer_fp
        self.vocab_size = vocab_size
        self.instance = instance
        self.gen = 0
        self.transports: list[FakeTransport] = []
        self.known: set[int] = set()  # id(transport) of clients that said HELLO
        self.log: list[m.Message] = []
        self.silent = False
        self.on_score: Callable[..., list | None] | None = None
        self.hello_error: m.ErrorCode | None = None

    def factory(self, endpoint: str) -> FakeTransport:
        return FakeTransport(self)

    def count(self, t: str) -> int:
        return sum(1 for msg in self.log if msg.t == t)

    def restart(self, instance: str) -> None:
        """Same endpoint, new process: new instance, gen 0, no known clients."""
        self.instance, self.gen, self.known = instance, 0, set()

    # -- replies
    def liveness(self) -> dict[str, Any]:
        """The fields PONG and STATUS_OK share: an idle, ready teacher."""
        return dict(instance=self.instance, gen=self.gen, state="READY", inflight=0,
                    queue_depth=0, last_progress_ms=0.0)

    def pong(self, rid: int) -> list:
        return encode(m.Pong(id=rid, **self.liveness()))

    def error(self, rid: int | None, code: m.ErrorCode, retryable: bool = False) -> list:
        msg = m.ErrorReply(
            id=rid,
            ref_id=rid,
            code=code,
            message=f"fake {code.value}",
            retryable=retryable,
            instance=self.instance,
            gen=self.gen,
        )
        return encode(msg)

    def score_ok(self, msg: m.Score, arrays: dict, **override: Any) -> list:
        p = len(arrays["positions"])
        fields = dict(
            id=msg.id,
            student_version=msg.student_version,
            instance=self.instance,
            gen=self.gen,
            kind=msg.kind,
            k=msg.k,
            timing={"queue_ms": 0.0, "compute_ms": 1.0},
        )
        fields.update(override)
        if msg.kind == "topk":
            out = {
                "ids": np.tile(np.arange(msg.k, dtype=np.int32), (p, 1)),
                "logprobs": np.full((p, msg.k), -np.log(self.vocab_size), np.float32),
                "tail_logmass": np.full(p, np.log1p(-msg.k / self.vocab_size), np.float32),
                "target_logprobs": arrays["positions"].astype(np.float32),
            }
        else:
            out = {
                "logprobs": np.full((p, self.vocab_size), -np.log(self.vocab_size), np.float32),
                "target_logprobs": arrays["positions"].astype(np.float32),
            }
        return encode(m.ScoreOk(**fields), out)

    def hello_ok(self, rid: int) -> list:
        return encode(
            m.HelloOk(
                id=rid,
                teacher={"name": "fake", "model": "fake/model", "revision": None},
                instance=self.instance,
                gen=self.gen,
                tokenizer_fp=self.tokenizer_fp,
                vocab_size=self.vocab_size,
                kinds={"topk": {"k_max": 64}, "exact": {"max_vocab": 1024}},
                limits={"max_tokens": 4096, "max_positions": 4096, "max_inflight": 8},
                heartbeat_ms=1000,
                server_version="fake/1",
            )
        )

    def receive(self, conn: FakeTransport, frames: list) -> None:
        msg, arrays = decode(frames)
        self.log.append(msg)
        if self.silent:
            return
        for reply in self.answer(conn, msg, arrays):
            conn.deliver(reply)

    def answer(self, conn: FakeTransport, msg: m.Message, arrays: dict) -> list:
        if isinstance(msg, m.Hello):
            if self.hello_error is not None:
                return [self.error(msg.id, self.hello_error)]
            self.known.add(id(conn))
            return [self.hello_ok(msg.id)]
        if isinstance(msg, m.Ping):
            return [self.pong(msg.id)]
        if isinstance(msg, m.Score):
            if id(conn) not in self.known:
                return [self.error(msg.id, m.ErrorCode.NEED_HELLO, retryable=True)]
            if self.on_score is not None:
                scripted = self.on_score(conn, msg, arrays)
                if scripted is not None:
                    return scripted
            return [self.score_ok(msg, arrays)]
        if isinstance(msg, m.Status):
            teacher = {"name": "fake", "model": "fake/model"}
            return [encode(m.StatusOk(id=msg.id, teacher=teacher, **self.liveness()))]
        if isinstance(msg, m.Park):
            return [encode(m.ParkOk(id=msg.id, state="PARKED"))]
        if isinstance(msg, m.Wake):
            return [encode(m.WakeOk(id=msg.id, state="READY"))]
        if isinstance(msg, m.Reload):
            self.gen += 1
            teacher = {"name": "fake", "model": msg.model}
            return [encode(m.ReloadOk(id=msg.id, gen=self.gen, teacher=teacher))]
        if isinstance(msg, m.Shutdown):
            return [encode(m.ShutdownOk(id=msg.id))]
        return [self.error(msg.id, m.ErrorCode.BAD_REQUEST)]
