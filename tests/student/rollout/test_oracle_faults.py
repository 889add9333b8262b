"""Oracle traces of faulted tasks hold the tool error and the recovery, and still verify.

The teacher learns recovery from these traces (and the continued-SFT arm of the
recovery benchmark trains on them): the error must be a context span the model reads,
followed by the same call again, its result and the right answer.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from miniverl.common.toy import build_toy_tokenizer  # noqa: E402
from miniverl.common.trajectory import SpanType  # noqa: E402
from miniverl.student.environments import make_tasks  # noqa: E402
from miniverl.student.environments.faults import episode_recovery  # noqa: E402
from miniverl.student.rollout.oracle import oracle_trajectory  # noqa: E402

PARAMS = {"units": False, "faults": 0.5}
ERROR = "error: the calculator tool is temporarily unavailable; call it again"


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


def test_a_faulted_oracle_trace_shows_the_error_then_the_recovery(tok):
    made = make_tasks("calculator", "train", 16, "easy", 0, params=PARAMS)
    task = next(t for t in made if t.data["fault"])
    traj = oracle_trajectory("calculator", task, tok, "fp", PARAMS)
    assert traj.verifier.success
    assert (traj.tool_calls.total, traj.tool_calls.failed) == (2, 1)
    tools = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tools == [ERROR, task.answer]
    calls = [m for m in traj.messages if m["role"] == "assistant" and m.get("tool_calls")]
    assert len(calls) == 2 and calls[0]["tool_calls"] == calls[1]["tool_calls"]
    assert episode_recovery(traj.messages) == (True, True)
    # Two trained tool-call turns around the error, which is context only.
    types = [s.type for s in traj.spans]
    assert types.count(SpanType.ASSISTANT_TOOL_CALL) == 2
    # The error is read as context (a tool_result span), never trained on.
    holding = [s for s in traj.spans if ERROR in tok.decode(traj.tokens[s.start:s.end])]
    assert [s.type for s in holding] == [SpanType.TOOL_RESULT]
    assert not traj.loss_mask()[holding[0].start:holding[0].end].any()


def test_a_fault_free_oracle_trace_is_the_one_without_the_parameter(tok):
    made = make_tasks("calculator", "train", 16, "easy", 0, params=PARAMS)
    task = next(t for t in made if not t.data["fault"])
    plain = make_tasks("calculator", "train", 16, "easy", 0, params={"units": False})
    twin = next(t for t in plain if t.id == task.id)
    a = oracle_trajectory("calculator", task, tok, "fp", PARAMS)
    b = oracle_trajectory("calculator", twin, tok, "fp", {"units": False})
    assert a.tokens == b.tokens and a.tool_calls.failed == 0
