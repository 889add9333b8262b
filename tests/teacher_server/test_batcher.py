"""The batcher: coalescing queued SCORE jobs, per-job backend errors, deadlines, stats.

Real TeacherServer in ``miniverl.testing``'s harness (in memory) with its numpy
``FakeBackend`` (``harness.py``).
"""

from __future__ import annotations

import time

from miniverl.testing import FakeBackend
from tests.teacher_server.harness import busy, call, hello, recv, score_arrays, score_header, send


def test_a_backends_own_counters_are_logged_with_each_batch(harness):
    class Counting(FakeBackend):
        def stats(self):
            return {"prefix_cache": {"hits": 7}}

    lines = []
    h, _ = harness(backend=Counting(), log=lambda level, event, **f: lines.append((event, f)))
    sock = h.raw()
    hello(sock)
    call(sock, score_header(2), score_arrays())
    batches = [f for event, f in lines if event == "batch"]
    assert batches and batches[0]["backend"] == {"prefix_cache": {"hits": 7}}
    assert batches[0]["jobs"] == 1


def test_a_backend_without_counters_logs_none(harness):
    lines = []
    h, _ = harness(log=lambda level, event, **f: lines.append((event, f)))
    sock = h.raw()
    hello(sock)
    call(sock, score_header(2), score_arrays())
    batches = [f for event, f in lines if event == "batch"]
    assert batches and "backend" not in batches[0]


def test_coalescing_queued_requests_into_one_batch(harness):
    h, backend, gate, sock = busy(harness, first_id=1, batch_tokens=30)
    for rid in (2, 3, 4):  # 12 tokens each: two fit the 30-token budget
        send(sock, score_header(rid), score_arrays())
    time.sleep(0.1)
    gate.set()
    ids = sorted(recv(sock)[0].id for _ in range(4))
    assert ids == [1, 2, 3, 4]
    assert backend.batches == [[1], [2, 3], [4]]


def test_backend_error_is_per_request(harness):
    h, _ = harness()
    sock = h.raw()
    hello(sock)
    header = {**score_header(5), "temperature": 7.0}
    err, _ = call(sock, header, score_arrays())
    assert err.code.value == "UNSUPPORTED" and err.id == 5
    assert call(sock, score_header(6), score_arrays())[0].t == "SCORE_OK"


def test_deadline_exceeded_while_queued(harness):
    h, backend, gate, sock = busy(harness, first_id=1)
    send(sock, score_header(2, deadline_ms=1), score_arrays())
    time.sleep(0.05)
    gate.set()
    replies = {msg.id: msg for msg, _ in (recv(sock), recv(sock))}
    assert replies[1].t == "SCORE_OK" and replies[2].code.value == "DEADLINE_EXCEEDED"
