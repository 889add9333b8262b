"""One optimizer step from a batch: distillation against targets, or SFT cross-entropy.

:func:`distill_step` is the one step every mode takes (:func:`sft_step` is it with the
SFT objective): split the batch into ``grad_accum`` micro-batches, run
the decoder once per micro-batch (:func:`hidden_at_positions`), keep the hidden states at
the selected positions only, evaluate the objective on them (``objectives/``: chunk by
chunk, so ``[P, V]`` logits never exist whole, normalised by the number of selected
positions over the *whole* step, not per micro-batch, so gradient accumulation gives the
same update as one big batch), clip, step, schedule. The pipelined update's first
forward (:class:`EarlyForward`) is one of these micro-batches, run before its targets
arrive.

This module does not load the policy (``policy.py``), hold or pick an objective
(``objectives/``), sample, talk to the teacher or write files.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch

from miniverl.common.recipe import Recipe
from miniverl.common.recipe_sections import LossConfig, TrainConfig
from miniverl.common.shared_prefix import decoder_hidden
from miniverl.common.trajectory import Trajectory
from miniverl.student.quant import check_trainable_grads
from miniverl.student.train.objectives.objective import CrossEntropy, StepObjective
from miniverl.student.train.optim import planned_cycles, total_optimizer_steps
from miniverl.student.train.policy import Policy
from miniverl.student.train.teacher.link import Scored


@dataclass
class StepStats:
    loss: float
    divergence: float
    positions: int
    tokens: int
    grad_norm: float
    lr: float


def lr_factor(step: int, *, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class Schedule:
    """The learning rate of each optimizer step, planned once from ``recipe.train``: a
    linear warmup (``warmup_steps``) followed by a constant, linear or cosine decay.

    One schedule over the whole run, or, when ``train.sft_warmup_lr`` is set, one per
    phase: the SFT warm-up at its own peak, then distillation at ``train.lr``, each with
    ``warmup_steps`` of linear ramp and the schedule over its own length. A converged
    SFT model takes a distillation step at the warm-up's rate as a shock (see
    docs/toy-learning.md); the second ramp starts distillation gently. ``warmup_end`` is
    the step the SFT warm-up actually ended at (``train.sft_warmup_until_loss`` can end
    it before ``sft_warmup_steps``); a decaying schedule is planned over the maximum.
    """

    lr: float
    warmup_steps: int
    schedule: str
    total: int  # optimizer steps of the whole run
    sft_lr: float | None  # train.sft_warmup_lr
    sft_steps: int  # train.sft_warmup_steps
    distill_total: int  # optimizer steps after the warm-up

    @classmethod
    def of(cls, recipe: Recipe) -> Schedule:
        train = recipe.train
        return cls(train.lr, train.warmup_steps, train.schedule, total_optimizer_steps(recipe),
                   train.sft_warmup_lr, train.sft_warmup_steps,
                   planned_cycles(recipe) * train.updates_per_batch)

    def lr_at(self, step: int, warmup_end: int | None = None) -> float:
        """The learning rate of optimizer step ``step`` (0-based)."""
        peak, start, total = self.lr, 0, self.total  # one schedule over the whole run
        if self.sft_lr is not None:  # the SFT warm-up's own, then distillation's
            split = self.sft_steps if warmup_end is None else warmup_end
            peak, start, total = ((self.sft_lr, 0, self.sft_steps) if step < split
                                  else (self.lr, split, self.distill_total))
        return peak * lr_factor(step - start, warmup=self.warmup_steps, total=total,
                                schedule=self.schedule)


def build_scheduler(recipe: Recipe, optimizer: torch.optim.Optimizer, warmup_end=None):
    """LambdaLR over :meth:`Schedule.lr_at`; ``warmup_end()`` returns the step the warm-up
    ended at once it has (None before)."""
    plan = Schedule.of(recipe)
    peak = recipe.train.lr  # the optimizer's base lr; LambdaLR multiplies it
    end = warmup_end or (lambda: None)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: plan.lr_at(step, end()) / peak)


def pad_batch(trajs: list[Trajectory], pad_id: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids_B_T`` and ``attention_mask_B_T``."""
    width = max(len(t.tokens) for t in trajs)
    ids_B_T = torch.full((len(trajs), width), pad_id, dtype=torch.long)  # host: moved below
    mask_B_T = torch.zeros((len(trajs), width), dtype=torch.long)  # host: moved below
    for b, traj in enumerate(trajs):
        ids_B_T[b, : len(traj.tokens)] = torch.tensor(traj.tokens, dtype=torch.long)  # host:
        mask_B_T[b, : len(traj.tokens)] = 1
    return ids_B_T.to(device), mask_B_T.to(device)


def hidden_at_positions(policy: Policy, trajs: list[Trajectory],
                        positions: list[np.ndarray]) -> torch.Tensor:
    """``hidden_P_H``: the decoder's final (normed) hidden states at the selected positions,
    computed under the policy's autocast.

    Rows are ordered trajectory by trajectory, positions in the given order, which is the
    order of the teacher's reply rows for the same request.
    """
    ids_B_T, mask_B_T = pad_batch(trajs, policy.pad_id, policy.device)
    # The system block every row shares is computed once (common/shared_prefix.py).
    with policy.autocast or contextlib.nullcontext():
        hidden_B_T_H = decoder_hidden(policy.decoder, ids_B_T, mask_B_T,
                                      [len(t.tokens) for t in trajs])
    rows_B = torch.cat([torch.full((len(p),), b, dtype=torch.long)
                        for b, p in enumerate(positions)]).to(policy.device)
    cols_P = torch.from_numpy(np.concatenate(positions).astype(np.int64)).to(policy.device)
    return hidden_B_T_H[rows_B, cols_P]


def micro_batches(n: int, grad_accum: int) -> list[range]:
    """``grad_accum`` (at most ``n``) contiguous index ranges of near-equal size."""
    parts = max(1, min(grad_accum, n))
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def token_micro_batches(lengths: list[int], budget: int) -> list[range]:
    """Contiguous index ranges, in order, each of as many whole trajectories as fit
    ``budget`` padded tokens (count x the longest of them); a trajectory longer than the
    budget is a micro-batch alone (``train.micro_batch_tokens``)."""
    parts: list[range] = []
    start, longest = 0, 0
    for i, n in enumerate(lengths):
        wider = max(longest, n)
        if i > start and wider * (i - start + 1) > budget:
            parts.append(range(start, i))
            start, wider = i, n
        longest = wider
    if lengths:
        parts.append(range(start, len(lengths)))
    return parts


def step_micro_batches(lengths: list[int], train: TrainConfig) -> list[range]:
    """An update's micro-batches: by ``train.micro_batch_tokens`` when it is set, else
    ``train.grad_accum`` parts by count (:func:`micro_batches`)."""
    if train.micro_batch_tokens is None:
        return micro_batches(len(lengths), train.grad_accum)
    return token_micro_batches(lengths, train.micro_batch_tokens)


def backward(policy: Policy, loss: torch.Tensor) -> None:
    """``loss.backward()``, scaled first for a float16 student (``Policy.grad_scaler``)."""
    scaler = policy.grad_scaler
    (loss if scaler is None else scaler.scale(loss)).backward()


def finish_step(policy: Policy, optimizer, scheduler, max_grad_norm: float) -> tuple[float, float]:
    """Clip, step the optimizer and the schedule, clear gradients; ``(grad_norm, lr)``.

    A float16 student's gradients are unscaled before clipping, and a step whose
    gradients hold an inf or NaN is skipped (the scale halves; the weights stay finite);
    its grad_norm is then reported as it was, not finite."""
    if policy.quantization != "none":
        check_trainable_grads(policy.model)  # never step with adapters silently frozen
    # The optimizer holds exactly the trainable parameters, in the order it was built with.
    params = [p for group in optimizer.param_groups for p in group["params"]]
    scaler = policy.grad_scaler
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    lr = optimizer.param_groups[0]["lr"]
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)  # skipped when a gradient is not finite
        scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm), float(lr)


@dataclass
class EarlyForward:
    """The student's forward over an update's first micro-batch, computed (with autograd)
    while the teacher still scores it, at the positions the episodes were sent with. The
    cycle makes it only when its link gives every episode back with exactly those
    positions (``Link.keeps_positions``), so the update equals one that waited for
    every reply first."""

    trajs: list[Trajectory]
    hidden_P_H: torch.Tensor

    def covers(self, batch: list[Scored]) -> bool:
        """``batch`` holds exactly these episodes (a routed run's update may hold a
        route's episodes back, which moves the micro-batches)."""
        return len(batch) == len(self.trajs) and all(
            s.traj is traj for s, traj in zip(batch, self.trajs, strict=True))


def first_micro_batch(lengths: list[int], train: TrainConfig) -> range:
    """The indices of an update's first micro-batch (what :class:`EarlyForward` covers),
    for trajectories of ``lengths`` tokens."""
    parts = step_micro_batches(lengths, train)
    return parts[0] if parts else range(0)


def early_forward(
    policy: Policy, trajs: list[Trajectory], positions: list[np.ndarray]
) -> EarlyForward:
    """Run the student's forward for a micro-batch before its targets have arrived."""
    return EarlyForward(trajs, hidden_at_positions(policy, trajs, positions))


def distill_step(policy: Policy, optimizer, scheduler, scored: list[Scored], *,
                 objective: StepObjective, train: TrainConfig,
                 early: EarlyForward | None = None) -> StepStats:
    """One optimizer step: ``objective`` on the scored positions of every trajectory in
    ``scored``, over ``train.grad_accum`` micro-batches, then clip (``train.max_grad_norm``)
    and step.

    Each micro-batch's loss is divided by the positions of the whole step, so the
    accumulated gradient is that of one big batch. ``early``, when it covers the first
    micro-batch exactly, is used as its forward.
    """
    total = int(sum(len(s.positions_P) for s in scored))
    # Weights and baselines read the whole step, not one micro-batch (variants only).
    extra = objective.step_inputs([s.traj for s in scored], [s.positions_P for s in scored])
    loss_sum = div_sum = 0.0
    for part in step_micro_batches([len(s.traj.tokens) for s in scored], train):
        batch = [scored[i] for i in part]
        if early is not None and early.covers(batch):
            hidden_P_H, early = early.hidden_P_H, None
        else:
            hidden_P_H = hidden_at_positions(policy, [s.traj for s in batch],
                                             [s.positions_P for s in batch])
        loss, metrics = objective.batch_loss(
            hidden_P_H, policy.lm_head, batch, None if extra is None else [extra[i] for i in part],
            num_global_positions=total)
        backward(policy, loss)
        loss_sum += float(loss.detach())
        div_sum += metrics["divergence_sum"]
    grad_norm, lr = finish_step(policy, optimizer, scheduler, train.max_grad_norm)
    return StepStats(loss=loss_sum, divergence=div_sum / max(1, total), positions=total,
                     tokens=sum(len(s.traj.tokens) for s in scored), grad_norm=grad_norm, lr=lr)


def sft_step(
    policy: Policy,
    optimizer,
    scheduler,
    trajs: list[Trajectory],
    *,
    loss: LossConfig,
    train: TrainConfig,
) -> StepStats:
    """Cross-entropy on the model's own spans (assistant tokens) only: :func:`distill_step`
    with the :class:`~.objectives.CrossEntropy` objective (of the recipe's ``loss``
    section it reads ``chunk_size``), whose target is the next token."""
    data = [Scored(t, t.target_positions(), {}, t.policy_version, {}) for t in trajs]
    return distill_step(policy, optimizer, scheduler, data, objective=CrossEntropy(loss),
                        train=train)
