"""``miniverl.testing``'s fake teacher and in-memory transport, as docs/testing.md promises.

What a user of the kit relies on: the targets are honest and finite, each step does what
its name says to the real client (late, held, stale, duplicated, restarted), a network
of endpoints supports retargeting and meets silence where nobody serves, and the
in-memory transport behaves like a socket (frames are copied, a closed one refuses).
Client-side protocol behaviour is tested in ``tests/protocol/test_client.py`` on the
same kit.
"""

from __future__ import annotations

import time

import anyio
import numpy as np
import pytest

from miniverl.common.errors import TeacherError, TeacherUnavailable, Unauthorized
from miniverl.protocol.checks import nonfinite_report
from miniverl.protocol.codec import encode
from miniverl.testing import (
    FAKE_VOCAB,
    BackendError,
    FakeTeacher,
    MemoryNetwork,
    MemoryTransport,
    Step,
    answer,
    duplicate,
    hold,
    next_token_targets,
    reload,
    stale,
)

TOKENS = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9], np.int32)
CU = np.array([0, 5, 9], np.int32)
POS = np.array([0, 1, 2, 5, 6], np.int32)


@pytest.mark.parametrize("k", [1, 4, FAKE_VOCAB - 1, FAKE_VOCAB])
def test_next_token_targets_are_a_finite_distribution_led_by_the_next_token(k):
    out = next_token_targets(TOKENS, CU, POS, kind="topk", k=k, vocab_size=FAKE_VOCAB)
    assert (out["ids"][:, 0] == TOKENS[POS + 1]).all()
    assert all(len(set(row)) == k for row in out["ids"].tolist())  # no id twice
    assert nonfinite_report(out, kind="topk", k=k, vocab_size=FAKE_VOCAB) is None
    total = np.logaddexp(np.logaddexp.reduce(out["logprobs"], axis=1), out["tail_logmass"])
    np.testing.assert_allclose(total, 0.0, atol=1e-6)
    exact = next_token_targets(TOKENS, CU, POS, kind="exact", k=0, vocab_size=FAKE_VOCAB)
    np.testing.assert_allclose(np.exp(exact["logprobs"]).sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(exact["target_logprobs"], out["target_logprobs"])


def test_a_delayed_reply_comes_late_while_pings_are_answered():
    teacher = FakeTeacher()
    teacher.default = answer(delay_s=1.0)
    with teacher.client(request_timeout_s=10) as client:
        t0 = time.monotonic()
        rid = client.submit(TOKENS, CU, POS, k=4)
        assert client.ping().state == "READY"  # the teacher answers while it "computes"
        assert time.monotonic() - t0 < 0.9
        client.wait([rid])
        assert time.monotonic() - t0 >= 1.0
        assert client.counters["retries"] == 0  # within request_timeout_s


def test_held_requests_are_answered_on_release_in_the_order_asked():
    teacher = FakeTeacher()
    teacher.default = hold()
    with teacher.client() as client:
        ids = [client.submit(TOKENS, CU, POS[: i + 1], k=2) for i in range(3)]
        deadline = time.monotonic() + 5
        while len(teacher.held) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert client.status()["inflight"] == 3
        assert teacher.release(reverse=True) == 3
        results = client.wait(ids)
    assert [len(results[rid].arrays["target_logprobs"]) for rid in ids] == [1, 2, 3]


def test_scripted_steps_apply_to_the_next_scores_then_the_default_runs():
    teacher = FakeTeacher()
    teacher.script(stale(lag=2) + answer(), duplicate(copies=2), reload() + answer())
    assert teacher.scripted == 3
    with teacher.client() as client:
        client.set_version(1)  # below lag 2: the stale reply claims version 3
        gens = [client.score(TOKENS, CU, POS, k=2).gen for _ in range(4)]
        time.sleep(0.05)  # the second copy of the duplicate arrives
        assert gens == [0, 0, 1, 1]
        assert client.counters["stale_dropped"] == 2
    assert teacher.scripted == 0


def test_a_step_of_your_own_sends_what_it_builds():
    def queued_long(teacher, request):
        frames = teacher.reply(request, timing={"queue_ms": 7.0, "compute_ms": 0.0})
        teacher.send(request.conn, frames, 0.01)

    teacher = FakeTeacher()
    teacher.script(Step("queued long", (queued_long,)))
    with teacher.client() as client:
        assert client.score(TOKENS, CU, POS, k=2).timing["queue_ms"] == 7.0


def test_admin_messages_need_the_token_when_the_fake_has_one():
    teacher = FakeTeacher(admin_token="t" * 16)
    with teacher.client(admin_token="t" * 16) as client:
        assert client.park().state == "PARKED"
        assert client.reload("fake/next").gen == 1
    with teacher.client(admin_token="x" * 16) as client, pytest.raises(Unauthorized):
        client.wake()
    assert teacher.state == "PARKED"  # the refused WAKE changed nothing
    with teacher.client(admin_token="t" * 16) as client:
        client.shutdown()
    assert teacher.silent  # a teacher that shut down answers nothing more


def test_a_scorer_computes_the_replies_and_its_backend_error_is_an_error_reply():
    def scorer(job):
        if job.k == 3:
            return BackendError("UNSUPPORTED", "k=3 is not served here")
        return next_token_targets(job.tokens_N, job.cu_seqlens_B1, job.positions_P,
                                  kind=job.kind, k=job.k, vocab_size=FAKE_VOCAB) | {
            "target_logprobs": np.full(len(job.positions_P), -2.0, np.float32)}

    teacher = FakeTeacher(scorer=scorer)
    with teacher.client() as client:
        assert (client.score(TOKENS, CU, POS, k=2).arrays["target_logprobs"] == -2.0).all()
        with pytest.raises(TeacherError, match="UNSUPPORTED: k=3 is not served here"):
            client.score(TOKENS, CU, POS, k=3)


def test_a_malformed_message_gets_an_error_and_the_teacher_goes_on():
    teacher = FakeTeacher()

    async def main():
        conn = teacher.transport_factory("inproc://x")
        await conn.send_multipart([b"\xc1 not msgpack"])  # no header: dropped
        await conn.send_multipart(encode({"v": 1, "t": "NOPE", "id": 4}))
        with anyio.fail_after(2):
            reply = await conn.recv_multipart()
        return reply

    frames = anyio.run(main, backend="asyncio")
    assert b"BAD_REQUEST" in frames[0]


def test_the_transport_copies_frames_and_refuses_after_close():
    teacher = FakeTeacher()
    seen = []
    teacher.receive = lambda conn, frames: seen.append(frames)

    async def main():
        conn = teacher.transport_factory("inproc://x")
        buf = np.array([1, 2, 3], np.int32)
        await conn.send_multipart([memoryview(buf)])
        buf[:] = 0  # a socket has taken its copy: the teacher still sees 1, 2, 3
        conn.close()
        with pytest.raises(ConnectionError, match="closed"):
            await conn.send_multipart([b"x"])

    anyio.run(main, backend="asyncio")
    assert np.frombuffer(seen[0][0], np.int32).tolist() == [1, 2, 3]
    with pytest.raises(RuntimeError, match="pass the factory"):
        MemoryTransport(teacher, "inproc://x")  # not inside an event loop


def test_a_network_retargets_between_teachers_and_nobody_means_silence():
    network = MemoryNetwork({"tcp://127.0.0.1:5555": FakeTeacher(),
                             "tcp://127.0.0.1:6000": FakeTeacher(instance="other")})
    teacher = network.teachers["tcp://127.0.0.1:5555"]
    with teacher.client("tcp://127.0.0.1:5555", transport_factory=network.transport_factory,
                        unavailable_timeout_s=1) as client:
        assert client.retarget("tcp://127.0.0.1:6000").instance == "other"
        assert client.score(TOKENS, CU, POS, k=2).instance == "other"
        with pytest.raises(TeacherUnavailable):  # nobody serves there; nothing switched
            client.retarget("tcp://127.0.0.1:7000")
        assert client.endpoint == "tcp://127.0.0.1:6000"
    assert network.nobody.received  # the HELLO went into the void
