"""DPO from the student's own rollouts, with a teacher server as the reference scorer.

One ``dpo`` cycle, read top to bottom in :meth:`DpoMode.cycle`:

1. **Group sampling**: ``rollouts_per_cycle`` episodes as ``rollouts_per_cycle //
   group_size`` tasks, each played ``group_size`` times with distinct seeds by the
   current policy (``rollout.group_size``, else ``dpo.group_size``: ``state.group_size``).
2. **Pairs** (:func:`build_pairs`): within a task, a verified success is *chosen* and a
   failure *rejected*; ``min(successes, failures)`` pairs per task. A task whose
   rollouts all succeed or all fail yields no pair; it is skipped and counted.
3. **Reference**: each paired trajectory goes out as one ``SCORE`` whose positions are
   its response tokens (every model span); the reply's ``target_logprobs`` (reference
   log-prob of the token actually there) summed over those positions is
   ``log pi_ref(response | context)``. The teacher server serving the reference is
   usually a copy of the initial student.
4. **Update** (:func:`dpo_step`): the policy's summed log-probs over the same tokens,
   the loss ``-logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` averaged over
   pairs, one optimizer step, ``v -> v + 1``.

DPO trains on preference pairs, not on teacher distributions: it is labelled
off-policy preference training (``on_policy: false``) in metrics and manifests, even
though the pairs were sampled by the version that trains on them.

This module does not sample (the state's rollout runner does), does not talk to
sockets (the :class:`~miniverl.student.train.teacher.link.TeacherLink` does) and writes no
files except through the run directory; ``loop.py`` logs what a cycle returns.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import Trajectory, write_trajectories
from miniverl.student.train.objectives.objective import next_tokens
from miniverl.student.train.policy import Policy
from miniverl.student.train.state import CycleResult, TrainState, group_size
from miniverl.student.train.teacher.link import TeacherLink
from miniverl.student.train.updates import (
    StepStats,
    backward,
    finish_step,
    hidden_at_positions,
    micro_batches,
    token_micro_batches,
)


@dataclass
class PreferencePair:
    """A chosen (verified success) and a rejected (failure) rollout of the same task.

    ``ref_chosen`` / ``ref_rejected`` are the reference policy's summed log-probs of each
    response (``nan`` until scored).
    """

    chosen: Trajectory
    rejected: Trajectory
    ref_chosen: float = float("nan")
    ref_rejected: float = float("nan")


@dataclass
class DpoStats:
    loss: float
    chosen_reward: float  # mean beta * (pi - ref) over chosen responses
    rejected_reward: float
    margin: float  # mean chosen_reward - rejected_reward
    accuracy: float  # fraction of pairs with margin > 0
    pairs: int
    positions: int
    tokens: int
    grad_norm: float
    lr: float


def response_positions(traj: Trajectory) -> np.ndarray:
    """int64[P]: positions predicting the response tokens (every model span)."""
    return traj.target_positions()


def build_pairs(trajs: list[Trajectory]) -> tuple[list[PreferencePair], int, int]:
    """``(pairs, tasks_without_pair, tasks)`` from rollouts grouped by task id.

    Successes and failures are paired in sampling order, so the same rollouts always
    give the same pairs. Trajectories without a response token cannot be compared and
    are ignored.
    """
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in trajs:
        by_task[traj.task_id].append(traj)
    pairs: list[PreferencePair] = []
    skipped = 0
    for group in by_task.values():
        usable = [t for t in group if len(response_positions(t))]
        wins = [t for t in usable if t.verifier is not None and t.verifier.success]
        losses = [t for t in usable if t.verifier is None or not t.verifier.success]
        if not wins or not losses:
            skipped += 1
            continue
        pairs.extend(PreferencePair(w, lo) for w, lo in zip(wins, losses, strict=False))
    return pairs, skipped, len(by_task)


def dpo_loss(
    policy_chosen_B: torch.Tensor,
    policy_rejected_B: torch.Tensor,
    ref_chosen_B: torch.Tensor,
    ref_rejected_B: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO loss ``[B]`` and the implicit rewards ``[B]`` (chosen, rejected).

    Inputs are summed response log-probs per pair. ``loss_B = -logsigmoid(beta *
    ((pi_c - ref_c) - (pi_r - ref_r)))``; the rewards ``beta * (pi - ref)`` are detached.
    Identical policy and reference give ``log 2`` per pair.
    """
    chosen_B = policy_chosen_B - ref_chosen_B
    rejected_B = policy_rejected_B - ref_rejected_B
    loss_B = -F.logsigmoid(beta * (chosen_B - rejected_B))
    return loss_B, (beta * chosen_B).detach(), (beta * rejected_B).detach()


def sequence_logprobs(
    policy: Policy,
    trajs: list[Trajectory],
    positions: list[np.ndarray],
    *,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """``logp_B``: the policy's summed log-prob of each trajectory's tokens at ``positions``.

    The LM head runs ``chunk_size`` positions at a time under activation checkpointing,
    so a real vocabulary (49,152 for SmolLM2) never holds ``[P, V]`` logits for the
    whole batch, forward or backward.
    """
    hidden_P_H = hidden_at_positions(policy, trajs, positions)
    target_P = torch.from_numpy(next_tokens(trajs, positions)).to(policy.device)
    lm_head = policy.lm_head

    def chunk_logp(hidden_C_H: torch.Tensor, target_C: torch.Tensor) -> torch.Tensor:
        logp_C_V = torch.log_softmax(lm_head(hidden_C_H).float(), dim=-1)
        return logp_C_V.gather(-1, target_C.unsqueeze(-1)).squeeze(-1)

    parts = []
    for start in range(0, hidden_P_H.shape[0], chunk_size):
        end = min(start + chunk_size, hidden_P_H.shape[0])
        args = (hidden_P_H[start:end], target_P[start:end])
        if torch.is_grad_enabled():
            parts.append(checkpoint(chunk_logp, *args, use_reentrant=False))
        else:
            parts.append(chunk_logp(*args))
    logp_P = torch.cat(parts) if parts else hidden_P_H.new_zeros(0, dtype=torch.float32)
    owner_P = torch.cat(
        [torch.full((len(p),), b, dtype=torch.long) for b, p in enumerate(positions)]
    ).to(logp_P.device)
    return torch.zeros(len(trajs), dtype=logp_P.dtype, device=logp_P.device).index_add(
        0, owner_P, logp_P
    )


def score_reference(link: TeacherLink, pairs: list[PreferencePair], version: int) -> None:
    """Fill ``ref_chosen`` / ``ref_rejected`` from the reference teacher's ``target_logprobs``.

    One ``SCORE`` per response; ``k`` is 1 (the top-k rows are not used, only the
    target log-probs) and the temperature 1, so the reference is the model itself.
    """
    saved = (link.kind, link.k, link.temperature)
    link.kind, link.k, link.temperature = "topk", 1, 1.0
    try:
        link.begin_update(version, 0)
        for pair in pairs:
            for traj in (pair.chosen, pair.rejected):
                link.submit(traj, response_positions(traj))
        scored = link.collect()
    finally:
        link.kind, link.k, link.temperature = saved
    sums = [float(np.sum(s.arrays["target_logprobs"], dtype=np.float64)) for s in scored]
    for i, pair in enumerate(pairs):
        pair.ref_chosen, pair.ref_rejected = sums[2 * i], sums[2 * i + 1]


def pair_micro_batches(pairs: list[PreferencePair], *, grad_accum: int,
                       micro_batch_tokens: int | None) -> list[range]:
    """A DPO step's micro-batches, each of whole pairs (a pair's chosen and rejected
    episodes are always in one forward): by ``train.micro_batch_tokens`` when it is set
    (k pairs are 2k episodes padded to the longest of them, at most the budget; a pair
    over it is a micro-batch alone), else ``train.grad_accum`` parts by count."""
    if micro_batch_tokens is None:
        return micro_batches(len(pairs), grad_accum)
    longest = [max(len(p.chosen.tokens), len(p.rejected.tokens)) for p in pairs]
    # k pairs hold 2k episodes: 2 * k * longest <= budget is k * longest <= budget // 2.
    return token_micro_batches(longest, micro_batch_tokens // 2)


def dpo_step(
    policy: Policy,
    optimizer,
    scheduler,
    pairs: list[PreferencePair],
    *,
    beta: float,
    grad_accum: int = 1,
    micro_batch_tokens: int | None = None,
    max_grad_norm: float = 1.0,
    chunk_size: int = 1024,
) -> DpoStats:
    """One optimizer step on the mean DPO loss over ``pairs``, split in micro-batches of
    whole pairs (:func:`pair_micro_batches`)."""
    if not pairs:
        raise ConfigError("dpo_step needs at least one preference pair; skip the update instead")
    n = len(pairs)
    loss_sum = 0.0
    chosen_r: list[torch.Tensor] = []
    rejected_r: list[torch.Tensor] = []
    for part in pair_micro_batches(pairs, grad_accum=grad_accum,
                                   micro_batch_tokens=micro_batch_tokens):
        batch = [pairs[i] for i in part]
        trajs = [t for p in batch for t in (p.chosen, p.rejected)]
        logp_2B = sequence_logprobs(
            policy, trajs, [response_positions(t) for t in trajs],
            chunk_size=chunk_size,
        )
        ref_2B = torch.tensor(
            [r for p in batch for r in (p.ref_chosen, p.ref_rejected)],
            dtype=logp_2B.dtype, device=logp_2B.device,
        )
        loss_B, reward_c_B, reward_r_B = dpo_loss(
            logp_2B[0::2], logp_2B[1::2], ref_2B[0::2], ref_2B[1::2], beta
        )
        # Divide by the pairs in the whole step, not the micro-batch: a mean of
        # micro-batch means would over-weight a small last micro-batch.
        loss = loss_B.sum() / n
        backward(policy, loss)
        loss_sum += float(loss.detach())
        chosen_r.append(reward_c_B)
        rejected_r.append(reward_r_B)
    grad_norm, lr = finish_step(policy, optimizer, scheduler, max_grad_norm)
    chosen_B, rejected_B = torch.cat(chosen_r), torch.cat(rejected_r)
    all_trajs = [t for p in pairs for t in (p.chosen, p.rejected)]
    return DpoStats(
        loss=loss_sum,
        chosen_reward=float(chosen_B.mean()),
        rejected_reward=float(rejected_B.mean()),
        margin=float((chosen_B - rejected_B).mean()),
        accuracy=float((chosen_B > rejected_B).float().mean()),
        pairs=n,
        positions=int(sum(len(response_positions(t)) for t in all_trajs)),
        tokens=int(sum(len(t.tokens) for t in all_trajs)),
        grad_norm=grad_norm,
        lr=lr,
    )


def dpo_group_size(recipe: Any) -> int:
    """Rollouts per task in one cycle (``rollout.group_size``, else ``dpo.group_size``;
    at least 2 to form a pair, ``batches.group_size``)."""
    size = group_size(recipe)
    if recipe.train.rollouts_per_cycle < size:
        raise ConfigError(
            f"train.rollouts_per_cycle {recipe.train.rollouts_per_cycle} is below dpo group "
            f"size {size}: DPO plays each task {size} times to find a success and a failure; "
            f"raise rollouts_per_cycle to at least {size}"
        )
    return size


def _success(trajs: list[Trajectory]) -> float:
    return sum(bool(t.verifier and t.verifier.success) for t in trajs) / max(1, len(trajs))


class DpoMode:
    """Mode ``dpo``: every cycle samples, pairs and scores its own groups."""

    def prepare(self, state: TrainState) -> None:
        """Nothing to prepare: the reference scores each cycle's pairs."""

    def resume(self, state: TrainState) -> None:
        """Nothing to rebuild: the checkpoint holds everything a cycle reads."""

    def cycle(self, state: TrainState) -> CycleResult | None:
        """One DPO cycle; None when no task gave a pair (no update)."""
        recipe = state.recipe
        grouped, seeds = state.tasks.episodes(state.cycle, recipe.train.rollouts_per_cycle,
                                              dpo_group_size(recipe))
        policy = state.policy
        t0 = time.perf_counter()
        policy.model.eval()
        with torch.no_grad():
            trajs = state.runner.run(grouped, policy_version=state.version, seeds=seeds)
        policy.model.train()
        t_rollout = time.perf_counter() - t0
        write_trajectories(state.run.trajectories_path, trajs, append=True)
        pairs, skipped, n_groups = build_pairs(trajs)
        extra = {
            "dpo_pairs": len(pairs),
            "dpo_tasks": n_groups,
            "dpo_tasks_without_pair": skipped,
            "dpo_beta": recipe.dpo.beta,
        }
        if not pairs:
            # Nothing to prefer: no update, the version stays; the skip is on record.
            state.run.event("dpo_no_pairs", cycle=state.cycle, version=state.version,
                            tasks=n_groups, train_success=_success(trajs))
            return None
        t1 = time.perf_counter()
        link = state.teacher.link
        assert isinstance(link, TeacherLink)  # dpo's reference: one teacher's plain link
        score_reference(link, pairs, state.version)
        t_wait = time.perf_counter() - t1
        t2 = time.perf_counter()
        stats = None
        for _ in range(recipe.train.updates_per_batch):
            stats = dpo_step(
                policy, state.optimizer, state.scheduler, pairs, beta=recipe.dpo.beta,
                grad_accum=recipe.train.grad_accum,
                micro_batch_tokens=recipe.train.micro_batch_tokens,
                max_grad_norm=recipe.train.max_grad_norm, chunk_size=recipe.loss.chunk_size,
            )
            state.advance()
        assert stats is not None  # train.updates_per_batch is at least 1
        extra.update(
            dpo_loss=stats.loss, dpo_chosen_reward=stats.chosen_reward,
            dpo_rejected_reward=stats.rejected_reward, dpo_margin=stats.margin,
            dpo_accuracy=stats.accuracy,
        )
        step = StepStats(loss=stats.loss, divergence=stats.loss, positions=stats.positions,
                         tokens=stats.tokens, grad_norm=stats.grad_norm, lr=stats.lr)
        return CycleResult(step, trajs, t_rollout, t_wait, time.perf_counter() - t2, extra=extra)
