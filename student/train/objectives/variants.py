"""The standard variants as objectives: the recipe's objective from the table, with the
sampled-token estimator's importance ratio and log-ratio clamp, the task-reward term
and the per-sequence aggregation its ``loss`` section asks for (docs/losses.md).

:func:`with_variants` wraps the table's :class:`~.objective.Objective` in one more
objective that reads the extra fields (``step_inputs.py`` fills them) and returns, per
position,

    loss = weight · (coef · distillation + reward)

with ``distillation`` the table objective's term (the ratio-weighted, clamped estimator
for ``estimator: sampled_token``), ``reward = -w · A · log S(y)`` when
``use_task_rewards`` (``w`` the truncated importance ratio when ``importance_ratio_cap``
is set, else 1), ``coef = distillation_loss_coef`` (1 when unset) and ``weight`` the
aggregation weight (1 per token when unset). The reported divergence stays the table
objective's, unweighted. A recipe that sets none of them gets the table's objective
itself.

This module holds no formula (``sampled_token.py``) and builds no inputs
(``step_inputs.py``); the table (``table.py``) calls it.
"""

from __future__ import annotations

from functools import partial

import torch

from miniverl.student.train.objectives.objective import LossSettings, Objective
from miniverl.student.train.objectives.sampled_token import (
    policy_gradient_P,
    sampled_token_reverse_kl_ratio_P,
    token_logprob_P,
    truncated_ratio_P,
)


def uses_variants(settings: LossSettings) -> bool:
    """True when the recipe's ``loss`` section sets any of the standard variants."""
    return (settings.importance_ratio_cap is not None or settings.log_ratio_clamp is not None
            or settings.aggregation not in (None, "token") or bool(settings.use_task_rewards))


def _name(base: Objective, s: LossSettings) -> str:
    parts = [base.name]
    if s.importance_ratio_cap is not None:
        parts.append(f"importance ratio <= {s.importance_ratio_cap:g}")
    if s.log_ratio_clamp is not None:
        parts.append(f"log-ratio clamp {s.log_ratio_clamp:g}")
    if s.use_task_rewards:
        parts.append(f"task reward ({s.reward_baseline or 'group'} baseline)")
    if s.aggregation not in (None, "token"):
        parts.append(f"per-{s.aggregation}")
    return " + ".join(parts)


def _variant(logits_C_V: torch.Tensor, *, settings: LossSettings, base: Objective,
             sampled: bool, **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = settings
    ratio_logq_C = inputs.get("sampling_logprobs_P")
    if sampled:
        loss_C, div_C = sampled_token_reverse_kl_ratio_P(
            logits_C_V, inputs["sampled_ids_P"], inputs["target_logprobs_P"], ratio_logq_C,
            importance_ratio_cap=s.importance_ratio_cap, log_ratio_clamp=s.log_ratio_clamp,
            temperature=s.temperature,
        )
    else:
        loss_C, div_C = base.per_position(logits_C_V, settings=s,
                                          **{name: inputs[name] for name in base.reads})
    if s.use_task_rewards:
        coef = 1.0 if s.distillation_loss_coef is None else s.distillation_loss_coef
        logp_C = token_logprob_P(logits_C_V, inputs["sampled_ids_P"], temperature=s.temperature)
        advantage_C = inputs["advantage_P"].to(logp_C.dtype)
        if s.importance_ratio_cap is not None:
            advantage_C = truncated_ratio_P(logp_C, ratio_logq_C, s.importance_ratio_cap) * advantage_C
        loss_C = coef * loss_C + policy_gradient_P(logp_C, advantage_C)
    if "weight_P" in inputs:
        loss_C = loss_C * inputs["weight_P"].to(loss_C.dtype)
    return loss_C, div_C


def with_variants(base: Objective, settings: LossSettings) -> Objective:
    """``base`` with the variants ``settings`` sets (``base`` itself when it sets none)."""
    if not uses_variants(settings):
        return base
    sampled = settings.estimator == "sampled_token"
    reads = list(base.reads)
    if sampled or settings.use_task_rewards:
        reads += [name for name in ("sampled_ids_P",) if name not in reads]
    if settings.importance_ratio_cap is not None:
        reads.append("sampling_logprobs_P")
    if settings.use_task_rewards:
        reads.append("advantage_P")
    if settings.aggregation not in (None, "token"):
        reads.append("weight_P")
    return Objective(_name(base, settings), tuple(reads),
                     partial(_variant, base=base, sampled=sampled))
