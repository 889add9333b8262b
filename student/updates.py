"""One optimizer step from a batch: SFT cross-entropy or distillation against targets.

Both steps follow the same shape: split the batch into ``grad_accum`` micro-batches, run
the decoder once per micro-batch, gather hidden states at the selected positions, apply
the LM head chunk by chunk inside the loss, normalise by the number of selected
positions over the *whole* step (not per micro-batch), clip, step, schedule.

This module does not sample, talk to the teacher or write files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from miniverl.common.trajectory import Trajectory
from miniverl.student.losses import TeacherTargets, distillation_loss, sft_loss
from miniverl.student.policy import Policy, hidden_at_positions, next_tokens
from miniverl.student.teacher_link import Scored


@dataclass
class StepStats:
    loss: float
    divergence: float
    positions: int
    tokens: int
    grad_norm: float
    lr: float


def _micro_batches(n: int, grad_accum: int) -> list[range]:
    parts = max(1, min(grad_accum, n))
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def _finish_step(policy: Policy, optimizer, scheduler, max_grad_norm: float) -> tuple[float, float]:
    if policy.quantization != "none":
        from miniverl.student.quant import check_trainable_grads

        check_trainable_grads(policy.model)  # never step with adapters silently frozen
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), max_grad_norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm), float(lr)


def sft_step(
    policy: Policy,
    optimizer,
    scheduler,
    trajs: list[Trajectory],
    *,
    grad_accum: int,
    max_grad_norm: float,
    chunk_size: int,
    autocast: Any = None,
) -> StepStats:
    """Cross-entropy on the model's own spans (assistant tokens) only."""
    positions = [t.target_positions() for t in trajs]
    total = int(sum(len(p) for p in positions))
    loss_sum = nll_sum = 0.0
    for part in _micro_batches(len(trajs), grad_accum):
        batch = [trajs[i] for i in part]
        pos = [positions[i] for i in part]
        hidden_P_H = hidden_at_positions(policy, batch, pos, autocast)
        target_P = torch.from_numpy(next_tokens(batch, pos)).to(policy.device)
        loss, metrics = sft_loss(
            hidden_P_H, policy.lm_head, target_P, chunk_size=chunk_size,
            num_global_positions=total,
        )
        loss.backward()
        loss_sum += float(loss.detach())
        nll_sum += metrics["divergence_sum"]
    grad_norm, lr = _finish_step(policy, optimizer, scheduler, max_grad_norm)
    return StepStats(
        loss=loss_sum, divergence=nll_sum / max(1, total), positions=total,
        tokens=sum(len(t.tokens) for t in trajs), grad_norm=grad_norm, lr=lr,
    )


def _concat(arrays: list[dict[str, np.ndarray]], name: str) -> np.ndarray | None:
    parts = [a[name] for a in arrays if name in a and len(a[name])]
    return np.concatenate(parts) if parts else None


def targets_for(scored: list[Scored], kind: str, device) -> TeacherTargets:
    """Concatenate the replies of a micro-batch into one :class:`TeacherTargets`."""
    sampled_P = next_tokens([s.traj for s in scored], [s.positions_P for s in scored])
    arrays = [s.arrays for s in scored]
    merged = {name: _concat(arrays, name) for name in arrays[0]} if arrays else {}
    merged = {k: v for k, v in merged.items() if v is not None}
    return TeacherTargets.from_arrays(merged, sampled_P, kind=kind, device=device)


@dataclass
class EarlyForward:
    """The student's forward over an update's first micro-batch, computed (with autograd)
    while the teacher still scores it. It is used only for exactly these trajectories
    and positions, so the update equals one that waited for every reply first."""

    traj_ids: list[str]
    positions: list[np.ndarray]
    hidden_P_H: torch.Tensor

    def matches(self, trajs: list[Trajectory], positions: list[np.ndarray]) -> bool:
        if self.traj_ids != [t.id for t in trajs] or len(positions) != len(self.positions):
            return False
        return all(np.array_equal(a, b) for a, b in zip(positions, self.positions, strict=True))


def first_micro_batch(n: int, grad_accum: int) -> range:
    """The indices of an update's first micro-batch (what :class:`EarlyForward` covers)."""
    parts = _micro_batches(n, grad_accum)
    return parts[0] if parts else range(0)


def early_forward(
    policy: Policy, trajs: list[Trajectory], positions: list[np.ndarray], autocast: Any = None
) -> EarlyForward:
    """Run the student's forward for a micro-batch before its targets have arrived."""
    pos = [p.astype(np.int64) for p in positions]
    return EarlyForward(
        [t.id for t in trajs], pos, hidden_at_positions(policy, trajs, pos, autocast)
    )


def distill_step(
    policy: Policy,
    optimizer,
    scheduler,
    scored: list[Scored],
    *,
    loss_config: Any,
    kind: str,
    grad_accum: int,
    max_grad_norm: float,
    autocast: Any = None,
    early: EarlyForward | None = None,
) -> StepStats:
    """Distillation on the scored positions of every trajectory in ``scored``.

    ``early``, when it covers the first micro-batch exactly, is used as its forward.
    """
    total = int(sum(len(s.positions_P) for s in scored))
    loss_sum = div_sum = 0.0
    for part in _micro_batches(len(scored), grad_accum):
        batch = [scored[i] for i in part]
        trajs = [s.traj for s in batch]
        pos = [s.positions_P.astype(np.int64) for s in batch]
        if early is not None and early.matches(trajs, pos):
            hidden_P_H, early = early.hidden_P_H, None
        else:
            hidden_P_H = hidden_at_positions(policy, trajs, pos, autocast)
        targets = targets_for(batch, kind, policy.device)
        loss, metrics = distillation_loss(
            hidden_P_H, policy.lm_head, targets, loss_config, num_global_positions=total
        )
        loss.backward()
        loss_sum += float(loss.detach())
        div_sum += metrics["divergence_sum"]
    grad_norm, lr = _finish_step(policy, optimizer, scheduler, max_grad_norm)
    return StepStats(
        loss=loss_sum, divergence=div_sum / max(1, total), positions=total,
        tokens=sum(len(s.traj.tokens) for s in scored), grad_norm=grad_norm, lr=lr,
    )
