"""Injected tool faults, decided per task from its seed, and the recovery metric.

A fault is decided when a task is generated, from the task's seed alone (its own
random stream, so the prompt and answer are those of the fault-free task), and stored
in ``task.data["fault"]``: ``None`` or ``{"kind": "transient", "call": k}``. In an
episode of that task, the ``k``-th tool call that passes the argument checks (0-based)
answers ``error: the calculator tool is temporarily unavailable; call it again``
(:data:`TRANSIENT_MESSAGE`) instead of running; the same call made again runs
normally. The right move after it is to call again. The oracle does exactly that, so
an oracle trace of a faulted task holds the error and the recovery.

The recovery metric reads a finished episode's messages:

- an episode **saw an error** when at least one tool result starts with ``error``
  (an injected fault, a refused expression, a malformed call: any of them);
- it **recovered** when the call that got its first error is made again later, with the
  same tool and arguments, and this time succeeds (its result does not start with
  ``error``): the fix for a transient fault. A different call after the error does not
  count (the benchmark's faults are transient; an error whose fix is another call, such
  as a refused expression, is not measured here), and neither does an error that came
  from a call that did not parse. Whether the final answer is then right is strict
  success, measured apart;
- it **retried** when an assistant turn after its first error attempts a tool call (a
  parsed call, or ``<tool_call>`` in its text even if malformed or cut off): the
  decision to call again, whether or not the call came out right;
- the **recovery rate** (and the **retry rate**) of a set of episodes is recovered
  (retried) / saw an error.

This module is torch-free and knows nothing about models or rollouts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from typing import Any

# The environment raises it; ``Environment.step`` prefixes ``error: `` as for any failure.
TRANSIENT_MESSAGE = "the {tool} tool is temporarily unavailable; call it again"


def check_rate(rate: Any) -> float:
    """``rate`` as a float in [0, 1]; a ValueError naming the rule otherwise."""
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate):
        raise ValueError(
            f"faults {rate!r} must be a number from 0 to 1 (the share of faulted tasks)")
    if not 0.0 <= float(rate) <= 1.0:
        raise ValueError(f"faults {rate!r} must be from 0 to 1 (the share of faulted tasks)")
    return float(rate)


def draw_fault(env_name: str, seed: int, rate: float, n_calls: int) -> dict[str, Any] | None:
    """The fault of the task with ``seed``: None, or which of its ``n_calls`` calls fails.

    A stream of its own (not the task generator's), so adding faults changes no prompt,
    answer or task id, and a task keeps its fault whatever the other tasks drew.
    """
    rng = random.Random(f"{env_name}-fault:{int(seed)}")
    if rng.random() >= rate:
        return None
    return {"kind": "transient", "call": rng.randrange(max(1, n_calls))}


class FaultState:
    """One episode's fault: counts the tool calls and fails the chosen one once."""

    def __init__(self, fault: dict[str, Any] | None) -> None:
        self.fault = fault
        self.calls = 0

    def trip(self, tool: str) -> str | None:
        """The error message if this call is the faulted one, else None; counts the call."""
        index = self.calls
        self.calls += 1
        if self.fault is not None and index == self.fault.get("call"):
            return TRANSIENT_MESSAGE.format(tool=tool)
        return None


def with_retry(calls: list[Any], fault: dict[str, Any] | None) -> list[Any]:
    """Oracle calls with the faulted one made twice: it fails, then it is called again."""
    if fault is None or not 0 <= fault.get("call", -1) < len(calls):
        return list(calls)
    k = fault["call"]
    return [*calls[: k + 1], calls[k], *calls[k + 1 :]]


def _calls_and_results(messages: Iterable[dict[str, Any]]) -> list[tuple[Any, str]]:
    """Each tool result with the parsed call ``(name, arguments)`` that produced it, in
    order. A turn's results follow its calls one to one; a turn with a call that did not
    parse (more results than parsed calls) pairs its results with None."""
    out: list[tuple[Any, str]] = []
    calls: list[Any] = []
    results: list[str] = []

    def flush() -> None:
        paired = calls if len(calls) == len(results) else [None] * len(results)
        out.extend(zip(paired, results, strict=True))

    for message in messages:
        if message.get("role") == "assistant":
            flush()
            calls = [(c.get("function", {}).get("name"), c.get("function", {}).get("arguments"))
                     for c in message.get("tool_calls") or []]
            results = []
        elif message.get("role") == "tool":
            results.append(str(message.get("content", "")))
    flush()
    return out


def episode_recovery(messages: Iterable[dict[str, Any]]) -> tuple[bool, bool]:
    """``(saw_error, recovered)`` of one episode (see the module docstring)."""
    pairs = _calls_and_results(messages)
    first = next((i for i, (_, r) in enumerate(pairs) if r.startswith("error")), None)
    if first is None:
        return False, False
    failed = pairs[first][0]
    recovered = failed is not None and any(
        call == failed and not result.startswith("error") for call, result in pairs[first + 1:])
    return True, recovered


def episode_retried(messages: Iterable[dict[str, Any]]) -> bool:
    """Whether an assistant turn after the episode's first tool error attempts a call."""
    seen_error = False
    for message in messages:
        if message.get("role") == "tool" and str(message.get("content", "")).startswith("error"):
            seen_error = True
        elif seen_error and message.get("role") == "assistant" and (
            message.get("tool_calls") or "<tool_call>" in str(message.get("content", ""))
        ):
            return True
    return False


def has_faults(tasks: Iterable[Any]) -> bool:
    """True when the tasks come from an environment that injects faults."""
    return any("fault" in task.data for task in tasks)


def fault_breakdown(tasks: Iterable[Any], trajs: Iterable[Any]) -> dict[str, Any]:
    """Success on faulted and fault-free tasks and the recovery rate of ``trajs``.

    ``trajs`` are finished episodes (``task_id``, ``verifier``, ``messages``) of
    ``tasks``; an episode of an unknown task counts as fault-free.
    """
    faulted = {t.id for t in tasks if t.data.get("fault")}
    groups: dict[str, list[bool]] = {"faulted": [], "fault_free": []}
    errors = recovered = retried = 0
    for traj in trajs:
        groups["faulted" if traj.task_id in faulted else "fault_free"].append(
            bool(traj.verifier.success))
        saw, back = episode_recovery(traj.messages)
        errors += saw
        recovered += back
        retried += saw and episode_retried(traj.messages)
    out: dict[str, Any] = {
        name: {"success": sum(v) / len(v) if v else None, "n": len(v)}
        for name, v in groups.items()
    }
    out["recovery"] = {
        "rate": recovered / errors if errors else None,
        "n_error_episodes": errors,
        "n_recovered": recovered,
        "retry_rate": retried / errors if errors else None,
        "n_retried": retried,
    }
    return out
