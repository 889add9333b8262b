"""A mixture's evaluation: success over all its episodes, and each environment's
success, episode count and weight (by each episode's own tag); a single environment's
summary has no such breakdown (its JSON is unchanged)."""

from __future__ import annotations

from miniverl.common.recipe_sections import MixtureEnvironmentConfig as Env
from miniverl.common.trajectory import Span, SpanType, Trajectory, VerifierResult
from miniverl.student.environments.mixture import mixture_tasks
from miniverl.student.eval import summarize


def _traj(environment: str, success: bool, i: int) -> Trajectory:
    return Trajectory(
        id=f"{environment}/t{i}/v0/s{i}", tokens=[0, 1, 2], tokenizer_fp="fp",
        environment=environment, task_id=f"t{i}", policy_version=0, difficulty="easy",
        spans=[Span(type=SpanType.USER, start=0, end=2),
               Span(type=SpanType.ASSISTANT_FINAL, start=2, end=3)],
        verifier=VerifierResult(success=success, score=float(success)),
    )


def test_a_mixture_summary_holds_each_environment_and_the_whole():
    mixture = mixture_tasks([Env(name="calculator", weight=3, eval_tasks=1),
                             Env(name="sqlite", weight=1, eval_tasks=1),
                             Env(name="jsonnav", weight=0, eval_tasks=1)], "eval")
    trajs = [_traj("calculator", True, 0), _traj("sqlite", False, 1),
             _traj("calculator", False, 2), _traj("sqlite", False, 3)]
    for traj, calls in zip(trajs, (3, 1, 1, 0), strict=True):
        traj.tool_calls.total = calls  # tool calls per episode, per environment
    summary = summarize(trajs, "eval", 0, mixture=mixture)
    assert summary.success == 0.25 and summary.n == 4 and summary.mean_tool_calls == 1.25
    assert summary.by_environment == {
        "calculator": {"success": 0.5, "n": 2, "weight": 3.0, "tool_calls": 2.0},
        "sqlite": {"success": 0.0, "n": 2, "weight": 1.0, "tool_calls": 0.5},
        "jsonnav": {"success": 0.0, "n": 0, "weight": 0.0, "tool_calls": 0.0},
    }
    assert summary.to_dict()["by_environment"] == summary.by_environment


def test_a_single_environment_summary_has_no_breakdown():
    summary = summarize([_traj("calculator", True, 0)], "eval", 0)
    assert summary.by_environment is None and "by_environment" not in summary.to_dict()
