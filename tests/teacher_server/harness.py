"""A real teacher server on a background loop, raw DEALER clients, and wire helpers.

:class:`Harness` runs a :class:`TeacherServer` on its own event-loop thread over
``inproc://``; the helpers speak the codec directly, so what the tests assert is what
any client written from DESIGN §3 would see on the wire. No torch, no processes.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import numpy as np
import zmq
import zmq.asyncio

from miniverl.protocol.codec import decode, encode
from miniverl.teacher_server.server import TeacherServer
from miniverl.teacher_server.state import ServerConfig
from tests.teacher_server.fake_backend import FP, VOCAB, FakeBackend


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


def busy(harness, first_id=1, **config):
    """A server whose backend is inside the batch of SCORE ``first_id`` until ``gate.set()``.

    Returns ``(h, backend, gate, sock)``; ``sock`` has said HELLO. A RELOAD loads a fresh
    ``FakeBackend("second")``.
    """
    gate = threading.Event()
    backend = FakeBackend(gate=gate)
    h, _ = harness(loader=lambda request: backend if request is None else FakeBackend("second"),
                   **config)
    sock = h.client()
    hello(sock)
    send(sock, score_header(first_id), score_arrays())
    assert backend.entered.wait(5)
    return h, backend, gate, sock
