"""What an objective is: an :class:`Objective` names the per-position inputs it reads and
its per-position function, and :meth:`Objective.loss` evaluates it chunk by chunk.

The records an objective reads are here too: :class:`TeacherTargets` (every
per-position input, one tensor per field, the positions in the order the loss sees
them) and :class:`LossSettings` (the recipe's ``loss`` fields the functions read).

:func:`chunked_loss` is the chunking: the LM head runs ``chunk_size`` positions at a
time under activation checkpointing, so ``[P, V]`` logits never exist whole, and the sum
is divided by the positions of the whole optimizer step.

This module holds no formula (``per_position.py``) and picks no objective from the
recipe (``table.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from miniverl.common.errors import ConfigError

# ``per_position(logits_C_V, settings=..., **fields_C) -> (loss_C, divergence_C)``.
PerPosition = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class LossSettings:
    """The recipe's ``loss`` fields the objectives read (:meth:`of` copies them from any
    object that has them, the recipe's ``loss`` section included)."""

    objective: str = "bucketed_topk_tail"
    divergence: str = "forward_kl"
    jsd_beta: float = 0.5
    temperature: float = 1.0
    tail_epsilon: float = 1e-6
    chunk_size: int = 1024
    estimator: str = "full"
    # The standard variants (docs/losses.md); None is the recipe's unset value.
    importance_ratio_cap: float | None = None
    log_ratio_clamp: float | None = None
    aggregation: str | None = None
    use_task_rewards: bool | None = None
    distillation_loss_coef: float | None = None
    reward_baseline: str | None = None
    # A teacher with another tokenizer: sampled_token (None), hybrid or uld.
    cross_vocab: str | None = None

    @classmethod
    def of(cls, config: Any = None) -> LossSettings:
        """The settings ``config`` names (defaults for what it lacks; None: all defaults)."""
        values = {f.name: getattr(config, f.name, f.default) for f in fields(cls)}

        def optional_float(name: str) -> float | None:
            return None if values[name] is None else float(values[name])

        return cls(
            objective=values["objective"], divergence=values["divergence"],
            jsd_beta=float(values["jsd_beta"]), temperature=float(values["temperature"]),
            tail_epsilon=float(values["tail_epsilon"]), chunk_size=int(values["chunk_size"]),
            estimator=values["estimator"],
            importance_ratio_cap=optional_float("importance_ratio_cap"),
            log_ratio_clamp=optional_float("log_ratio_clamp"),
            aggregation=values["aggregation"], use_task_rewards=values["use_task_rewards"],
            distillation_loss_coef=optional_float("distillation_loss_coef"),
            reward_baseline=values["reward_baseline"], cross_vocab=values["cross_vocab"],
        )


# How a missing field is named in an error: its wire name and shape.
WIRE_NAMES = {
    "sampled_ids_P": "the sampled token [P]",
    "target_logprobs_P": "target_logprobs [P]",
    "topk_ids_P_K": "ids [P, K]",
    "topk_logprobs_P_K": "logprobs [P, K]",
    "tail_logmass_P": "tail_logmass [P]",
    "logprobs_P_V": "logprobs [P, V]",
    "sampling_logprobs_P": "the student's sampling-time log-prob of the sampled token [P]",
    "weight_P": "the aggregation weight of each position [P]",
    "advantage_P": "the task-reward advantage of each position's episode [P]",
    "group_first_P": "group_first [P] (xvocab: the position starts a byte group)",
    "group_exact_P": "group_exact [P] (xvocab uld/hybrid: the group is an exact pair)",
}
# The fields that are not the teacher's: the step fills them (``step_inputs.py``).
STEP_FIELDS = ("sampling_logprobs_P", "weight_P", "advantage_P")


@dataclass
class TeacherTargets:
    """The per-position inputs for ``P`` selected positions, as tensors on the student's
    device, in the order the loss sees the positions.

    ``sampled_ids_P`` is the token that actually follows each position (the sampled-token
    estimator and SFT read it). Top-k targets fill ``topk_ids_P_K``,
    ``topk_logprobs_P_K`` and ``tail_logmass_P``; exact ones fill ``logprobs_P_V``;
    both fill ``target_logprobs_P`` (the teacher's log-prob of the sampled token). An
    objective names the fields it reads (:attr:`Objective.reads`); an input that is not
    the teacher's (a log-prob recorded at sampling time, the sequence a position belongs
    to) is one more field here, read the same way.
    """

    sampled_ids_P: torch.Tensor
    target_logprobs_P: torch.Tensor | None = None
    topk_ids_P_K: torch.Tensor | None = None
    topk_logprobs_P_K: torch.Tensor | None = None
    tail_logmass_P: torch.Tensor | None = None
    logprobs_P_V: torch.Tensor | None = None
    # xvocab (student/train/xvocab_targets.py): 1 where a position starts a byte group;
    # target_logprobs_P then holds the teacher's log-prob of the group's bytes.
    group_first_P: torch.Tensor | None = None
    # xvocab with loss.cross_vocab uld/hybrid: 1 where the group is an exact pair; the
    # group's row of topk_ids_P_K / topk_logprobs_P_K sits on its first position
    # (objectives/group_uld.py says what the row holds).
    group_exact_P: torch.Tensor | None = None
    # Not the teacher's: filled per step by ``step_inputs.py`` when a variant reads them.
    sampling_logprobs_P: torch.Tensor | None = None
    weight_P: torch.Tensor | None = None
    advantage_P: torch.Tensor | None = None

    @classmethod
    def from_arrays(
        cls,
        arrays: dict[str, np.ndarray],
        sampled_ids_P: np.ndarray | torch.Tensor,
        *,
        kind: str,
        device: torch.device | str = "cpu",
    ) -> TeacherTargets:
        """Build from a ``SCORE_OK`` / cache entry's arrays (``ids``, ``logprobs``, ...)."""

        def t(name: str) -> torch.Tensor | None:
            value = arrays.get(name)
            return None if value is None else torch.as_tensor(np.asarray(value)).to(device)

        sampled = torch.as_tensor(np.asarray(sampled_ids_P)).long().to(device)
        if kind == "topk":
            return cls(
                sampled_ids_P=sampled,
                target_logprobs_P=t("target_logprobs"),
                topk_ids_P_K=t("ids"),
                topk_logprobs_P_K=t("logprobs"),
                tail_logmass_P=t("tail_logmass"),
            )
        if kind == "exact":
            return cls(sampled, target_logprobs_P=t("target_logprobs"), logprobs_P_V=t("logprobs"))
        if kind == "xvocab":
            return cls(sampled, target_logprobs_P=t("target_logprobs"),
                       group_first_P=t("group_first"), group_exact_P=t("group_exact"),
                       topk_ids_P_K=t("ids"), topk_logprobs_P_K=t("logprobs"),
                       tail_logmass_P=t("tail_logmass"))
        raise ConfigError(f"target kind {kind!r} is not 'topk', 'exact' or 'xvocab'")


@dataclass(frozen=True)
class Objective:
    """One objective: the :class:`TeacherTargets` fields it reads and its per-position
    function (torchtune's ``ForwardKLWithChunkedOutputLoss`` beside its plain form).

    ``per_position(logits_C_V, settings=LossSettings, **{field: tensor_C})`` returns
    ``(loss_C, divergence_C)``: the term to minimise and the figure reported as the
    divergence (the same tensor for an exact divergence; the detached KL estimate for
    the sampled-token estimator). Every field in ``reads`` is passed under its own
    name, sliced to the chunk.
    """

    name: str
    reads: tuple[str, ...]
    per_position: PerPosition

    def inputs(self, targets: TeacherTargets) -> dict[str, torch.Tensor]:
        """The fields this objective reads, checked present; a missing one is a one-line
        error naming it and the target kind that carries it."""
        out = {}
        for name in self.reads:
            value = getattr(targets, name)
            if value is None and name in STEP_FIELDS:
                raise ConfigError(
                    f"loss '{self.name}' needs {WIRE_NAMES[name]}, which these targets lack; "
                    "build them with objectives.step_inputs for the recipe's loss section"
                )
            if value is None:
                raise ConfigError(
                    f"loss '{self.name}' needs teacher {WIRE_NAMES.get(name, name)}, which "
                    f"these targets lack; request kind 'exact' for exact_full_vocab and "
                    f"'topk' for bucketed_topk_tail"
                )
            out[name] = value
        return out

    def loss(
        self,
        hidden_P_H: torch.Tensor,
        lm_head: Callable[[torch.Tensor], torch.Tensor],
        targets: TeacherTargets,
        settings: LossSettings,
        *,
        num_global_positions: int | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective over ``P`` selected positions, chunk by chunk.

        Args:
            hidden_P_H: the student's final hidden states at the selected positions.
            lm_head: maps ``[C, H] -> [C, V]`` logits (``model.lm_head`` or any callable).
            targets: the per-position inputs for the same positions, in the same order.
            settings: the loss settings (``chunk_size`` and what the function reads).
            num_global_positions: selected positions over the whole optimizer step.
        Returns:
            ``(loss, metrics)`` with metrics ``divergence`` (mean over these positions),
            ``divergence_sum`` (to aggregate over micro-batches) and ``positions``.
        """
        inputs = self.inputs(targets)
        per_position = partial(self.per_position, settings=settings)
        loss, div_sum = chunked_loss(hidden_P_H, lm_head, per_position, inputs,
                                     chunk_size=settings.chunk_size,
                                     num_global_positions=num_global_positions)
        num_positions = int(hidden_P_H.shape[0])
        metrics = {
            "divergence": float(div_sum) / max(1, num_positions),
            "divergence_sum": float(div_sum),
            "positions": float(num_positions),
        }
        return loss, metrics


def chunked_loss(
    hidden_P_H: torch.Tensor,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    per_position: PerPosition,
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
