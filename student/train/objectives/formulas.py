"""The formulas: pure tensor maps from student logits and teacher targets to a ``[P]``
tensor, with shapes in their suffixes. Every objective (``objective.py``) calls one of
them by name.

Two families of divergence, named so a call site cannot confuse them:

* ``exact_*``: the full-vocabulary divergence against teacher log-probs ``[P, V]``.
* ``bucketed_topk_tail_*``: the divergence between two ``K + 1``-bucket
  distributions (the teacher's top-k ids plus one tail bucket for the rest of the
  vocabulary). It is a coarse-graining of the exact one, so it never exceeds it
  (data processing inequality) and equals it when ``K = V``.

Plus the token-level terms: the sampled-token reverse-KL estimator and SFT
cross-entropy, and the sampled-token variants (docs/losses.md): the estimator with a
truncated importance ratio and a clamp on its log-ratio, and the policy-gradient term a
task reward trains through. With no ratio and no clamp the variant estimator is
:func:`sampled_token_reverse_kl_P` exactly, in value and gradient
(``tests/student/train/test_sampled_token_variants.py``).

Direction conventions (the same as TRL's ``generalized_jsd_loss``):

* forward KL  = ``KL(teacher || student)`` (mass-covering);
* reverse KL  = ``KL(student || teacher)`` (mode-seeking);
* ``jsd(beta)`` = ``beta * KL(T || M) + (1 - beta) * KL(S || M)`` with the mixture
  ``M = beta * T + (1 - beta) * S``; ``beta = 0`` is defined as the forward KL and
  ``beta = 1`` as the reverse KL (TRL special-cases both ends the same way).

Temperature divides the student logits only: the teacher server already applied
the same temperature before it returned log-probs. No ``T**2`` rescaling is applied.

This module does not chunk, normalise over a step or pick the recipe's objective
(``objective.py`` and ``table.py`` in this package do), gather its inputs, select
positions or step an optimizer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from miniverl.common.errors import ConfigError

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")


# -- primitives -------------------------------------------------------------------------


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, stable at both ends.

    ``log(-expm1(x))`` loses nothing when ``x`` is close to 0 (a tiny tail), and
    ``log1p(-exp(x))`` loses nothing when ``x`` is very negative (a tail close to 1);
    the switch at ``-ln 2`` is Maechler's rule. ``x`` is clamped to at most minus the
    smallest normal float first: a ``logsumexp`` of gathered log-probs may round to 0
    or a hair above, and ``log(0)`` there would send ``0 * inf = nan`` into backward
    even when a tail floor makes the upstream gradient zero.
    """
    x = x.clamp(max=-torch.finfo(x.dtype).tiny)
    switch = x > -math.log(2.0)
    # Each branch is evaluated on a value that is safe for it, so the unused branch of
    # torch.where never produces a nan whose (zero) gradient would still poison backward.
    near_zero = torch.where(switch, x, torch.full_like(x, -1.0))
    far = torch.where(switch, torch.full_like(x, -1.0), x)
    return torch.where(switch, torch.log(-torch.expm1(near_zero)), torch.log1p(-torch.exp(far)))


def _kl_P(logp_P_V: torch.Tensor, logq_P_V: torch.Tensor) -> torch.Tensor:
    """``sum_v p (log p - log q)`` per row, with ``0 log 0 = 0`` (also when ``q = 0``)."""
    p_P_V = logp_P_V.exp()
    zero = p_P_V == 0
    # where(...) before the product: 0 * (-inf - -inf) would be nan in the value and in
    # the gradient; masking the difference keeps both finite.
    diff_P_V = torch.where(zero, torch.zeros_like(logp_P_V), logp_P_V - logq_P_V)
    return (p_P_V * diff_P_V).sum(-1)


def _divergence_P(student_logp_P_V: torch.Tensor, teacher_logp_P_V: torch.Tensor,
                  divergence: str, jsd_beta: float) -> torch.Tensor:
    """Divergence between two normalised log-distributions over the last axis."""
    if divergence == "forward_kl" or (divergence == "jsd" and jsd_beta == 0.0):
        return _kl_P(teacher_logp_P_V, student_logp_P_V)
    if divergence == "reverse_kl" or (divergence == "jsd" and jsd_beta == 1.0):
        return _kl_P(student_logp_P_V, teacher_logp_P_V)
    if divergence == "jsd":
        return _jsd_P(student_logp_P_V, teacher_logp_P_V, jsd_beta)
    raise ConfigError(
        f"loss.divergence={divergence!r} is not one of {', '.join(DIVERGENCES)}; fix the recipe"
    )


def _jsd_P(student_logp_P_V: torch.Tensor, teacher_logp_P_V: torch.Tensor,
           beta: float) -> torch.Tensor:
    """``beta * KL(T || M) + (1 - beta) * KL(S || M)`` for ``0 < beta < 1``."""
    if not 0.0 < beta < 1.0:
        raise ConfigError(f"loss.jsd_beta={beta} must be in [0, 1]; set it in the recipe")
    mixture_P_V = torch.logsumexp(
        torch.stack([teacher_logp_P_V + math.log(beta), student_logp_P_V + math.log1p(-beta)]),
        dim=0,
    )
    return (beta * _kl_P(teacher_logp_P_V, mixture_P_V)
            + (1.0 - beta) * _kl_P(student_logp_P_V, mixture_P_V))


def _student_logp(student_logits_P_V: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise ConfigError(f"loss.temperature={temperature} must be > 0; fix the recipe")
    if student_logits_P_V.dtype in (torch.float16, torch.bfloat16):
        # log_softmax in bf16 rounds small log-probs to a few bits; one chunk in fp32 is cheap.
        student_logits_P_V = student_logits_P_V.float()
    if temperature != 1.0:
        student_logits_P_V = student_logits_P_V / temperature
    return F.log_softmax(student_logits_P_V, dim=-1)


# -- exact full-vocabulary divergences -------------------------------------------------------


def exact_divergence_P(
    student_logits_P_V: torch.Tensor,
    teacher_logprobs_P_V: torch.Tensor,
    *,
    divergence: str = "forward_kl",
    jsd_beta: float = 0.5,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Exact per-position divergence over the whole vocabulary.

    Args:
        student_logits_P_V: raw student logits ``[P, V]`` (temperature applied here).
        teacher_logprobs_P_V: teacher log-probs ``[P, V]`` (already tempered).
    Returns:
        ``[P]`` divergences, in the dtype of the student logits.
    """
    student_logp = _student_logp(student_logits_P_V, temperature)
    teacher_logp = teacher_logprobs_P_V.to(student_logp.dtype)
    return _divergence_P(student_logp, teacher_logp, divergence, jsd_beta)


def exact_forward_kl_P(student_logits_P_V, teacher_logprobs_P_V, *, temperature=1.0):
    """``KL(teacher || student)`` per position ``[P]``; see :func:`exact_divergence_P`."""
    return exact_divergence_P(
        student_logits_P_V, teacher_logprobs_P_V, divergence="forward_kl", temperature=temperature
    )


def exact_reverse_kl_P(student_logits_P_V, teacher_logprobs_P_V, *, temperature=1.0):
    """``KL(student || teacher)`` per position ``[P]``; see :func:`exact_divergence_P`."""
    return exact_divergence_P(
        student_logits_P_V, teacher_logprobs_P_V, divergence="reverse_kl", temperature=temperature
    )


def exact_jsd_P(student_logits_P_V, teacher_logprobs_P_V, *, beta=0.5, temperature=1.0):
    """Generalised JSD per position ``[P]`` (beta 0 = forward KL, 1 = reverse KL)."""
    return exact_divergence_P(
        student_logits_P_V,
        teacher_logprobs_P_V,
        divergence="jsd",
        jsd_beta=beta,
        temperature=temperature,
    )


# -- bucketed top-k + tail divergences ----------------------------------------------------------


def bucketed_topk_tail_distributions(
    student_logits_P_V: torch.Tensor, teacher_ids_P_K: torch.Tensor,
    teacher_logprobs_P_K: torch.Tensor, teacher_tail_logmass_P: torch.Tensor, *,
    temperature: float = 1.0, tail_epsilon: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher log-distributions over ``K + 1`` buckets, ``([P, K+1], [P, K+1])``.

    The student is normalised over the *full* vocabulary and gathered at the
    teacher's ids (never a softmax over the K gathered logits, which would invent
    mass); its tail bucket is ``log1mexp(logsumexp(gathered))``. Both tails are
    floored at ``tail_epsilon`` (in probability; 0 = no floor) and each ``K + 1``
    distribution is renormalised. When ``K == V`` the buckets are the vocabulary:
    both tails are exactly empty and the divergence equals the exact one.
    """
    student_logp_P_V = _student_logp(student_logits_P_V, temperature)
    ids_P_K = teacher_ids_P_K.long()
    student_top_P_K = student_logp_P_V.gather(-1, ids_P_K)
    teacher_top_P_K = teacher_logprobs_P_K.to(student_logp_P_V.dtype)
    teacher_tail_P = teacher_tail_logmass_P.to(student_logp_P_V.dtype)
    if ids_P_K.shape[-1] >= student_logp_P_V.shape[-1]:
        # The top-k already is the whole vocabulary: rounding would otherwise leave the
        # student a ~1e-16 tail against the teacher's zero one (infinite reverse KL).
        student_tail_P = torch.full_like(teacher_tail_P, -math.inf)
    else:
        student_tail_P = log1mexp(torch.logsumexp(student_top_P_K, dim=-1))
    if tail_epsilon > 0.0:
        floor = math.log(tail_epsilon)
        student_tail_P = student_tail_P.clamp(min=floor)
        teacher_tail_P = teacher_tail_P.clamp(min=floor)
    student_B = torch.cat([student_top_P_K, student_tail_P.unsqueeze(-1)], dim=-1)
    teacher_B = torch.cat([teacher_top_P_K, teacher_tail_P.unsqueeze(-1)], dim=-1)
    student_B = student_B - torch.logsumexp(student_B, dim=-1, keepdim=True)
    teacher_B = teacher_B - torch.logsumexp(teacher_B, dim=-1, keepdim=True)
    return student_B, teacher_B


def bucketed_topk_tail_divergence_P(
    student_logits_P_V: torch.Tensor, teacher_ids_P_K: torch.Tensor,
    teacher_logprobs_P_K: torch.Tensor, teacher_tail_logmass_P: torch.Tensor, *,
    divergence: str = "forward_kl", jsd_beta: float = 0.5, temperature: float = 1.0,
    tail_epsilon: float = 0.0,
) -> torch.Tensor:
    """Per-position divergence ``[P]`` between the ``K + 1``-bucket distributions.

    Args:
        student_logits_P_V: raw student logits ``[P, V]``.
        teacher_ids_P_K: teacher top-k token ids ``[P, K]``.
        teacher_logprobs_P_K: teacher log-probs at those ids ``[P, K]``.
        teacher_tail_logmass_P: log of the teacher mass outside the top-k ``[P]``
            (``-inf`` when ``K == V``).
    """
    student_B, teacher_B = bucketed_topk_tail_distributions(
        student_logits_P_V, teacher_ids_P_K, teacher_logprobs_P_K, teacher_tail_logmass_P,
        temperature=temperature, tail_epsilon=tail_epsilon)
    return _divergence_P(student_B, teacher_B, divergence, jsd_beta)


# -- token-level objectives -----------------------------------------------------------------------


def sampled_token_reverse_kl_P(
    student_logits_P_V: torch.Tensor,
    sampled_ids_P: torch.Tensor,
    teacher_target_logprobs_P: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-sample reverse-KL estimator, policy-gradient style: ``(loss_P, estimate_P)``.

    For the token ``y`` the student actually sampled at each position,
    ``advantage = log T(y) - log S(y)`` (detached) and ``loss = -advantage * log S(y)``.
    Its gradient ``(log S(y) - log T(y)) * grad log S(y)`` is an unbiased sample of
    ``grad KL(S || T)`` when ``y ~ S`` (on-policy); off-policy tokens bias it.
    ``estimate_P = log S(y) - log T(y)`` (detached) is the matching KL estimate.
    """
    student_logp_P_V = _student_logp(student_logits_P_V, temperature)
    logp_P = student_logp_P_V.gather(-1, sampled_ids_P.long().unsqueeze(-1)).squeeze(-1)
    teacher_P = teacher_target_logprobs_P.to(logp_P.dtype)
    advantage_P = (teacher_P - logp_P).detach()
    return -advantage_P * logp_P, -advantage_P


def cross_entropy_P(
    student_logits_P_V: torch.Tensor, target_ids_P: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """SFT cross-entropy ``-log S(target)`` per position ``[P]``."""
    student_logp_P_V = _student_logp(student_logits_P_V, temperature)
    return -student_logp_P_V.gather(-1, target_ids_P.long().unsqueeze(-1)).squeeze(-1)


# -- the sampled-token variants: truncated importance ratio, log-ratio clamp, task reward --


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
                "build the targets with objectives.variants.step_inputs"
            )
        weight_P = truncated_ratio_P(logp_P, sampling_logprobs_P, importance_ratio_cap)
        advantage_P = weight_P * advantage_P
    return policy_gradient_P(logp_P, advantage_P), estimate_P
