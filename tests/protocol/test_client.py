"""TeacherClient against ``miniverl.testing``'s scripted fake teacher (no ZeroMQ).

Each test pins one promise docs/protocol.md makes to the trainer: a reply is trained on
only if it is pending, for the same student version, within the lag and from the
bound teacher; a lost or refused request is resent under the same id; a restarted
teacher is re-handshaken; a tokenizer mismatch stops everything; a transport passed
where its factory belongs fails at once.
"""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from miniverl.common.errors import (
    ConfigError,
    ProtocolError,
    StaleTargetError,
    TeacherError,
    TeacherUnavailable,
    TokenizerMismatch,
)
from miniverl.protocol import messages as m
from miniverl.protocol.client import TeacherChanged, TeacherClient
from miniverl.protocol.sync_client import SyncTeacherClient
from miniverl.testing import FakeTeacher, MemoryNetwork
from miniverl.testing.script import answer, drop, error, hold, reload, restart, stale, wrong_id
from tests.protocol.client_kit import CU, FP, POS, TOKENS, VOCAB, run


def test_hello_then_topk_and_exact_scores():
    async def body(client, teacher):
        hello = await client.connect()
        assert hello.tokenizer_fp == FP and hello.instance == "teacher-A"
        result = await client.score(TOKENS, CU, POS, k=4)
        assert result.arrays["ids"].shape == (5, 4)
        assert result.arrays["ids"].dtype == np.int32
        # Row i belongs to POS[i]: the fake teacher's favourite is the token that follows.
        np.testing.assert_array_equal(result.arrays["ids"][:, 0], TOKENS[POS + 1])
        exact = await client.score(TOKENS, CU, POS, kind="exact")
        assert exact.arrays["logprobs"].shape == (5, VOCAB)
        counters = client.counters
        assert counters["stale_dropped"] == 0 and counters["retries"] == 0
        assert counters["bytes_received"] > 5 * 4 * 8

    run(body)


def test_several_requests_in_flight_matched_by_id():
    async def body(client, teacher):
        await client.connect()
        teacher.default = hold()
        ids = [await client.submit(TOKENS, CU, POS[: i + 1], k=2) for i in range(3)]
        await anyio.sleep(0.02)
        assert teacher.release(reverse=True) == 3  # answer out of order
        results = await client.wait(ids)
        assert [len(results[rid].arrays["target_logprobs"]) for rid in ids] == [1, 2, 3]

    run(body)


@pytest.mark.parametrize(
    "stray",
    [
        # A reply echoing another student version must never be trained on.
        stale(),
        # A reply for an id nobody is waiting for is dropped, not matched to another.
        wrong_id(),
    ],
    ids=["wrong_student_version", "unknown_id"],
)
def test_stray_reply_is_dropped_and_counted(stray):
    teacher = FakeTeacher()
    teacher.default = stray + answer()

    async def body(client, teacher):
        await client.connect()
        client.set_version(3)
        result = await client.score(TOKENS, CU, POS, k=4)
        assert result.student_version == 3
        assert client.counters["stale_dropped"] == 1

    run(body, teacher)


def test_reply_outside_allowed_lag_is_refused():
    async def body(client, teacher):
        await client.connect()
        teacher.default = hold()
        rid = await client.submit(TOKENS, CU, POS, k=4)
        client.set_version(1)  # strict OPD: lag 0
        with pytest.raises(StaleTargetError):
            await client.wait([rid])
        # replay with max_lag=1 accepts a reply one version old
        teacher.default = answer()
        client.set_version(1)
        rid = await client.submit(TOKENS, CU, POS, k=4)
        client.set_version(2, lag=1)
        assert (await client.wait([rid]))[rid].student_version == 1

    run(body)


def test_old_gen_after_reload_is_dropped_when_bound():
    # One update never mixes teacher generations: a reply from gen 1 for an update
    # bound to gen 0 is dropped and wait() asks the trainer to rebind.
    async def body(client, teacher):
        await client.connect()
        assert await client.bind() == ("teacher-A", 0)
        teacher.script(reload() + answer())
        rid = await client.submit(TOKENS, CU, POS, k=4)
        with pytest.raises(TeacherChanged) as info:
            await client.wait([rid])
        assert info.value.how == "reload" and info.value.new == ("teacher-A", 1)
        assert client.counters["stale_dropped"] == 1
        assert await client.bind() == ("teacher-A", 1)
        result = await client.score(TOKENS, CU, POS, k=4)
        assert result.gen == 1 and client.hello.gen == 1

    run(body)


def test_timeout_resends_the_same_id_then_succeeds():
    async def body(client, teacher):
        await client.connect()
        result = await client.score(TOKENS, CU, POS, k=4)
        assert [msg.id for msg in teacher.scores] == [result.id, result.id]
        assert client.counters["retries"] == 1

    run(body, script=[drop()])


def test_a_forgotten_request_is_never_sent_again():
    # A routed run holds back a down teacher's episodes (docs/several-teachers.md): it
    # forgets their requests, so the restarted teacher is not asked for them.
    async def body(client, teacher):
        await client.connect()
        assert client.connected
        rid = await client.submit(TOKENS, CU, POS, k=4)  # lost: the teacher restarts
        client.forget([rid])
        await anyio.sleep(0.6)  # four request timeouts: a kept row would be resent
        result = await client.score(TOKENS, CU, POS, k=4)
        assert result.instance == "teacher-B" and client.connected
        assert teacher.count("SCORE") == 2  # the forgotten one once, the new one once
        assert client.counters["retries"] == 0

    run(body, script=[restart()])


def test_need_hello_triggers_a_new_handshake_and_resend():
    async def body(client, teacher):
        await client.connect()
        teacher.forget()  # the teacher forgot this client
        result = await client.score(TOKENS, CU, POS, k=4)
        assert result.arrays["ids"].shape == (5, 4)
        assert teacher.count("HELLO") == 2

    run(body)


def test_new_instance_means_handshake_and_resend_of_pending():
    # kill -9 and restart at the same endpoint: the request in flight is lost; the
    # client resends it, meets NEED_HELLO from the new instance, handshakes, resends.
    async def body(client, teacher):
        await client.connect()
        result = await client.score(TOKENS, CU, POS, k=4)
        assert result.instance == "teacher-B" and client.hello.instance == "teacher-B"
        assert teacher.count("HELLO") == 2

    run(body, script=[restart()])


def test_new_instance_seen_in_pong_while_bound_raises_teacher_changed():
    async def body(client, teacher):
        await client.connect()
        await client.bind()
        teacher.script(hold())
        rid = await client.submit(TOKENS, CU, POS, k=4)
        teacher.restart("inst-B")  # the heartbeat PONG reveals it
        with pytest.raises(TeacherChanged) as info:
            await client.wait([rid])
        assert info.value.how == "restart" and info.value.old == ("teacher-A", 0)
        assert await client.bind() == ("inst-B", 0)
        assert (await client.score(TOKENS, CU, POS, k=4)).instance == "inst-B"

    run(body)


def test_tokenizer_mismatch_is_fatal_and_names_both_fingerprints():
    # The client checks HELLO_OK itself, even against a teacher that does not.
    teacher = FakeTeacher(tokenizer_fp="sha256:" + "cd" * 32)
    teacher.checks_tokenizer = False

    async def body(client, teacher):
        with pytest.raises(TokenizerMismatch) as info:
            await client.connect()
        assert FP in str(info.value) and teacher.tokenizer_fp in str(info.value)
        with pytest.raises(TokenizerMismatch):
            await client.submit(TOKENS, CU, POS, k=4)

    run(body, teacher)


@pytest.mark.parametrize("teacher_checks", [True, False])
def test_vocab_size_mismatch_is_fatal(teacher_checks):
    teacher = FakeTeacher(vocab_size=VOCAB + 1)
    teacher.checks_tokenizer = teacher_checks

    async def body(client, teacher):
        with pytest.raises(TokenizerMismatch):
            await client.connect()

    run(body, teacher)


def test_server_side_tokenizer_mismatch_error_is_fatal():
    teacher = FakeTeacher()
    teacher.hello_error = m.ErrorCode.TOKENIZER_MISMATCH

    async def body(client, teacher):
        with pytest.raises(TokenizerMismatch):
            await client.connect()

    run(body, teacher)


def test_three_missed_heartbeats_reconnect_and_resend():
    async def body(client, teacher):
        await client.connect()
        teacher.silent = True
        rid = await client.submit(TOKENS, CU, POS, k=4)
        await anyio.sleep(0.2)  # > 3 heartbeats of 20 ms
        teacher.silent = False
        result = (await client.wait([rid]))[rid]
        assert result.id == rid
        assert client.counters["reconnects"] >= 1
        assert len(teacher.transports) >= 2 and teacher.transports[0].closed

    run(body)


def test_silent_teacher_becomes_unavailable():
    async def body(client, teacher):
        await client.connect()
        teacher.silent = True
        rid = await client.submit(TOKENS, CU, POS, k=4)
        with pytest.raises(TeacherUnavailable):
            await client.wait([rid])

    run(body, unavailable_timeout_s=0.3)


def test_retryable_error_is_retried_and_fatal_error_raised():
    async def body(client, teacher):
        await client.connect()
        result = await client.score(TOKENS, CU, POS, k=4)
        assert [msg.id for msg in teacher.scores] == [result.id, result.id]
        with pytest.raises(TeacherError, match="UNSUPPORTED"):
            await client.score(TOKENS, CU, POS, k=3)

    run(body, script=[error(m.ErrorCode.OVERLOADED), answer(), error(m.ErrorCode.UNSUPPORTED)])


def test_bad_request_is_refused_locally():
    async def body(client, teacher):
        await client.connect()
        with pytest.raises(ProtocolError):
            await client.submit(TOKENS, CU, np.array([4], np.int32), k=4)  # last of seq 0
        with pytest.raises(ProtocolError):
            await client.submit(TOKENS + VOCAB, CU, POS, k=4)
        assert teacher.count("SCORE") == 0

    run(body)


def test_sync_facade_scores_and_runs_admin_calls():
    teacher = FakeTeacher()
    # A SyncTeacherClient with FP, VOCAB, the in-memory transport, 50 ms heartbeats and a
    # 0.5 s request timeout (FAST_SETTINGS).
    with teacher.client("ipc:///tmp/miniverl-test.sock", unavailable_timeout_s=2) as client:
        assert client.hello.instance == "teacher-A"
        client.set_version(2)
        assert client.bind() == ("teacher-A", 0)
        ids = [client.submit(TOKENS, CU, POS, k=4) for _ in range(2)]
        results = client.wait(ids)
        assert sorted(results) == sorted(ids)
        assert all(r.student_version == 2 for r in results.values())
        assert client.status()["state"] == "READY"
        assert client.park().state == "PARKED"
        assert client.wake().state == "READY"
        assert client.reload("fake/other").gen == 1
        assert client.shutdown().t == "SHUTDOWN_OK"
        assert client.counters["sent"] >= 8
    client.close()  # idempotent


def test_admin_only_client_needs_no_handshake():
    async def body(client, teacher):
        await client.connect()
        assert (await client.status())["instance"] == "teacher-A"
        with pytest.raises(ProtocolError):
            await client.submit(TOKENS, CU, POS)
        assert teacher.count("HELLO") == 0

    run(body, tokenizer_fp=None)


def test_retarget_validates_before_switching():
    network = MemoryNetwork({
        "tcp://127.0.0.1:6000": FakeTeacher(instance="inst-C"),
        "tcp://127.0.0.1:7000": FakeTeacher(tokenizer_fp="sha256:" + "ee" * 32),
    })

    async def body(client, teacher):
        network.add("tcp://127.0.0.1:5555", teacher)
        await client.connect()
        await client.bind()
        with pytest.raises(TokenizerMismatch):
            await client.retarget("tcp://127.0.0.1:7000")
        assert client.endpoint == "tcp://127.0.0.1:5555"
        assert (await client.score(TOKENS, CU, POS, k=2)).instance == "teacher-A"
        hello = await client.retarget("tcp://127.0.0.1:6000")
        assert hello.instance == "inst-C"
        rid = await client.submit(TOKENS, CU, POS, k=2)
        with pytest.raises(TeacherChanged) as info:
            await client.wait([rid])
        assert info.value.how == "retarget"

    run(body, transport_factory=network.transport_factory)


def test_a_transport_passed_as_its_factory_fails_at_once():
    # docs/protocol.md: transport_factory is a callable endpoint -> Transport. A transport
    # object there used to end in TeacherUnavailable after the timeout; now it is refused
    # when the client is made, naming the fix.
    class Transport:
        async def send_multipart(self, frames): ...

        async def recv_multipart(self): ...

        def close(self): ...

    with pytest.raises(ConfigError, match="is a transport .*callable endpoint -> Transport"):
        TeacherClient("tcp://127.0.0.1:5555", tokenizer_fp=FP, vocab_size=VOCAB,
                      transport_factory=Transport())
    with pytest.raises(ConfigError, match="not callable"):
        SyncTeacherClient("tcp://127.0.0.1:5555", tokenizer_fp=FP, vocab_size=VOCAB,
                          transport_factory="tcp")


def test_a_factory_returning_no_transport_fails_at_connect_not_after_the_timeout():
    async def body(client, teacher):
        with anyio.fail_after(2):  # unavailable_timeout_s is 60 here
            with pytest.raises(ConfigError, match="returned a NoneType without send_multipart"):
                await client.connect()

    run(body, transport_factory=lambda endpoint: None, unavailable_timeout_s=60)


def test_a_score_sent_again_after_a_new_instance_or_need_hello_counts_as_a_retry():
    # docs/protocol.md: `retries` counts every resend, also the ones a restarted teacher
    # (new instance: resend_scores) or a NEED_HELLO queues, not only timeouts.
    from miniverl.protocol.pending import PendingTable

    async def main():
        table = PendingTable()
        sent = []

        async def send(frames):
            sent.append(frames)
            return True

        async def pump():
            await table.pump(send, lambda t: True, max_inflight=8, request_timeout_s=60)

        table.file_score([b"a"], rid=1, kind="topk", k=4, positions=2)
        await pump()
        assert table.counters()["retries"] == 0 and len(sent) == 1  # the first send
        table.resend_scores()  # a new instance: what is open goes out again
        await pump()
        assert table.counters()["retries"] == 1 and len(sent) == 2
        await pump()
        assert table.counters()["retries"] == 1 and len(sent) == 2  # sent once, not again
        table.on_error(m.ErrorReply(id=1, ref_id=1, code=m.ErrorCode.NEED_HELLO,
                                    message="say HELLO", retryable=True), retry_after_s=0.0)
        await pump()
        assert table.counters()["retries"] == 2 and len(sent) == 3

    anyio.run(main)
