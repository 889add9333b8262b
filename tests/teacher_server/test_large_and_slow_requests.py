"""Every documented refusal is sent, and no client stalls the others (issue 53).

What a user relies on (docs/protocol.md, "`xvocab`: a teacher with another tokenizer";
docs/teacher-server.md, "Transport guarantees"), over a real ZeroMQ socket (the
socket's own size cap is part of the contract): a 10 MB xvocab episode is answered ``ERROR TOO_LARGE`` naming
``max_episode_bytes`` (it once got no reply: the socket dropped the client before the
server read the frame); and while the teacher refuses a 30,000-message xvocab episode
(its rendering and alignment: work whose cost a client controls), another client's
valid SCORE is answered within 1 s (the refusal once held it 6.6 s). A frame over the
socket's own cap gets no reply, as documented, while the others are served; each side
bounds the messages it queues unread from its peer.
"""

from __future__ import annotations

import asyncio
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from miniverl.protocol.limits import Limits
from miniverl.protocol.xvocab import xvocab_request
from miniverl.teacher_server.server import TeacherServer
from miniverl.teacher_server.server_state import ServerConfig
from miniverl.testing import FAKE_TOKENIZER_FP, FAKE_VOCAB, FakeBackend
from tests.common.cross_tokenizer_kit import TOOLS, byte_fallback_tokenizer, toy_tokenizer
from tests.teacher_server.harness import call, recv, score_arrays, score_header, send

TEACHER_FP = "sha256:" + "cd" * 32
ANSWER_WITHIN_S = 1.0
EPISODE_BYTES = 4 << 20  # room for a 30,000-message episode (1.8 MB with its rendering)
XVOCAB = {"v": 1, "t": "SCORE", "student_version": 0, "kind": "xvocab", "k": 4,
          "temperature": 1.0}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A DEALER factory of a teacher serving xvocab on an ipc socket, its vocabulary
    size and the server."""
    tok = byte_fallback_tokenizer()
    folder = tmp_path_factory.mktemp("sock")
    server = TeacherServer(ServerConfig(endpoint=f"ipc://{folder}/teacher.sock",
                                        limits=Limits(max_seq_len=4096,
                                                     max_episode_bytes=EPISODE_BYTES)),
                           lambda request: FakeBackend(tokenizer=tok, tokenizer_fp=TEACHER_FP,
                                                       vocab_size=len(tok)))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while server.endpoint is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ctx = zmq.Context()
    socks = []

    def connect(fp, vocab, understands=None):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(server.endpoint)
        socks.append(sock)
        header = {"v": 1, "t": "HELLO", "id": 1, "client": "t", "tokenizer_fp": fp,
                  "vocab_size": vocab, **({"understands": understands} if understands else {})}
        assert call(sock, header, timeout_s=30)[0].t == "HELLO_OK"
        return sock

    yield connect, len(tok), server
    for sock in socks:
        sock.close(0)
    server.shutdown_threadsafe("abort")
    thread.join(10)
    ctx.term()


def base_arrays():
    req = xvocab_request(toy_tokenizer(), [{"role": "user", "content": "hi"}], TOOLS)
    return {name: req[name] for name in ("episode", "student_cuts", "student_pieces")}


def test_a_10_mb_xvocab_episode_is_answered_too_large_naming_the_limit(served):
    connect, _, _ = served
    student = connect(FAKE_TOKENIZER_FP, FAKE_VOCAB, ["xvocab"])
    arrays = base_arrays()
    arrays["episode"] = np.frombuffer(b"x" * 10_000_000, np.uint8)
    t0 = time.monotonic()
    send(student, {**XVOCAB, "id": 7}, arrays)
    reply = recv(student, 30)
    took = time.monotonic() - t0
    assert reply is not None, "no reply: the socket dropped the frame"
    msg = reply[0]
    assert msg.t == "ERROR" and msg.code == "TOO_LARGE" and msg.ref_id == 7
    assert "10000000 bytes" in msg.message and f"max_episode_bytes={EPISODE_BYTES}" in msg.message
    print(f"10 MB xvocab episode: ERROR TOO_LARGE in {took:.3f} s")


@pytest.mark.slow  # the teacher renders 30,000 messages (tens of seconds on a busy CPU)
def test_another_clients_score_is_answered_while_a_huge_episode_is_refused(served):
    connect, vocab, _ = served
    student = connect(FAKE_TOKENIZER_FP, FAKE_VOCAB, ["xvocab"])
    other = connect(TEACHER_FP, vocab)
    # A request the student side renders honestly: within every size limit on the wire
    # (1.8 MB), refused only once the teacher has rendered and aligned it (its
    # rendering is longer than the teacher's context).
    req = xvocab_request(toy_tokenizer(), [{"role": "user", "content": ""}] * 30_000, TOOLS)
    arrays = {name: req[name] for name in ("episode", "student_cuts", "student_pieces")}
    assert arrays["episode"].nbytes < EPISODE_BYTES
    assert call(other, score_header(2), score_arrays())[0].t == "SCORE_OK"  # warm
    t0 = time.monotonic()
    send(student, {**XVOCAB, "id": 9}, arrays)
    time.sleep(0.05)  # the episode is being planned
    t1 = time.monotonic()
    msg, _ = call(other, score_header(3), score_arrays(), timeout_s=30)
    answered = time.monotonic() - t1
    refusal = recv(student, 120)
    refused = time.monotonic() - t0
    assert msg.t == "SCORE_OK"
    assert refusal is not None and refusal[0].t == "ERROR", refusal
    assert refusal[0].code == "TOO_LARGE" and "4096 tokens" in refusal[0].message
    print(f"30,000-message episode refused in {refused:.2f} s ({refusal[0].code}); the other "
          f"client's SCORE answered in {answered * 1000:.0f} ms")
    assert answered < ANSWER_WITHIN_S, (answered, refused)


@pytest.mark.parametrize("field, value", [("adapter", "x" * 1_000_000),
                                          ("understands", ["y" * 60_000] * 200)],
                         ids=["1 MB adapter name", "200 names of 60 kB"])
def test_a_header_over_its_limit_is_answered_too_large_under_its_id(served, field, value):
    # Both once got no reply at all: the header could not be decoded, so it was dropped.
    connect, vocab, _ = served
    student = connect(TEACHER_FP, vocab)
    header = {"v": 1, "t": "HELLO", "id": 11, "client": "t", "tokenizer_fp": TEACHER_FP,
              "vocab_size": vocab, field: value}
    student.send_multipart([msgpack.packb(header)])
    reply = recv(student, 30)
    assert reply is not None, "no reply"
    msg = reply[0]
    assert msg.t == "ERROR" and msg.code == "TOO_LARGE" and msg.ref_id == 11
    assert "the limit is 65536" in msg.message


def test_a_frame_over_the_sockets_cap_gets_no_reply_and_the_others_are_served(served):
    # What docs/protocol.md says instead of a TOO_LARGE: ZeroMQ drops the frame (and the
    # connection) before the server could read it; nothing else is disturbed.
    from miniverl.teacher_server.server import socket_cap

    connect, vocab, server = served
    student = connect(FAKE_TOKENIZER_FP, FAKE_VOCAB, ["xvocab"])
    other = connect(TEACHER_FP, vocab)
    cap = socket_cap(server.srv.limits)
    arrays = base_arrays()
    arrays["episode"] = np.zeros(cap + 1, np.uint8)
    send(student, {**XVOCAB, "id": 13}, arrays)
    assert recv(student, 1.0) is None  # a 10 MB episode's TOO_LARGE takes under 0.1 s
    assert call(other, score_header(4), score_arrays())[0].t == "SCORE_OK"


def test_each_side_queues_a_bounded_number_of_messages_from_its_peer(served):
    # ZeroMQ's default is 1000 unread messages per peer, each up to the socket's cap (64
    # MiB or more): tens of gigabytes one client could make the teacher buffer. Past the
    # bound ZeroMQ stops reading that peer (its sends wait); nothing is dropped.
    from miniverl.protocol.transport import ZmqTransport

    _, _, server = served
    limits = server.srv.limits
    assert server.srv.sock.getsockopt(zmq.RCVHWM) == 2 * limits.max_inflight + 16
    client = ZmqTransport(server.endpoint)
    try:
        assert client._socket.getsockopt(zmq.RCVHWM) == 2 * Limits().max_inflight + 16
    finally:
        client.close()
