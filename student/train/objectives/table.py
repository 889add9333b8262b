"""The recipe's pick from the table of objectives, made once per run.

:func:`objective_for` looks the recipe's ``loss`` values ``(estimator, objective,
divergence)`` up in :data:`~.objective.OBJECTIVES` and adds the standard variants the
section sets (``variants.py``); a combination the table lacks is a one-line error naming
the value, the rule and the fix. :func:`objective_for_kind` is the pick for the targets
a run asks for (``xvocab``: the objectives of a teacher with another tokenizer), and
:func:`request_kind` the targets a recipe asks for (:func:`teacher_kind` one teacher's,
:func:`run_kind` the run's: ``mixed`` for routed teachers of both tokenizers). The trainer calls them when the run
starts (``state.py``), so a recipe the table refuses stops the run before any work, and
no update looks anything up.

This module holds no objective or formula (``objective.py``, ``formulas.py``); it does
not micro-batch or step an optimizer (``student/train/updates.py``).
"""

from __future__ import annotations

from typing import Any

from miniverl.common.errors import ConfigError
from miniverl.student.train.objectives.by_kind import ByKind
from miniverl.student.train.objectives.formulas import DIVERGENCES
from miniverl.student.train.objectives.group_sampled_token import GROUP_SAMPLED_TOKEN
from miniverl.student.train.objectives.group_uld import GROUP_HYBRID, GROUP_ULD
from miniverl.student.train.objectives.objective import (
    ESTIMATORS,
    OBJECTIVES,
    TARGETS,
    LossSettings,
    Objective,
)
from miniverl.student.train.objectives.variants import uses_variants, with_variants


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
    (``group_uld.py``; the recipe's estimator ``full``, without variants); for
    ``mixed`` (routed teachers of both tokenizers) each episode by its own kind's
    (``by_kind.py``)."""
    if kind == "mixed":
        return ByKind({request_kind(config): objective_for(config),
                       "xvocab": objective_for_kind(config, "xvocab")})
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


def teacher_kind(teacher: Any, config: Any) -> str:
    """The targets one teacher section gives: ``xvocab`` for ``tokenizer: other``
    (docs/cross-tokenizer.md), else :func:`request_kind` of the ``loss`` section
    ``config``."""
    return "xvocab" if teacher is not None and teacher.tokenizer == "other" else request_kind(config)


def run_kind(recipe: Any) -> str:
    """The targets a run trains on: the one kind its teachers give (``teacher:``, or
    every teacher of ``teachers:``), or ``mixed`` when routed teachers of both
    tokenizers give two."""
    sections = list((recipe.teachers or {}).values()) or [recipe.teacher]
    kinds = {teacher_kind(teacher, recipe.loss) for teacher in sections}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def request_kind(config: Any) -> str:
    """The targets to ask the teacher for: ``exact`` log-probs ``[P, V]`` for
    ``exact_full_vocab``, else ``topk`` (the sampled-token estimator reads the target
    log-prob both kinds carry, so it follows ``loss.objective`` as well)."""
    return "exact" if LossSettings.of(config).objective == "exact_full_vocab" else "topk"
