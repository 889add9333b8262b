"""Sampled evaluation (``eval.samples``, ``eval.temperature``): every held-out task
played ``N`` times at temperature ``T`` (1.0 unless set), beside the greedy eval.

A greedy eval answers "is the policy's single most likely path right", which on tasks
with one correct sequence can hide how much probability the policy puts on it; the
mean success over ``N`` samples per task estimates the policy's success probability
itself. Sample ``j`` of task ``i`` has the fixed seed ``SAMPLED_SEED_BASE + j *
SAMPLE_STRIDE + i`` (disjoint from the greedy eval's ``EVAL_SEED_BASE + i`` and from
training seeds), so versions and arms are compared on the same draws. The summary
(:func:`sampled_summary`) holds the mean success over all ``N x tasks`` episodes (each
task weighs ``N``, so it is also the mean of the per-task success rates), the share of
tasks with at least one success in ``N`` (pass@N), the per-difficulty means and the
stop reasons.

This module does not pick the tasks (``eval.py``) or write files.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from miniverl.common.trajectory import Trajectory
from miniverl.student.rollout.runner import RolloutRunner

SAMPLED_SEED_BASE = 2_000_003
SAMPLE_STRIDE = 1_000_000  # more than a held-out split can hold (eval_tasks, test_tasks <= 1e6)
DEFAULT_TEMPERATURE = 1.0


def sampled_seeds(n_tasks: int, samples: int) -> list[int]:
    """Seeds of the ``samples x n_tasks`` episodes, sample-major (all tasks of sample 0
    first), matching :func:`repeat_tasks`."""
    return [SAMPLED_SEED_BASE + j * SAMPLE_STRIDE + i
            for j in range(samples) for i in range(n_tasks)]


def repeat_tasks(tasks: list[Any], samples: int) -> list[Any]:
    return [task for _ in range(samples) for task in tasks]


def temperature_of(eval_config: Any) -> float:
    """``eval.temperature``, or 1.0 when unset."""
    return DEFAULT_TEMPERATURE if eval_config.temperature is None else eval_config.temperature


def play_sampled(runner: RolloutRunner, tasks: list[Any], *, samples: int,
                 policy_version: int) -> list[Trajectory]:
    """Play every task ``samples`` times with ``runner`` (built at the eval temperature)."""
    return runner.run(repeat_tasks(tasks, samples), policy_version=policy_version,
                      seeds=sampled_seeds(len(tasks), samples))


def sampled_summary(trajs: list[Trajectory], *, samples: int,
                    temperature: float) -> dict[str, Any]:
    """Mean success, pass@N, per-difficulty means, stop reasons and tool calls per episode
    of sampled episodes."""
    by_task: dict[str, list[bool]] = {}
    by_difficulty: dict[str, list[bool]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, []).append(bool(t.verifier.success))
        by_difficulty.setdefault(t.difficulty, []).append(bool(t.verifier.success))
    n = len(trajs)
    return {
        "samples": samples,
        "temperature": temperature,
        "success": sum(t.verifier.success for t in trajs) / n if n else 0.0,
        "any_success": (sum(any(v) for v in by_task.values()) / len(by_task)
                        if by_task else 0.0),
        "n": len(by_task),
        "episodes": n,
        "by_difficulty": {d: {"success": sum(v) / len(v), "n": len(v) // samples}
                          for d, v in sorted(by_difficulty.items())},
        "stop_reasons": dict(Counter(t.stop_reason.value for t in trajs)),
        "mean_tool_calls": sum(t.tool_calls.total for t in trajs) / n if n else 0.0,
    }
