"""The per-position functions of the sampled-token variants: the reverse-KL estimator
with a truncated importance ratio and a clamp on its log-ratio, and the policy-gradient
term a task reward trains through. Pure tensor maps, shapes in their suffixes, like
``per_position.py`` (whose temperature rule they share: ``loss.temperature`` divides
the student logits).

With no ratio and no clamp the estimator is ``per_position.sampled_token_reverse_kl_P``
exactly, in value and gradient (``tests/student/train/test_sampled_token_variants.py``).

This module does not gather its inputs (the sampling log-probs come with each
trajectory and the advantages from the episodes' rewards: ``step_inputs.py``), compose
an objective (``variants.py``), chunk or normalise (``objective.py``).
"""

from __future__ import annotations

import math

import torch

from miniverl.common.errors import ConfigError
from miniverl.student.train.objectives.per_position import cross_entropy_P


def token_logprob_P(
    student_logits_P_V: torch.Tensor, sampled_ids_P: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """``log S(y)`` ``[P]``: the student's log-prob (at ``temperature``, normalised over
    the whole vocabulary) of the token ``y`` that follows each position; carries the
    gradient."""
    return -cross_entropy_P(student_logits_P_V, sampled_ids_P, temperature=temperature)


def truncated_ratio_P(
    logp_P: torch.Tensor, sampling_logprobs_P: torch.Tensor, cap: float
) -> torch.Tensor:
    """``min(S(y) / q(y), cap)`` ``[P]``, detached: the truncated importance weight of a
    token sampled from ``q`` (the version that played the episode) and trained under
    ``S`` (the version being updated).

    Computed as ``exp(min(log S - log q, log cap))``, so a token the trained version
    finds far likelier than the sampler did never overflows.
    """
    log_ratio_P = logp_P.detach() - sampling_logprobs_P.to(logp_P.dtype)
    return torch.exp(log_ratio_P.clamp(max=math.log(cap)))


def policy_gradient_P(logp_P: torch.Tensor, advantage_P: torch.Tensor) -> torch.Tensor:
    """``-A · log S(y)`` ``[P]`` with ``A`` detached: its gradient ``-A · ∇log S(y)`` is
    the REINFORCE step that raises the log-prob of tokens with a positive advantage."""
    return -advantage_P.detach().to(logp_P.dtype) * logp_P


def sampled_token_reverse_kl_ratio_P(
    student_logits_P_V: torch.Tensor,
    sampled_ids_P: torch.Tensor,
    teacher_target_logprobs_P: torch.Tensor,
    sampling_logprobs_P: torch.Tensor | None = None,
    *,
    importance_ratio_cap: float | None = None,
    log_ratio_clamp: float | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled-token reverse-KL estimator with its two stabilisers: ``(loss_P, estimate_P)``.

    Per position, with ``y`` the sampled token, ``S`` the student being trained and ``q``
    the sampling-time distribution (``sampling_logprobs_P = log q(y)``):

    * ``estimate = log S(y) - log T(y)`` (detached): the single-sample KL figure;
    * ``advantage = clamp(-estimate, -c, c)`` with ``c = log_ratio_clamp`` (no clamp
      when None): one token the teacher finds nearly impossible cannot dominate a step;
    * ``w = min(S(y) / q(y), cap)`` with ``cap = importance_ratio_cap`` (``w = 1`` when
      None), detached;
    * ``loss = -w · advantage · log S(y)``.

    The gradient ``w · (log S(y) - log T(y)) · ∇log S(y)`` is, without the clamp and
    below the cap, an unbiased sample of ``∇KL(S ‖ T)`` for tokens drawn from ``q``, not
    only from ``S``: the weight moves the expectation from the sampler to the version
    being trained (truncated importance sampling; the cap bounds its variance at the
    price of a bias where the ratio exceeds it).
    """
    logp_P = token_logprob_P(student_logits_P_V, sampled_ids_P, temperature=temperature)
    estimate_P = (logp_P - teacher_target_logprobs_P.to(logp_P.dtype)).detach()
    advantage_P = -estimate_P
    if log_ratio_clamp is not None:
        advantage_P = advantage_P.clamp(-log_ratio_clamp, log_ratio_clamp)
    if importance_ratio_cap is not None:
        if sampling_logprobs_P is None:
            raise ConfigError(
                "loss.importance_ratio_cap needs the sampling-time log-probs of the tokens; "
                "build the targets with objectives.step_inputs"
            )
        weight_P = truncated_ratio_P(logp_P, sampling_logprobs_P, importance_ratio_cap)
        advantage_P = weight_P * advantage_P
    return policy_gradient_P(logp_P, advantage_P), estimate_P
