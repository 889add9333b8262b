"""Injected tool faults: decided per task from its seed, replayable, recoverable by calling again.

What a benchmark relies on: a task's fault does not depend on which other tasks were
made or on the process; faults change no prompt, answer or task id (the cold student's
fault-free tasks are the same tasks); ``faults: 0`` is byte-identical to no parameter;
the faulted call fails once per episode and the same call made again works; and the
recovery metric says exactly what its docs say.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import VerifierResult
from miniverl.student.environments import FinalAnswer, ToolCall, get_environment, make_tasks
from miniverl.student.environments.faults import (
    episode_recovery,
    episode_retried,
    fault_breakdown,
    has_faults,
    with_retry,
)

FAULTY = {"units": False, "faults": 0.5}
ERROR = "error: the calculator tool is temporarily unavailable; call it again"


def tasks(n=64, split="train", params=FAULTY, difficulty="easy"):
    return make_tasks("calculator", split, n, difficulty, split_seed=0, params=params)


def test_faults_are_deterministic_per_task_and_change_no_prompt():
    faulty, plain = tasks(), tasks(params={"units": False})
    assert [t.to_dict() for t in faulty] == [t.to_dict() for t in tasks()]
    # A task's fault comes from its own seed: a longer list keeps the first tasks' faults.
    assert [t.data["fault"] for t in tasks(128)[:64]] == [t.data["fault"] for t in faulty]
    for f, p in zip(faulty, plain, strict=True):
        assert (f.id, f.prompt, f.answer, f.data["plan"]) == (p.id, p.prompt, p.answer,
                                                              p.data["plan"])
    faulted = [t for t in faulty if t.data["fault"]]
    assert 16 < len(faulted) < 48  # about half of 64
    assert all(t.data["fault"] == {"kind": "transient", "call": 0} for t in faulted)


def test_no_faults_is_byte_identical_to_no_parameter():
    for difficulty in ("easy", "medium", "hard"):
        a = make_tasks("calculator", "eval", 16, difficulty, 0, params={"faults": 0})
        b = make_tasks("calculator", "eval", 16, difficulty, 0)
        assert json.dumps([t.to_dict() for t in a]) == json.dumps([t.to_dict() for t in b])
        assert not has_faults(a)
    env = get_environment("calculator", units=False, faults=0.0)
    assert env.system_prompt() == get_environment("calculator", units=False).system_prompt()


def test_every_task_faulted_at_rate_one_and_multi_step_plans_pick_a_call():
    hard = make_tasks("calculator", "train", 48, "hard", 0, params={"faults": 1.0})
    assert all(t.data["fault"] for t in hard)
    calls = {t.data["fault"]["call"] for t in hard if len(t.data["plan"]) == 2}
    assert calls == {0, 1}


def test_the_faulted_call_fails_once_per_episode_and_works_when_made_again():
    task = next(t for t in tasks() if t.data["fault"])
    args = task.data["plan"][0]["arguments"]
    env = get_environment("calculator", **FAULTY)
    for _ in range(2):  # a new episode of the same task fails again: reset restores it
        env.reset(task)
        assert env.step("calculator", args) == ERROR
        assert env.step("calculator", args) == task.answer
        assert env.step("calculator", args) == task.answer
    clean = next(t for t in tasks() if not t.data["fault"])
    env.reset(clean)
    assert env.step("calculator", clean.data["plan"][0]["arguments"]) == clean.answer


def test_a_call_refused_by_the_argument_checks_does_not_use_up_the_fault():
    task = next(t for t in tasks() if t.data["fault"])
    env = get_environment("calculator", **FAULTY)
    env.reset(task)
    assert env.step("calculator", {"expr": "1"}).startswith("error: unexpected argument")
    assert env.step("calculator", task.data["plan"][0]["arguments"]) == ERROR


def test_oracle_actions_call_again_after_the_fault():
    env = get_environment("calculator", **FAULTY)
    task = next(t for t in tasks() if t.data["fault"])
    call = ToolCall("calculator", task.data["plan"][0]["arguments"])
    assert env.oracle_actions(task) == [call, call, FinalAnswer(task.answer)]
    assert "fails once: make it again" in env.privileged_context(task)
    clean = next(t for t in tasks() if not t.data["fault"])
    assert len(env.oracle_actions(clean)) == 2
    assert "fails" not in env.privileged_context(clean)
    assert with_retry(["a", "b"], {"kind": "transient", "call": 1}) == ["a", "b", "b"]
    assert with_retry(["a"], None) == ["a"]


@pytest.mark.parametrize("rate", [True, -0.1, 1.5, "half", float("nan")])
def test_a_bad_fault_rate_is_refused_with_the_rule(rate):
    with pytest.raises(ConfigError, match=r"faults .* must be .*from 0 to 1"):
        get_environment("calculator", faults=rate)


def call(expression):
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator",
                                          "arguments": {"expression": expression}}}]}


def episode(task_id, steps, success):
    """An episode's messages: one (expression, tool result) pair per call turn."""
    messages = [{"role": "user", "content": "q"}]
    for expression, result in steps:
        messages += [call(expression), {"role": "tool", "content": result}]
    verdict = VerifierResult(success=success, score=float(success), reason="")
    return SimpleNamespace(task_id=task_id, messages=messages, verifier=verdict)


def test_recovery_is_the_failed_call_made_again_and_succeeding():
    def recovery(*steps):
        return episode_recovery(episode("t", steps, True).messages)

    assert recovery(("1 + 2", "3")) == (False, False)
    assert recovery(("1 + 2", ERROR), ("1 + 2", "3")) == (True, True)
    # Another call after the error, even one that works, is not the fix of this fault.
    assert recovery(("1 + 2", ERROR), ("8 + 1", "9")) == (True, False)
    assert recovery(("1 + 2", ERROR), ("1 + 2", ERROR)) == (True, False)
    assert recovery(("1 + 2", "3"), ("1 + 2", ERROR)) == (True, False)
    # An error from a call that did not parse has no call to make again.
    broken = [{"role": "assistant", "content": "<tool_call>{"}, {"role": "tool", "content": ERROR},
              call("1 + 2"), {"role": "tool", "content": "3"}]
    assert episode_recovery(broken) == (True, False)


def test_a_retry_is_any_call_attempt_after_the_first_error():
    error = {"role": "tool", "content": ERROR}
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}
    broken = {"role": "assistant", "content": '<tool_call>\n{"name": "calc'}  # cut off
    answer = {"role": "assistant", "content": "85"}
    assert episode_retried([call, error, call])
    assert episode_retried([call, error, broken])
    assert not episode_retried([call, error, answer])
    assert not episode_retried([call, {"role": "tool", "content": "85"}, call])


def test_fault_breakdown_splits_faulted_and_fault_free_tasks():
    made = tasks(8)
    faulted = [t for t in made if t.data["fault"]]
    clean = [t for t in made if not t.data["fault"]]
    trajs = [episode(faulted[0].id, [("1 + 2", ERROR), ("1 + 2", "3")], False),
             episode(faulted[1].id, [("1 + 2", ERROR)], False),
             episode(clean[0].id, [("1 + 2", "3")], True),
             episode(clean[1].id, [("1 + 2", "3")], False)]
    out = fault_breakdown(made, trajs)
    assert out["faulted"] == {"success": 0.0, "n": 2}
    assert out["fault_free"] == {"success": 0.5, "n": 2}
    assert out["recovery"] == {"rate": 0.5, "n_error_episodes": 2, "n_recovered": 1,
                               "retry_rate": 0.5, "n_retried": 1}
    none = fault_breakdown(made, [episode(clean[0].id, [("1 + 2", "3")], True)])
    assert none["recovery"]["rate"] is None and none["faulted"] == {"success": None, "n": 0}
