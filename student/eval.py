"""Evaluation: success rate of the current policy on a held-out split.

``evaluate`` makes the split's tasks (``make_tasks`` with the recipe's environment,
difficulty and split seed), plays them with :class:`~miniverl.student.rollout.runner.RolloutRunner`
(greedy unless ``recipe.eval.greedy`` is false), and returns an :class:`EvalSummary`
with the success rate, a per-difficulty breakdown and the stop reasons. A recipe with a
mixture (``environments:``) plays every environment's split tasks (``eval.max_tasks`` caps
each environment), each in its own environment; its ``success`` is over all of them and
``by_environment`` holds each environment's success, episode count and weight. With
``out_dir`` it also writes ``<split>-v<version>.trajectories.jsonl`` and
``<split>-v<version>.summary.json`` there.

For an environment that injects tool faults (its tasks carry ``data["fault"]``, e.g.
``calculator`` with ``faults > 0``) the summary also holds ``faults``: success on the
faulted and on the fault-free tasks, the recovery rate (episodes that saw a tool error
and made a tool call that succeeded after it, over episodes that saw a tool error) and
the retry rate (a tool call attempted after the error; ``student/environments/faults.py``).

With ``eval.samples`` N the summary also holds ``sampled``: every task played N times at
``eval.temperature`` (1.0 unless set), the mean success and pass@N
(``student/eval_sampling.py``), and for a mixture each environment's success and tool
calls at that temperature (``sampled.by_environment``). When the run's fixed set is a
function of the task (oracle traces, the teacher's own episodes) it holds
``coverage``: the share of the evaluated episodes' turn-start states that the fixed
set's source, played on the same tasks, never shows (``student/coverage.py``);
``sampled`` has its own.

This module does not train, score with a teacher or log run events; the trainer does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miniverl.common.atomic import atomic_write_json
from miniverl.common.qualification import PRIVILEGED
from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.common.trajectory import Trajectory, write_trajectories
from miniverl.student.coverage import coverage_reference, reference_source, state_coverage
from miniverl.student.environments import make_tasks
from miniverl.student.environments.faults import fault_breakdown, has_faults
from miniverl.student.environments.mixture import Mixture, mixture_tasks
from miniverl.student.eval_sampling import play_sampled, sampled_summary, temperature_of
from miniverl.student.rollout.runner import RolloutRunner

# Eval seeds are fixed and disjoint from training seeds (which derive from run.seed),
# so sampled (non-greedy) evals are comparable across versions.
EVAL_SEED_BASE = 1_000_003


@dataclass
class EvalSummary:
    """What an eval found; ``to_dict`` is the JSON summary (without trajectories)."""

    split: str
    policy_version: int
    success: float
    n: int
    by_difficulty: dict[str, dict[str, float]]
    stop_reasons: dict[str, int]
    mean_score: float = 0.0
    mean_tool_calls: float = 0.0
    # Environments with injected faults only: faulted / fault-free success and recovery.
    faults: dict[str, Any] | None = None
    # eval.samples only: success over N sampled episodes per task (eval_sampling.py).
    sampled: dict[str, Any] | None = None
    # A fixed set that is a function of the task only: unseen turn-start states.
    coverage: dict[str, Any] | None = None
    # A mixture only: each environment's success, episodes and weight, in recipe order.
    by_environment: dict[str, dict[str, float]] | None = None
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)
    sampled_trajectories: list[Trajectory] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "split": self.split,
            "policy_version": self.policy_version,
            "success": self.success,
            "n": self.n,
            "by_difficulty": self.by_difficulty,
            "stop_reasons": self.stop_reasons,
            "mean_score": self.mean_score,
            "mean_tool_calls": self.mean_tool_calls,
        }
        # Absent while unused (no faults, no eval.samples, no fixed set): such summaries
        # are unchanged.
        for name in ("faults", "sampled", "coverage", "by_environment"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


def by_environment(trajs: list[Trajectory], mixture: Mixture) -> dict[str, dict[str, float]]:
    """Each environment's success, episode count, weight and tool calls per episode (its
    episodes are those tagged with its name), in the mixture's order."""
    out = {}
    for name, weight in zip(mixture.names, mixture.weights, strict=True):
        mine = [t for t in trajs if t.environment == name]
        n = len(mine)
        out[name] = {"success": sum(t.verifier.success for t in mine) / n if n else 0.0,
                     "n": n, "weight": weight,
                     "tool_calls": sum(t.tool_calls.total for t in mine) / n if n else 0.0}
    return out


def summarize(
    trajs: list[Trajectory], split: str, policy_version: int, tasks: list[Any] | None = None,
    mixture: Mixture | None = None,
) -> EvalSummary:
    """Success, per-difficulty success and stop reasons of finished trajectories (and,
    given their ``tasks`` from an environment with faults, the fault breakdown; given
    their ``mixture``, each environment's success)."""
    n = len(trajs)
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.difficulty, []).append(t)
    by_difficulty = {
        d: {"success": sum(t.verifier.success for t in g) / len(g), "n": len(g)}
        for d, g in sorted(groups.items())
    }
    return EvalSummary(
        split=split,
        policy_version=policy_version,
        success=sum(t.verifier.success for t in trajs) / n if n else 0.0,
        n=n,
        by_difficulty=by_difficulty,
        stop_reasons=dict(Counter(t.stop_reason.value for t in trajs)),
        mean_score=sum(t.verifier.score for t in trajs) / n if n else 0.0,
        mean_tool_calls=sum(t.tool_calls.total for t in trajs) / n if n else 0.0,
        faults=fault_breakdown(tasks, trajs) if tasks and has_faults(tasks) else None,
        by_environment=by_environment(trajs, mixture) if mixture is not None else None,
        trajectories=trajs,
    )


def evaluate(
    model,
    tokenizer,
    recipe,
    *,
    split: str | None = None,
    policy_version: int,
    out_dir: str | Path | None = None,
    tokenizer_fp: str | None = None,
    max_tasks: int | None = None,
    privileged: bool = False,
    offline: bool = False,
) -> EvalSummary:
    """Play the ``split`` tasks (default ``recipe.eval.split``) and summarise them.

    ``privileged``: play them in the privileged teacher's view (the task's privileged
    context in every system message; qualifying a ``privileged_context`` teacher). A
    recipe with ``rollout.view: privileged_context`` (a privileged teacher's preparation)
    always plays that view. ``offline``: a teacher that plays the coverage reference
    (``fixed_set: teacher``) loads without touching the network."""
    split = split or recipe.eval.split
    env_cfg, mixture = recipe.environment, None
    n = env_cfg.eval_tasks if split == "eval" else env_cfg.test_tasks
    if split == "train":
        n = env_cfg.train_tasks
    caps = [cap for cap in (recipe.eval.max_tasks, max_tasks) if cap is not None]
    if recipe.environments is None:
        tasks = make_tasks(env_cfg.name, split, min([n, *caps]), env_cfg.difficulty,
                           env_cfg.split_seed, params=env_cfg.params)
    else:
        mixture = mixture_tasks(recipe.environments, split, min(caps) if caps else None)
        env_cfg, tasks = recipe.environments[0], mixture.all_tasks()
    if tokenizer_fp is None:
        tokenizer_fp = fingerprint_tokenizer(tokenizer)
    runner = RolloutRunner(
        model,
        tokenizer,
        env_name=env_cfg.name,
        env_params=env_cfg.params,
        rollout=recipe.rollout,
        tokenizer_fp=tokenizer_fp,
        privileged=privileged or recipe.rollout.view == PRIVILEGED,
        mixture=mixture,
    )
    seeds = [EVAL_SEED_BASE + i for i in range(len(tasks))]
    trajs = runner.run(tasks, policy_version=policy_version, seeds=seeds,
                       greedy=recipe.eval.greedy)
    summary = summarize(trajs, split, policy_version, tasks, mixture)
    samples = recipe.eval.samples
    if samples is not None:
        temperature = temperature_of(recipe.eval)
        sampler = RolloutRunner(
            model, tokenizer, env_name=env_cfg.name, env_params=env_cfg.params,
            rollout=recipe.rollout.model_copy(update={"temperature": temperature}),
            tokenizer_fp=tokenizer_fp, privileged=runner.privileged, mixture=mixture,
        )
        summary.sampled_trajectories = play_sampled(sampler, tasks, samples=samples,
                                                    policy_version=policy_version)
        summary.sampled = sampled_summary(summary.sampled_trajectories, samples=samples,
                                          temperature=temperature)
        if mixture is not None:  # each environment's T=1 success and tool calls
            summary.sampled["by_environment"] = by_environment(summary.sampled_trajectories,
                                                               mixture)
    reference = None if privileged else coverage_reference(
        recipe, tasks, seeds, tokenizer, tokenizer_fp, split=split, out_dir=out_dir,
        offline=offline)
    if reference is not None:
        summary.coverage = {"source": reference_source(recipe), **state_coverage(trajs, reference)}
        if summary.sampled is not None:
            summary.sampled["coverage"] = state_coverage(summary.sampled_trajectories, reference)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"{split}-v{policy_version}"
        write_trajectories(out / f"{stem}.trajectories.jsonl", trajs)
        if summary.sampled is not None:
            write_trajectories(out / f"{stem}.sampled.trajectories.jsonl",
                               summary.sampled_trajectories)
        atomic_write_json(out / f"{stem}.summary.json", summary.to_dict())
    return summary
