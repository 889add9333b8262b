"""A client that never reads its replies holds up no other client (docs/teacher-server.md,
"Transport guarantees").

What a user relies on, over a real ZeroMQ socket (the ROUTER's queues are the
contract): the teacher sends every reply without waiting; at most ``2 x max_inflight +
16`` replies wait for one client to read them, and past that a reply to that client is
dropped, counted (``replies_dropped`` in ``STATUS_OK``) and logged (``reply_dropped``,
at the 1st, 2nd, 4th, ... drop), so another client's ``SCORE`` is answered as quickly
as ever. Every request of the client that does not read is answered or counted
dropped; its own deadline ends a dropped one.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import zmq

from miniverl.protocol.codec import encode
from miniverl.protocol.limits import Limits
from miniverl.teacher_server.server import TeacherServer
from miniverl.teacher_server.server_state import ServerConfig
from miniverl.testing import FakeBackend
from tests.teacher_server.harness import call, hello, recv, score_arrays, score_header

MAX_INFLIGHT = 4
QUEUE = 2 * MAX_INFLIGHT + 16
ANSWER_WITHIN_S = 1.0


@pytest.fixture
def served(tmp_path_factory):
    """The server on an ipc socket, its log lines, and a DEALER factory."""
    logs: list[tuple[str, dict]] = []
    folder = tmp_path_factory.mktemp("sock")
    server = TeacherServer(ServerConfig(endpoint=f"ipc://{folder}/teacher.sock",
                                        limits=Limits(max_inflight=MAX_INFLIGHT)),
                           lambda request: FakeBackend(),
                           log=lambda level, event, **fields: logs.append((event, fields)))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while server.endpoint is None or server.srv.sock is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ctx = zmq.Context()
    socks = []

    def connect(options=None):
        sock = ctx.socket(zmq.DEALER)
        for option, value in {zmq.LINGER: 0, **(options or {})}.items():
            sock.setsockopt(option, value)
        sock.connect(server.endpoint)
        socks.append(sock)
        return sock

    yield server, logs, connect
    for sock in socks:
        sock.close(0)
    server.shutdown_threadsafe("abort")
    thread.join(10)
    ctx.term()


def dropped(sock) -> int:
    msg, _ = call(sock, {"v": 1, "t": "STATUS", "id": 900})
    return msg.counters.replies_dropped


class Flood:
    """PINGs from ``sock`` as fast as the teacher reads them, on a thread, until
    :meth:`stop` or ``most_s``; ``sent`` counts them."""

    def __init__(self, sock, most_s: float):
        self.sock, self.sent, self.until = sock, 0, time.monotonic() + most_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self.until:
            try:
                self.sock.send_multipart(encode({"v": 1, "t": "PING", "id": self.sent + 1}),
                                         flags=zmq.NOBLOCK)
                self.sent += 1
            except zmq.Again:  # the teacher stopped reading it for now: its queue is full
                time.sleep(0.001)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.sent


def test_a_client_that_never_reads_holds_up_no_other_client(served):
    server, logs, connect = served
    assert server.srv.sock.getsockopt(zmq.SNDHWM) == QUEUE
    other = connect()
    assert hello(other).t == "HELLO_OK"
    t0 = time.monotonic()
    assert call(other, score_header(1), score_arrays())[0].t == "SCORE_OK"
    alone = time.monotonic() - t0
    # Reads as little as ZeroMQ lets it: one message queued, a 4 kB socket buffer.
    hog = connect({zmq.RCVHWM: 1, zmq.RCVBUF: 4096})
    assert hello(hog).t == "HELLO_OK"
    flood = Flood(hog, most_s=3.0)
    deadline = time.monotonic() + 3.0
    while dropped(other) == 0:  # until the teacher has had to drop one of the hog's PONGs
        assert time.monotonic() < deadline, "no reply dropped: the hog's queue never filled"
        time.sleep(0.01)
    # The hog's queue is full, it never reads and keeps sending: another client is served.
    t0 = time.monotonic()
    msg, _ = call(other, score_header(2), score_arrays(), timeout_s=10)
    answered = time.monotonic() - t0
    sent = flood.stop()
    assert msg.t == "SCORE_OK"
    print(f"another client's SCORE answered in {answered * 1000:.1f} ms beside a client "
          f"that never reads and sent {sent} PINGs ({alone * 1000:.1f} ms alone)")
    assert answered < ANSWER_WITHIN_S, answered
    # Once the hog reads: every PING was answered, or its PONG counted dropped.
    received = 0
    while recv(hog, 0.5) is not None:
        received += 1
    lost = dropped(other)
    assert received + lost == sent and lost > 0, (received, lost, sent)
    said = [fields for event, fields in logs if event == "reply_dropped"]
    assert said[0] == {"client": "test", "dropped": 1, "queue_limit": QUEUE}
    assert [f["dropped"] for f in said] == [2 ** i for i in range(len(said))]
    assert len(said) <= lost.bit_length()  # a log line per doubling, not per reply
