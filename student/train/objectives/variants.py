"""The standard variants as an objective: the recipe's objective from the table, with the
sampled-token estimator's importance ratio and log-ratio clamp, the task-reward term
and the per-sequence aggregation its ``loss`` section asks for (docs/losses.md), and
the per-step inputs they read that are not the teacher's.

:func:`with_variants` wraps the table's :class:`~.objective.Objective` in a
:class:`WithVariants` that returns, per position,

    loss = weight · (coef · distillation + reward)

with ``distillation`` the table objective's term (the ratio-weighted, clamped estimator
for ``estimator: sampled_token``), ``reward = -w · A · log S(y)`` when
``use_task_rewards`` (``w`` the truncated importance ratio when ``importance_ratio_cap``
is set, else 1), ``coef = distillation_loss_coef`` (1 when unset) and ``weight`` the
aggregation weight (1 per token when unset). The reported divergence stays the table
objective's, unweighted. A recipe that sets none of them gets the table's objective
itself.

The inputs (:func:`step_inputs`, built once per optimizer step from the step's
trajectories): the sampling-time log-probs the importance ratio divides by, the
aggregation weights of ``loss.aggregation: sequence`` and the advantages of
``loss.use_task_rewards``. Each is a :class:`~.objective.TeacherTargets` field
(``sampling_logprobs_P``, ``weight_P``, ``advantage_P``);
``TeacherTargets.with_inputs`` adds a micro-batch's share to its targets. A weight or a baseline reads the whole step,
never one micro-batch, so gradient accumulation still gives the update of one big batch.

This module holds no formula (``formulas.py``), does not select positions
(``common/trajectory.py``) or micro-batch (``student/train/updates.py``); the table
(``table.py``) calls :func:`with_variants`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import LossConfig
from miniverl.common.trajectory import Trajectory
from miniverl.student.train.objectives.formulas import (
    policy_gradient_P,
    sampled_token_reverse_kl_ratio_P,
    token_logprob_P,
    truncated_ratio_P,
)
from miniverl.student.train.objectives.objective import (
    Objective,
    given_logits,
)

AGGREGATIONS = ("token", "sequence")
BASELINES = ("group", "batch")


def uses_variants(settings: LossConfig) -> bool:
    """True when the recipe's ``loss`` section sets any of the standard variants."""
    return (settings.importance_ratio_cap is not None or settings.log_ratio_clamp is not None
            or settings.aggregation not in (None, "token") or bool(settings.use_task_rewards))


@dataclass(frozen=True)
class WithVariants(Objective):
    """The table objective ``base`` with the variants ``settings`` sets."""

    base: Objective
    settings: LossConfig

    @property
    def kind(self) -> str:
        return self.base.kind

    @property
    def name(self) -> str:
        s = self.settings
        parts = [self.base.name]
        if s.importance_ratio_cap is not None:
            parts.append(f"importance ratio <= {s.importance_ratio_cap:g}")
        if s.log_ratio_clamp is not None:
            parts.append(f"log-ratio clamp {s.log_ratio_clamp:g}")
        if s.use_task_rewards:
            parts.append(f"task reward ({s.reward_baseline or 'group'} baseline)")
        if s.aggregation not in (None, "token"):
            parts.append(f"per-{s.aggregation}")
        return " + ".join(parts)

    @property
    def reads(self) -> tuple[str, ...]:
        s = self.settings
        reads = list(self.base.reads)
        if (s.estimator == "sampled_token" or s.use_task_rewards) and "sampled_ids_P" not in reads:
            reads.append("sampled_ids_P")
        if s.importance_ratio_cap is not None:
            reads.append("sampling_logprobs_P")
        if s.use_task_rewards:
            reads.append("advantage_P")
        if s.aggregation not in (None, "token"):
            reads.append("weight_P")
        return tuple(reads)

    def step_inputs(self, trajs, positions):
        return step_inputs(trajs, positions, self.settings)

    def per_position(self, hidden_C_H, lm_head, t):
        s = self.settings
        logits_C_V = lm_head(hidden_C_H)
        if s.estimator == "sampled_token":
            loss_C, div_C = sampled_token_reverse_kl_ratio_P(
                logits_C_V, t.sampled_ids_P, t.target_logprobs_P, t.sampling_logprobs_P,
                importance_ratio_cap=s.importance_ratio_cap, log_ratio_clamp=s.log_ratio_clamp,
                temperature=s.temperature,
            )
        else:
            loss_C, div_C = self.base.per_position(logits_C_V, given_logits, t)
        if s.use_task_rewards:
            coef = 1.0 if s.distillation_loss_coef is None else s.distillation_loss_coef
            logp_C = token_logprob_P(logits_C_V, t.sampled_ids_P, temperature=s.temperature)
            advantage_C = t.advantage_P.to(logp_C.dtype)
            if s.importance_ratio_cap is not None:
                advantage_C = (truncated_ratio_P(logp_C, t.sampling_logprobs_P,
                                                 s.importance_ratio_cap) * advantage_C)
            loss_C = coef * loss_C + policy_gradient_P(logp_C, advantage_C)
        if t.weight_P is not None:
            loss_C = loss_C * t.weight_P.to(loss_C.dtype)
        return loss_C, div_C


@dataclass(frozen=True)
class TaskReward(Objective):
    """RL on the task reward alone (``run.mode: rl``): ``-A · log S(y)`` at every trained
    position, ``A`` the episode's verifier score minus the recipe's baseline
    (``loss.reward_baseline``: the other episodes of its task, or of the update), so its
    gradient is REINFORCE with a leave-one-out baseline. No teacher: the reported figure
    is ``-log S(y)``, the sampled tokens' surprise (a one-sample entropy estimate)."""

    settings: LossConfig
    name: ClassVar[str] = "task reward"
    reads: ClassVar[tuple[str, ...]] = ("sampled_ids_P", "advantage_P")
    kind: ClassVar[str] = "none"

    def step_inputs(self, trajs, positions):
        advantages = task_advantages([t.verifier.score for t in trajs],
                                     [t.task_id for t in trajs], self.settings.reward_baseline)
        return [{"advantage_P": np.full(len(p), a, dtype=np.float64)}
                for p, a in zip(positions, advantages, strict=True)]

    def per_position(self, hidden_C_H, lm_head, t):
        logp_C = token_logprob_P(lm_head(hidden_C_H), t.sampled_ids_P,
                                 temperature=self.settings.temperature)
        return policy_gradient_P(logp_C, t.advantage_P), -logp_C.detach()


def with_variants(base: Objective, settings: LossConfig) -> Objective:
    """``base`` with the variants ``settings`` sets (``base`` itself when it sets none)."""
    if not uses_variants(settings):
        return base
    return WithVariants(base, settings)

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
    trajs: list[Trajectory], positions: list[np.ndarray], settings: LossConfig
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
