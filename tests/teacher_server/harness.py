"""Wire helpers for the teacher server's tests, over ``miniverl.testing``'s harness.

The server runs in a :class:`miniverl.testing.TeacherHarness` (the real
``TeacherServer`` over an in-memory ROUTER, no sockets); a test talks to it through
``h.raw()`` connections, and these helpers speak the codec directly, so what the tests
assert is what any client written from docs/protocol.md would see on the wire. No torch, no
processes.
"""

from __future__ import annotations

import threading

import numpy as np

from miniverl.protocol.codec import decode, encode
from miniverl.testing import FAKE_TOKENIZER_FP, FAKE_VOCAB, BackendError, FakeBackend

FP, VOCAB = FAKE_TOKENIZER_FP, FAKE_VOCAB


def unsupported_at_7(job):
    """A scripted per-job failure: a temperature of 7 is ``UNSUPPORTED``."""
    if job.temperature == 7.0:
        return BackendError("UNSUPPORTED", "temperature 7 is not served")
    return None


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


def served_model(harness, model, vocab):
    """A connection that said HELLO to the real server around ``model`` (the built-in
    torch backend, tokenizer fingerprint ``"fp"``, ``vocab`` ids); torch loads only here."""
    from miniverl.teacher_server.loader import LoadedTeacher
    from miniverl.teacher_server.torch_backend import TorchTeacher

    info = {"name": "tiny", "model": "tiny"}
    loaded = LoadedTeacher(model, None, "fp", vocab, info, "cpu", "float32")
    h, _ = harness(backend=TorchTeacher(loaded, exact_max_vocab=1 << 20, max_batch_tokens=4096))
    sock = h.raw()
    assert hello(sock, fp="fp", vocab=vocab).t == "HELLO_OK"
    return sock


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
    sock = h.raw()
    hello(sock)
    send(sock, score_header(first_id), score_arrays())
    assert backend.entered.wait(5)
    return h, backend, gate, sock
