"""One optimizer step from a batch: SFT cross-entropy or distillation against targets.

Both steps follow the same shape: split the batch into ``grad_accum`` micro-batches, run
the decoder once per micro-batch (:func:`hidden_at_positions`), keep the hidden states at
the selected positions only, apply the LM head chunk by chunk (:func:`chunked_loss`:
``chunk_size`` positions at a time under activation checkpointing, so ``[P, V]`` logits
never exist whole), normalise by the number of selected positions over the *whole* step
(not per micro-batch, so gradient accumulation gives the same update as one big batch),
clip, step, schedule. :func:`distillation_loss` picks the per-position loss the recipe's
``loss`` section names from ``losses.py``.

This module does not load the policy (``policy.py``), hold the loss formulas
(``losses.py``), sample, talk to the teacher or write files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from miniverl.common.errors import ConfigError
from miniverl.common.shared_prefix import decoder_hidden
from miniverl.common.trajectory import Trajectory
from miniverl.student.quant import check_trainable_grads
from miniverl.student.train.link import Scored
from miniverl.student.train.losses import (
    ESTIMATORS,
    OBJECTIVES,
    LossSettings,
    TeacherTargets,
    bucketed_topk_tail_divergence_P,
    cross_entropy_P,
    exact_divergence_P,
    sampled_token_reverse_kl_P,
)
from miniverl.student.train.policy import Policy


@dataclass
class StepStats:
    loss: float
    divergence: float
    positions: int
    tokens: int
    grad_norm: float
    lr: float


def pad_batch(
    trajs: list[Trajectory], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids_B_T`` and ``attention_mask_B_T``."""
    width = max(len(t.tokens) for t in trajs)
    ids_B_T = torch.full((len(trajs), width), pad_id, dtype=torch.long)
    mask_B_T = torch.zeros((len(trajs), width), dtype=torch.long)
    for b, traj in enumerate(trajs):
        ids_B_T[b, : len(traj.tokens)] = torch.tensor(traj.tokens, dtype=torch.long)
        mask_B_T[b, : len(traj.tokens)] = 1
    return ids_B_T.to(device), mask_B_T.to(device)


def hidden_at_positions(
    policy: Policy, trajs: list[Trajectory], positions: list[np.ndarray], autocast: Any = None
) -> torch.Tensor:
    """``hidden_P_H``: the decoder's final (normed) hidden states at the selected positions.

    Rows are ordered trajectory by trajectory, positions in the given order, which is the
    order of the teacher's reply rows for the same request.
    """
    pad_id = policy.tokenizer.pad_token_id
    pad_id = int(pad_id if pad_id is not None else policy.tokenizer.eos_token_id)
    ids_B_T, mask_B_T = pad_batch(trajs, pad_id, policy.device)
    ctx = autocast if autocast is not None else torch.autocast("cpu", enabled=False)
    with ctx:
        # The system block every row shares is computed once (common/shared_prefix.py).
        hidden_B_T_H = decoder_hidden(
            policy.decoder, ids_B_T, mask_B_T, [len(t.tokens) for t in trajs]
        )
    rows_B = torch.cat(
        [torch.full((len(p),), b, dtype=torch.long) for b, p in enumerate(positions)]
    ).to(policy.device)
    cols_P = torch.from_numpy(np.concatenate(positions).astype(np.int64)).to(policy.device)
    return hidden_B_T_H[rows_B, cols_P]


def next_tokens(trajs: list[Trajectory], positions: list[np.ndarray]) -> np.ndarray:
    """The token each selected position predicts (``tokens[p + 1]``), concatenated."""
    return np.concatenate(
        [np.asarray(t.tokens, dtype=np.int64)[p + 1] for t, p in zip(trajs, positions, strict=True)]
    )


def micro_batches(n: int, grad_accum: int) -> list[range]:
    """``grad_accum`` (at most ``n``) contiguous index ranges of near-equal size."""
    parts = max(1, min(grad_accum, n))
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def finish_step(policy: Policy, optimizer, scheduler, max_grad_norm: float) -> tuple[float, float]:
    """Clip, step the optimizer and the schedule, clear gradients; ``(grad_norm, lr)``."""
    if policy.quantization != "none":
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

    def micro_loss(part: range) -> tuple[torch.Tensor, dict[str, float]]:
        batch = [trajs[i] for i in part]
        pos = [positions[i] for i in part]
        hidden_P_H = hidden_at_positions(policy, batch, pos, autocast)
        target_P = torch.from_numpy(next_tokens(batch, pos)).to(policy.device)
        return sft_loss(hidden_P_H, policy.lm_head, target_P, chunk_size=chunk_size,
                        num_global_positions=total)

    return _step(policy, optimizer, scheduler, micro_batches(len(trajs), grad_accum),
                 micro_loss, max_grad_norm=max_grad_norm, total=total,
                 tokens=sum(len(t.tokens) for t in trajs))


def _step(policy: Policy, optimizer, scheduler, parts: list[range],
          micro_loss: Callable[[range], tuple[torch.Tensor, dict[str, float]]], *,
          max_grad_norm: float, total: int, tokens: int) -> StepStats:
    """Backward each micro-batch's loss (already divided by ``total``), then one step."""
    loss_sum = div_sum = 0.0
    for part in parts:
        loss, metrics = micro_loss(part)
        loss.backward()
        loss_sum += float(loss.detach())
        div_sum += metrics["divergence_sum"]
    grad_norm, lr = finish_step(policy, optimizer, scheduler, max_grad_norm)
    return StepStats(loss=loss_sum, divergence=div_sum / max(1, total), positions=total,
                     tokens=tokens, grad_norm=grad_norm, lr=lr)


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
    parts = micro_batches(n, grad_accum)
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
    pending = early

    def micro_loss(part: range) -> tuple[torch.Tensor, dict[str, float]]:
        nonlocal pending
        batch = [scored[i] for i in part]
        trajs = [s.traj for s in batch]
        pos = [s.positions_P.astype(np.int64) for s in batch]
        if pending is not None and pending.matches(trajs, pos):
            hidden_P_H, pending = pending.hidden_P_H, None
        else:
            hidden_P_H = hidden_at_positions(policy, trajs, pos, autocast)
        targets = targets_for(batch, kind, policy.device)
        return distillation_loss(hidden_P_H, policy.lm_head, targets, loss_config,
                                 num_global_positions=total)

    return _step(policy, optimizer, scheduler, micro_batches(len(scored), grad_accum),
                 micro_loss, max_grad_norm=max_grad_norm, total=total,
                 tokens=sum(len(s.traj.tokens) for s in scored))


# -- the objective, chunk by chunk ---------------------------------------------------------


PerChunkFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def chunked_loss(
    hidden_P_H: torch.Tensor,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    per_position: PerChunkFn,
    inputs: dict[str, torch.Tensor],
    *,
    chunk_size: int = 1024,
    num_global_positions: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum a per-position loss chunk by chunk; ``(loss, divergence_sum)``.

    ``per_position(logits_C_V, **inputs_chunk) -> (loss_C, divergence_C)`` is called
    on ``chunk_size`` positions at a time; each chunk runs under
    ``torch.utils.checkpoint`` so neither the forward nor the backward ever holds
    more than one chunk's ``[C, V]`` logits. ``loss`` is the summed loss divided by
    ``num_global_positions`` (default ``P``): with micro-batches pass the count over
    the whole optimizer step, or the mean becomes a mean of means and small
    micro-batches get over-weighted. ``divergence_sum`` is detached.
    """
    if chunk_size < 1:
        raise ConfigError(f"loss.chunk_size={chunk_size} must be >= 1; fix the recipe")
    num_positions = hidden_P_H.shape[0]
    denom = max(1, num_positions if num_global_positions is None else num_global_positions)
    if num_positions == 0:
        # Still run the head on the empty batch so every parameter gets a (zero) gradient
        # and backward() works in a step where a micro-batch selected nothing.
        zero = lm_head(hidden_P_H).sum() * 0.0
        return zero, zero.detach()
    names = list(inputs)

    def run_chunk(hidden_C_H, *chunk_inputs):
        logits_C_V = lm_head(hidden_C_H)
        loss_C, div_C = per_position(logits_C_V, **dict(zip(names, chunk_inputs, strict=True)))
        return loss_C.sum(), div_C.detach().sum()

    # Accumulate in at least fp32 (bf16 sums over thousands of positions drift), and in
    # fp64 when the caller computes in fp64.
    acc_dtype = torch.promote_types(hidden_P_H.dtype, torch.float32)
    loss_sum = hidden_P_H.new_zeros((), dtype=acc_dtype)
    div_sum = hidden_P_H.new_zeros((), dtype=acc_dtype)
    for start in range(0, num_positions, chunk_size):
        end = min(start + chunk_size, num_positions)
        chunk_inputs = [inputs[name][start:end] for name in names]
        if torch.is_grad_enabled():
            loss_c, div_c = checkpoint(
                run_chunk, hidden_P_H[start:end], *chunk_inputs, use_reentrant=False
            )
        else:
            loss_c, div_c = run_chunk(hidden_P_H[start:end], *chunk_inputs)
        loss_sum = loss_sum + loss_c.to(acc_dtype)
        div_sum = div_sum + div_c.to(acc_dtype)
    return loss_sum / denom, div_sum


def _setting(config: Any, name: str) -> Any:
    return getattr(config, name, getattr(LossSettings, name))


def distillation_loss(
    hidden_P_H: torch.Tensor,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    targets: TeacherTargets,
    config: Any = None,
    *,
    num_global_positions: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation loss the recipe asks for, over ``P`` selected positions.

    Args:
        hidden_P_H: the student's final hidden states at the selected positions.
        lm_head: maps ``[C, H] -> [C, V]`` logits (``model.lm_head`` or any callable).
        targets: teacher targets for the same positions, in the same order.
        config: the recipe's ``loss`` section (or :class:`LossSettings`): reads
            ``objective``, ``divergence``, ``jsd_beta``, ``temperature``,
            ``tail_epsilon``, ``chunk_size``, ``estimator``.
        num_global_positions: selected positions over the whole optimizer step.
    Returns:
        ``(loss, metrics)`` with metrics ``divergence`` (mean over these positions),
        ``divergence_sum`` (to aggregate over micro-batches) and ``positions``.
    """
    config = config if config is not None else LossSettings()
    objective = _setting(config, "objective")
    divergence = _setting(config, "divergence")
    jsd_beta = float(_setting(config, "jsd_beta"))
    temperature = float(_setting(config, "temperature"))
    tail_epsilon = float(_setting(config, "tail_epsilon"))
    estimator = _setting(config, "estimator")

    if estimator == "sampled_token":
        if divergence != "reverse_kl":
            raise ConfigError(
                f"loss.estimator='sampled_token' estimates the reverse KL, but loss.divergence="
                f"{divergence!r}; set divergence: reverse_kl or estimator: full"
            )
        _need(targets.target_logprobs_P, "target_logprobs", "sampled_token")

        def per_position(logits, sampled, target):
            return sampled_token_reverse_kl_P(logits, sampled, target, temperature=temperature)

        inputs = {"sampled": targets.sampled_ids_P, "target": targets.target_logprobs_P}
    elif estimator != "full":
        raise ConfigError(
            f"loss.estimator={estimator!r} is not one of {', '.join(ESTIMATORS)}; fix the recipe"
        )
    elif objective == "exact_full_vocab":
        _need(targets.logprobs_P_V, "logprobs [P, V]", objective)

        def per_position(logits, teacher):
            div = exact_divergence_P(
                logits, teacher, divergence=divergence, jsd_beta=jsd_beta, temperature=temperature
            )
            return div, div

        inputs = {"teacher": targets.logprobs_P_V}
    elif objective == "bucketed_topk_tail":
        _need(targets.topk_ids_P_K, "ids [P, K]", objective)
        _need(targets.topk_logprobs_P_K, "logprobs [P, K]", objective)
        _need(targets.tail_logmass_P, "tail_logmass [P]", objective)

        def per_position(logits, ids, logprobs, tail):
            div = bucketed_topk_tail_divergence_P(
                logits,
                ids,
                logprobs,
                tail,
                divergence=divergence,
                jsd_beta=jsd_beta,
                temperature=temperature,
                tail_epsilon=tail_epsilon,
            )
            return div, div

        inputs = {
            "ids": targets.topk_ids_P_K,
            "logprobs": targets.topk_logprobs_P_K,
            "tail": targets.tail_logmass_P,
        }
    else:
        raise ConfigError(
            f"loss.objective={objective!r} is not one of {', '.join(OBJECTIVES)}; fix the recipe"
        )

    return _loss_and_metrics(hidden_P_H, lm_head, per_position, inputs,
                             int(_setting(config, "chunk_size")), num_global_positions)


def sft_loss(
    hidden_P_H: torch.Tensor,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    target_ids_P: torch.Tensor,
    *,
    chunk_size: int = 1024,
    num_global_positions: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Chunked SFT cross-entropy; ``(loss, metrics)`` with the mean NLL as ``divergence``."""

    def per_position(logits, target):
        nll = cross_entropy_P(logits, target)
        return nll, nll

    return _loss_and_metrics(hidden_P_H, lm_head, per_position, {"target": target_ids_P},
                             chunk_size, num_global_positions)


def _loss_and_metrics(hidden_P_H, lm_head, per_position, inputs, chunk_size: int,
                      num_global_positions: int | None) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`chunked_loss` plus the metrics every loss reports: the mean divergence over
    these positions, its sum (to aggregate over micro-batches) and the position count."""
    loss, div_sum = chunked_loss(hidden_P_H, lm_head, per_position, inputs,
                                 chunk_size=chunk_size, num_global_positions=num_global_positions)
    num_positions = int(hidden_P_H.shape[0])
    metrics = {
        "divergence": float(div_sum) / max(1, num_positions),
        "divergence_sum": float(div_sum),
        "positions": float(num_positions),
    }
    return loss, metrics


def _need(value: torch.Tensor | None, what: str, objective: str) -> None:
    if value is None:
        raise ConfigError(
            f"loss '{objective}' needs teacher {what}, which these targets lack; request "
            f"kind 'exact' for exact_full_vocab and 'topk' for bucketed_topk_tail"
        )
