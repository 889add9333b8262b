"""The table of objectives, and the recipe's pick from it.

:data:`OBJECTIVES` maps the recipe's ``loss`` values ``(estimator, objective,
divergence)`` to one :class:`~.objective.Objective` each; :func:`objective_for` looks
the recipe up in it, and a combination the table lacks is a one-line error naming the
value, the rule and the fix. :data:`SFT` is the cross-entropy objective the SFT step
and the warm-up train with. :func:`distillation_loss` and :func:`sft_loss` are the two
calls the update step makes.

To add an objective: write its per-position function (``per_position.py`` for a pure
formula), name the :class:`~.objective.TeacherTargets` fields it reads (a new input is
a new field there), and add a row under the recipe values that pick it.

This module holds no formula and does not chunk (``per_position.py``,
``objective.py``); it does not micro-batch or step an optimizer (``updates.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from miniverl.common.errors import ConfigError
from miniverl.student.train.objectives.group_sampled_token import GROUP_SAMPLED_TOKEN
from miniverl.student.train.objectives.group_uld import GROUP_HYBRID, GROUP_ULD
from miniverl.student.train.objectives.objective import LossSettings, Objective, TeacherTargets
from miniverl.student.train.objectives.per_position import (
    DIVERGENCES,
    bucketed_topk_tail_divergence_P,
    cross_entropy_P,
    exact_divergence_P,
    sampled_token_reverse_kl_P,
)
from miniverl.student.train.objectives.variants import uses_variants, with_variants

TARGETS = ("exact_full_vocab", "bucketed_topk_tail")  # the values of loss.objective
ESTIMATORS = ("full", "sampled_token")


def exact(logits_C_V, *, settings: LossSettings, logprobs_P_V, divergence: str):
    """The exact full-vocabulary divergence; it is both the loss and the figure."""
    div_C = exact_divergence_P(logits_C_V, logprobs_P_V, divergence=divergence,
                               jsd_beta=settings.jsd_beta, temperature=settings.temperature)
    return div_C, div_C


def bucketed(logits_C_V, *, settings: LossSettings, topk_ids_P_K, topk_logprobs_P_K,
             tail_logmass_P, divergence: str):
    """The ``K + 1``-bucket divergence; it is both the loss and the figure."""
    div_C = bucketed_topk_tail_divergence_P(
        logits_C_V, topk_ids_P_K, topk_logprobs_P_K, tail_logmass_P, divergence=divergence,
        jsd_beta=settings.jsd_beta, temperature=settings.temperature,
        tail_epsilon=settings.tail_epsilon,
    )
    return div_C, div_C


def sampled_token(logits_C_V, *, settings: LossSettings, sampled_ids_P, target_logprobs_P):
    """The sampled-token reverse-KL estimator: the policy-gradient loss and the detached
    KL estimate ``log S(y) - log T(y)`` as the figure."""
    return sampled_token_reverse_kl_P(logits_C_V, sampled_ids_P, target_logprobs_P,
                                      temperature=settings.temperature)


def cross_entropy(logits_C_V, *, settings: LossSettings, sampled_ids_P):
    """SFT: ``-log S(next token)``, always at temperature 1 (``loss.temperature`` tempers
    the distillation targets, not the data)."""
    nll_C = cross_entropy_P(logits_C_V, sampled_ids_P)
    return nll_C, nll_C


_SAMPLED_TOKEN = Objective("sampled_token reverse_kl", ("sampled_ids_P", "target_logprobs_P"),
                           sampled_token)

OBJECTIVES: dict[tuple[str, str, str], Objective] = {
    **{("full", "exact_full_vocab", d): Objective(
        f"exact_full_vocab {d}", ("logprobs_P_V",), partial(exact, divergence=d))
       for d in DIVERGENCES},
    **{("full", "bucketed_topk_tail", d): Objective(
        f"bucketed_topk_tail {d}", ("topk_ids_P_K", "topk_logprobs_P_K", "tail_logmass_P"),
        partial(bucketed, divergence=d))
       for d in DIVERGENCES},
    # The estimator reads only the teacher's log-prob of the sampled token, which both
    # target kinds carry.
    **{("sampled_token", target, "reverse_kl"): _SAMPLED_TOKEN for target in TARGETS},
}

SFT = Objective("sft", ("sampled_ids_P",), cross_entropy)


def objective_for(config: Any) -> Objective:
    """The objective the recipe's ``loss`` section names (:data:`OBJECTIVES`), with the
    standard variants it sets (``variants.py``)."""
    s = LossSettings.of(config)
    found = OBJECTIVES.get((s.estimator, s.objective, s.divergence))
    if found is not None:
        return with_variants(found, s)
    if s.estimator == "sampled_token" and s.divergence != "reverse_kl":
        raise ConfigError(
            f"loss.estimator='sampled_token' estimates the reverse KL, but loss.divergence="
            f"{s.divergence!r}; set divergence: reverse_kl or estimator: full"
        )
    for name, value, allowed in (("estimator", s.estimator, ESTIMATORS),
                                 ("objective", s.objective, TARGETS),
                                 ("divergence", s.divergence, DIVERGENCES)):
        if value not in allowed:
            raise ConfigError(
                f"loss.{name}={value!r} is not one of {', '.join(allowed)}; fix the recipe"
            )
    raise ConfigError(  # every allowed combination has a row; this is a table bug
        f"no objective for loss ({s.estimator}, {s.objective}, {s.divergence}); "
        "add a row to OBJECTIVES"
    )


def objective_for_kind(config: Any, kind: str) -> Objective:
    """The objective for targets of ``kind``: :func:`objective_for` for ``topk`` and
    ``exact``; for ``xvocab`` (a teacher with another tokenizer) the one
    ``loss.cross_vocab`` names: the group sampled-token estimator
    (``group_sampled_token.py``; unset or ``sampled_token``, with the recipe's loss the
    sampled-token estimator without variants), or ``uld`` / ``hybrid``
    (``group_uld.py``; the recipe's estimator ``full``, without variants)."""
    if kind != "xvocab":
        return objective_for(config)
    s = LossSettings.of(config)
    variants = " with variants" if uses_variants(s) else ""
    if s.cross_vocab in ("uld", "hybrid"):
        if s.estimator != "full" or uses_variants(s):
            raise ConfigError(
                f"loss.cross_vocab={s.cross_vocab!r} trains on the teacher's top-k; "
                f"loss.estimator={s.estimator!r}{variants}: set estimator: full and no loss "
                "variants, or cross_vocab: sampled_token")
        return GROUP_ULD if s.cross_vocab == "uld" else GROUP_HYBRID
    if s.cross_vocab not in (None, "sampled_token"):
        raise ConfigError(f"loss.cross_vocab={s.cross_vocab!r} is not one of sampled_token, "
                          "hybrid, uld; fix the recipe")
    if s.estimator != "sampled_token" or s.divergence != "reverse_kl" or uses_variants(s):
        raise ConfigError(
            f"teacher.tokenizer: other trains with the group sampled-token estimator; "
            f"loss.estimator={s.estimator!r}, divergence={s.divergence!r}{variants}: set "
            "estimator: sampled_token, divergence: reverse_kl and no loss variants, or "
            "loss.cross_vocab: uld or hybrid")
    return GROUP_SAMPLED_TOKEN


def request_kind(config: Any) -> str:
    """The targets to ask the teacher for: ``exact`` log-probs ``[P, V]`` for
    ``exact_full_vocab``, else ``topk`` (the sampled-token estimator reads the target
    log-prob both kinds carry, so it follows ``loss.objective`` as well)."""
    return "exact" if LossSettings.of(config).objective == "exact_full_vocab" else "topk"


def distillation_loss(
    hidden_P_H: torch.Tensor,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    targets: TeacherTargets,
    config: Any = None,
    *,
    num_global_positions: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation loss the recipe asks for, over ``P`` selected positions.

    ``config`` is the recipe's ``loss`` section (or :class:`LossSettings`; None: the
    defaults). See :meth:`Objective.loss` for the arguments and what it returns.
    """
    settings = LossSettings.of(config)
    return objective_for(settings).loss(hidden_P_H, lm_head, targets, settings,
                                        num_global_positions=num_global_positions)


def sft_loss(
    hidden_P_H: torch.Tensor,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    target_ids_P: torch.Tensor,
    *,
    chunk_size: int = 1024,
    num_global_positions: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Chunked SFT cross-entropy; ``(loss, metrics)`` with the mean NLL as ``divergence``."""
    return SFT.loss(hidden_P_H, lm_head, TeacherTargets(sampled_ids_P=target_ids_P),
                    LossSettings(chunk_size=chunk_size),
                    num_global_positions=num_global_positions)
