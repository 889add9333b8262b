"""What a teacher serving named adapters refuses, and how its batcher groups them.

What a user relies on (docs/protocol.md, "Adapters"): each request that asks for an
adapter the teacher cannot score it with gets one ``ERROR UNSUPPORTED`` line that names
the adapter asked for and the ones served (a HELLO or SCORE naming one it does not
serve, a SCORE naming none to a teacher serving only named adapters, a SCORE naming one
to a teacher serving none, a SCORE naming another adapter than its connection's HELLO),
and the teacher keeps serving; queued SCOREs of several adapters are batched one adapter
at a time, in arrival order within each; generated HELLO and SCORE headers with any
adapter value are answered and never stop the loop. Real server, numpy ``FakeBackend``
(``miniverl.testing``), no torch.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miniverl.common.names import NAME
from miniverl.protocol import messages as m
from miniverl.testing import FakeBackend, TeacherHarness
from tests.teacher_server.harness import FP, VOCAB, recv, score_arrays, score_header, send

SERVED = {"calc": "sha256:" + "1" * 64, "chat": "sha256:" + "2" * 64}
IDS = itertools.count(100)


def one_line_unsupported(reply: m.Message) -> str:
    assert isinstance(reply, m.ErrorReply), reply
    assert reply.code == m.ErrorCode.UNSUPPORTED and not reply.retryable, reply
    assert "\n" not in reply.message
    return reply.message


def scored(conn, adapter: str | None, rid: int | None = None) -> m.Message:
    header = score_header(rid or next(IDS), **({"adapter": adapter} if adapter else {}))
    return conn.call(header, score_arrays())[0]


@pytest.fixture
def adapters_teacher(harness):
    h, backend = harness(backend=FakeBackend(adapters=SERVED))
    return h


@pytest.fixture
def plain_teacher(harness):
    h, backend = harness()
    return h


def test_a_hello_naming_an_adapter_not_served_names_it_and_the_served_ones(adapters_teacher):
    conn = adapters_teacher.raw()
    message = one_line_unsupported(conn.hello(FP, VOCAB, adapter="nope"))
    assert "HELLO names adapter 'nope'" in message and "'calc', 'chat'" in message
    assert conn.hello(FP, VOCAB, adapter="calc").t == "HELLO_OK"  # still serving
    assert scored(conn, "calc").t == "SCORE_OK"


def test_a_hello_naming_an_adapter_to_a_teacher_serving_none(plain_teacher):
    conn = plain_teacher.raw()
    message = one_line_unsupported(conn.hello(FP, VOCAB, adapter="calc"))
    assert "adapter 'calc'" in message and "serves no named adapters" in message
    assert "--adapters calc=DIR" in message
    hello = conn.hello(FP, VOCAB)
    assert hello.t == "HELLO_OK" and hello.adapters is None  # off the wire, as before
    assert scored(conn, None).t == "SCORE_OK"


def test_a_score_naming_no_adapter_to_a_teacher_serving_only_named_ones(adapters_teacher):
    # The base model is not served under no name: a student that forgot its adapter would
    # otherwise train on the base's targets under the base's identity without a word.
    conn = adapters_teacher.raw()
    hello = conn.hello(FP, VOCAB)  # a HELLO naming none is answered: it lists the adapters
    assert hello.t == "HELLO_OK" and [a.name for a in hello.adapters] == ["calc", "chat"]
    message = one_line_unsupported(scored(conn, None))
    assert "SCORE names no adapter" in message and "('calc', 'chat')" in message


def test_a_score_naming_an_adapter_to_a_teacher_serving_none(plain_teacher):
    conn = plain_teacher.raw()
    assert conn.hello(FP, VOCAB).t == "HELLO_OK"
    message = one_line_unsupported(scored(conn, "calc"))
    assert "SCORE names adapter 'calc'" in message and "serves no named adapters" in message
    assert scored(conn, None).t == "SCORE_OK"


def test_a_score_naming_an_adapter_not_served(adapters_teacher):
    conn = adapters_teacher.raw()
    assert conn.hello(FP, VOCAB, adapter="calc").t == "HELLO_OK"
    message = one_line_unsupported(scored(conn, "nope"))
    assert "SCORE names adapter 'nope'" in message and "'calc', 'chat'" in message


def test_a_score_naming_another_adapter_than_its_hello(adapters_teacher):
    # HELLO_OK gave this connection calc's identity: a chat reply would be recorded as calc's.
    conn = adapters_teacher.raw()
    assert conn.hello(FP, VOCAB, adapter="calc").t == "HELLO_OK"
    message = one_line_unsupported(scored(conn, "chat"))
    assert "'chat'" in message and "HELLO with adapter 'calc'" in message
    other = adapters_teacher.raw()
    assert other.hello(FP, VOCAB).t == "HELLO_OK"
    message = one_line_unsupported(scored(other, "chat"))
    assert "HELLO without an adapter" in message
    assert other.hello(FP, VOCAB, adapter="chat").t == "HELLO_OK"  # the fix the line names
    assert scored(other, "chat").t == "SCORE_OK"


def test_queued_scores_are_batched_one_adapter_at_a_time_in_arrival_order(harness):
    backend = FakeBackend(adapters=SERVED)
    h, _ = harness(backend=backend, batch_tokens=1000)
    conns = {name: h.raw() for name in SERVED}
    for name, conn in conns.items():
        assert conn.hello(FP, VOCAB, adapter=name).t == "HELLO_OK"
    backend.hold()
    order = ["calc", "chat", "calc", "chat", "chat", "calc", "calc"]
    for rid, name in enumerate(order, start=1):
        send(conns[name], score_header(rid, adapter=name), score_arrays())
        if rid == 1:
            assert backend.entered.wait(5)
    deadline = time.monotonic() + 10  # all six behind the held one queued, however loaded
    while len(h.server.srv.queue) < len(order) - 1:
        assert time.monotonic() < deadline, f"{len(h.server.srv.queue)} of 6 queued after 10 s"
        time.sleep(0.005)
    backend.release()
    answered = [recv(conn)[0] for name, conn in conns.items() for _ in range(order.count(name))]
    assert sorted(msg.id for msg in answered) == list(range(1, len(order) + 1))
    assert backend.batches == [[1], [2, 4, 5], [3, 6, 7]]
    assert backend.batch_adapters == [["calc"], ["chat"] * 3, ["calc"] * 3]


# -- generated headers -----------------------------------------------------------------

ADAPTER_VALUES = (st.sampled_from([*SERVED, "nope", ""]) | st.text(max_size=40)
                  | st.text(min_size=1020, max_size=1030) | st.integers(-5, 5) | st.booleans()
                  | st.lists(st.sampled_from(list(SERVED)), max_size=2))
REPLY_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def fuzzed():
    h = TeacherHarness(backend=FakeBackend(adapters=SERVED))
    conn = h.raw()
    assert conn.hello(FP, VOCAB, adapter="calc").t == "HELLO_OK"
    before = conn.call(score_header(next(IDS), adapter="calc"), score_arrays())
    assert before[0].t == "SCORE_OK"
    # The adapter of the connection's last accepted HELLO: a refused one changes nothing.
    yield conn, {"said": "calc"}
    assert conn.hello(FP, VOCAB, adapter="calc").t == "HELLO_OK"
    after = conn.call(score_header(next(IDS), adapter="calc"), score_arrays())
    assert after[0].t == "SCORE_OK"
    for name in before[1]:
        np.testing.assert_array_equal(before[1][name], after[1][name])
    h.close()


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(hello_adapter=ADAPTER_VALUES, score_adapter=ADAPTER_VALUES | st.none())
def test_generated_adapter_fields_are_answered_and_the_teacher_keeps_serving(
        fuzzed, hello_adapter, score_adapter):
    conn, state = fuzzed
    rid = next(IDS)
    reply = conn.call({"v": 1, "t": "HELLO", "id": rid, "client": "fuzz", "tokenizer_fp": FP,
                       "vocab_size": VOCAB, "adapter": hello_adapter}, timeout_s=REPLY_WITHIN_S)[0]
    # A name is a name on the wire (common/names.py): anything else is BAD_REQUEST.
    valid_name = isinstance(hello_adapter, str) and NAME.fullmatch(hello_adapter) is not None
    if valid_name and hello_adapter in SERVED:
        assert reply.t == "HELLO_OK" and reply.teacher.adapter_sha256 == SERVED[hello_adapter]
        state["said"] = hello_adapter
    else:
        assert reply.t == "ERROR" and reply.ref_id == rid
        assert reply.code == (m.ErrorCode.UNSUPPORTED if valid_name else m.ErrorCode.BAD_REQUEST)
    header = score_header(next(IDS))
    if score_adapter is not None:
        header["adapter"] = score_adapter
    reply = conn.call(header, score_arrays(), timeout_s=REPLY_WITHIN_S)[0]
    ok = score_adapter == state["said"]
    assert reply.t == ("SCORE_OK" if ok else "ERROR"), reply


def test_a_scorer_whose_backend_does_not_serve_the_adapters_fails_the_load(monkeypatch):
    # A plug-in scorer that does not list the adapters would score every request with
    # whatever it holds, under each adapter's name: the load fails instead.
    from miniverl.common.errors import ConfigError
    from miniverl.teacher_server import scorers
    from miniverl.teacher_server.loader import TeacherSpec

    made = []
    monkeypatch.setattr(scorers, "get_scorer",
                        lambda name: lambda spec, **kw: made.append(FakeBackend()) or made[-1])
    load = scorers.make_loader(TeacherSpec(model="m", adapters={"calc": "dir"}), scorer="plain")
    with pytest.raises(ConfigError, match="scorer 'plain' does not serve the named adapters "
                                          "calc .its backend lists none.; drop --adapters"):
        load(None)
    assert made[0].calls == ["close"]
