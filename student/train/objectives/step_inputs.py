"""The per-position inputs of the standard variants that are not the teacher's, built
once per optimizer step from the step's trajectories: the sampling-time log-probs the
importance ratio divides by, the aggregation weights of ``loss.aggregation: sequence``,
and the advantages of ``loss.use_task_rewards``.

Each is a :class:`~.objective.TeacherTargets` field (``sampling_logprobs_P``,
``weight_P``, ``advantage_P``) that only the objectives of ``variants.py`` read;
:func:`step_inputs` returns them per trajectory and :func:`with_step_inputs` adds a
micro-batch's share to its targets. A weight or a baseline reads the whole step, never
one micro-batch, so gradient accumulation still gives the update of one big batch.

This module holds no tensor formula (``sampled_token.py``), does not select positions
(``common/trajectory.py``) or micro-batch (``updates.py``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
import torch

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import Trajectory
from miniverl.student.train.objectives.objective import LossSettings, TeacherTargets

AGGREGATIONS = ("token", "sequence")
BASELINES = ("group", "batch")


def aggregation_weights(counts_S: list[int], rule: str | None) -> np.ndarray:
    """``float64[S]``: the weight of each position of sequence ``s`` (``counts_S[s]``
    selected positions), for a loss divided by the step's total positions ``N = Σ counts``.

    * ``token`` (None): 1 everywhere, so every position weighs the same and a long
      episode weighs as many times more as it has positions;
    * ``sequence``: ``N / (S' · counts_S[s])`` with ``S'`` the sequences that have any
      position, so the loss is ``(1 / S') Σ_s mean_{p in s} loss_p``: every episode
      weighs the same, whatever its length.

    Equal-length sequences get weight 1 under both rules.
    """
    counts = np.asarray(counts_S, dtype=np.float64)
    if rule in (None, "token"):
        return np.ones_like(counts)
    if rule != "sequence":
        raise ConfigError(
            f"loss.aggregation={rule!r} is not one of {', '.join(AGGREGATIONS)}; fix the recipe"
        )
    present = counts > 0
    weights = np.zeros_like(counts)
    weights[present] = counts.sum() / (present.sum() * counts[present])
    return weights


def task_advantages(rewards_S: list[float], groups_S: list[str], baseline: str | None) -> np.ndarray:
    """``float64[S]``: ``r_s - b_s``, each episode's reward minus a baseline that leaves
    the episode itself out (so it does not depend on the episode's own tokens and the
    policy gradient stays unbiased, as in RLOO).

    * ``group`` (None): ``b_s`` = the mean reward of the *other* episodes of the same
      task in this step (``groups_S`` names each episode's task);
    * ``batch``: ``b_s`` = the mean reward of every other episode of the step.

    A task with one episode (group) or a step of one episode (batch) has no baseline:
    a one-line error naming it and the fix.
    """
    rewards = np.asarray(rewards_S, dtype=np.float64)
    if baseline in (None, "group"):
        members: dict[str, list[int]] = defaultdict(list)
        for s, group in enumerate(groups_S):
            members[group].append(s)
        baselines = np.empty_like(rewards)
        for group, idx in members.items():
            if len(idx) < 2:
                raise ConfigError(
                    f"loss.reward_baseline 'group' compares an episode with the other episodes "
                    f"of its task, but task {group!r} has 1 episode in this update; set "
                    "rollout.group_size >= 2 or loss.reward_baseline: batch"
                )
            total = rewards[idx].sum()
            baselines[idx] = (total - rewards[idx]) / (len(idx) - 1)
        return rewards - baselines
    if baseline != "batch":
        raise ConfigError(
            f"loss.reward_baseline={baseline!r} is not one of {', '.join(BASELINES)}; fix the "
            "recipe"
        )
    if len(rewards) < 2:
        raise ConfigError(
            "loss.reward_baseline 'batch' compares an episode with the other episodes of its "
            "update, but this update has 1; raise train.rollouts_per_cycle"
        )
    return rewards - (rewards.sum() - rewards) / (len(rewards) - 1)


def sampling_logprobs_for(traj: Trajectory, positions_P: np.ndarray) -> np.ndarray:
    """``float32[P]``: ``traj``'s recorded sampling-time log-probs at ``positions_P``; a
    one-line error when it recorded none."""
    values = traj.sampling_logprobs_at(positions_P)
    if values is None:
        raise ConfigError(
            f"loss.importance_ratio_cap divides by the log-prob each token was sampled with, "
            f"but trajectory {traj.id!r} (source {traj.source}) recorded none: only episodes "
            "the rollout runner samples at rollout.temperature > 0 carry them; train on "
            "fresh rollouts or remove importance_ratio_cap"
        )
    return values


def step_inputs(
    trajs: list[Trajectory], positions: list[np.ndarray], settings: LossSettings
) -> list[dict[str, np.ndarray]]:
    """Per trajectory, the fields the recipe's variants read at its ``positions``
    (``{}`` each when the recipe uses none)."""
    out: list[dict[str, np.ndarray]] = [{} for _ in trajs]
    counts = [len(p) for p in positions]
    if settings.importance_ratio_cap is not None:
        for fields, traj, pos in zip(out, trajs, positions, strict=True):
            fields["sampling_logprobs_P"] = sampling_logprobs_for(traj, pos)
    if settings.aggregation not in (None, "token"):
        weights = aggregation_weights(counts, settings.aggregation)
        for fields, weight, n in zip(out, weights, counts, strict=True):
            fields["weight_P"] = np.full(n, weight, dtype=np.float64)
    if settings.use_task_rewards:
        advantages = task_advantages([t.verifier.score for t in trajs],
                                     [t.task_id for t in trajs], settings.reward_baseline)
        for fields, advantage, n in zip(out, advantages, counts, strict=True):
            fields["advantage_P"] = np.full(n, advantage, dtype=np.float64)
    return out


def with_step_inputs(
    targets: TeacherTargets, inputs: list[dict[str, np.ndarray]], device
) -> TeacherTargets:
    """``targets`` (one micro-batch's) with its trajectories' ``inputs`` concatenated in
    the same order as its positions."""
    names = {name for fields in inputs for name in fields}
    if not names:
        return targets
    joined = {
        name: torch.from_numpy(np.concatenate([fields[name] for fields in inputs])).to(device)
        for name in names
    }
    return replace(targets, **joined)
