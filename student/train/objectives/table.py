"""The recipe's pick from the table of objectives, made once per run.

:func:`objective_for` looks the recipe's ``loss`` values ``(estimator, objective,
divergence)`` up in :data:`~.objective.OBJECTIVES` and adds the standard variants the
section sets (``variants.py``); a combination the table lacks is a one-line error naming
the value, the rule and the fix. :func:`objective_for_kind` is the pick for the targets
a run asks for (``xvocab``: the objectives of a teacher with another tokenizer), and
``objective.request_kind`` the targets a recipe asks for (:func:`teacher_kind` one teacher's,
:func:`run_kind` the run's: ``mixed`` for routed teachers of both tokenizers). The trainer calls them when the run
starts (``state.py``), so a recipe the table refuses stops the run before any work, and
no update looks anything up.

This module holds no objective or formula (``objective.py``, ``formulas.py``); it does
not micro-batch or step an optimizer (``student/train/updates.py``).
"""

from __future__ import annotations

from typing import Any

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import LossConfig
from miniverl.student.train.objectives.by_kind import ByKind
from miniverl.student.train.objectives.formulas import DIVERGENCES
from miniverl.student.train.objectives.group_sampled_token import GroupSampledToken
from miniverl.student.train.objectives.group_uld import GroupULD
from miniverl.student.train.objectives.objective import (
    ESTIMATORS,
    OBJECTIVES,
    TARGETS,
    CrossEntropy,
    Objective,
    StepObjective,
    request_kind,
)
from miniverl.student.train.objectives.variants import TaskReward, with_variants


def objective_for(config: LossConfig) -> Objective:
    """The objective the recipe's ``loss`` section names (:data:`OBJECTIVES`), built from
    it, with the standard variants it sets (``variants.py``)."""
    s = config
    found = OBJECTIVES.get((s.estimator, s.objective, s.divergence))
    if found is not None:
        return with_variants(found(config), config)
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


def run_objective(recipe: Any) -> StepObjective:
    """The objective a run trains with, built once from its ``loss`` section when it
    starts: the pick for the targets its teachers give (:func:`objective_for_kind`,
    :func:`run_kind`; ``dpo`` trains on its own preference loss, ``modes/dpo.py``), the
    task reward for ``rl``, the cross-entropy of ``sft`` (``updates.sft_step``'s)."""
    if recipe.needs_teacher:
        return objective_for_kind(recipe.loss, run_kind(recipe))
    return TaskReward(recipe.loss) if recipe.run.mode == "rl" else CrossEntropy(recipe.loss)


def objective_for_kind(config: LossConfig, kind: str) -> StepObjective:
    """The objective for targets of ``kind``: :func:`objective_for` for ``topk`` and
    ``exact``; for ``xvocab`` (a teacher with another tokenizer) the one
    ``loss.cross_vocab`` names: the group sampled-token estimator
    (``group_sampled_token.py``; unset or ``sampled_token``), or ``uld`` / ``hybrid``
    (``group_uld.py``); for ``mixed`` (routed teachers of both tokenizers) each episode
    by its own kind's (``by_kind.py``). What each of them needs of the rest of the
    section (the estimator, the divergence, no variants) is the recipe's rule
    (``common/recipe.py``, ``_cross_tokenizer_loss``), checked when the recipe loads."""
    if kind == "mixed":
        return ByKind({request_kind(config): objective_for(config),
                       "xvocab": xvocab_objective(config)})
    return xvocab_objective(config) if kind == "xvocab" else objective_for(config)


def xvocab_objective(config: LossConfig) -> Objective:
    """The objective of a teacher with another tokenizer that ``loss.cross_vocab`` names."""
    if config.cross_vocab in ("uld", "hybrid"):
        return GroupULD(config)
    return GroupSampledToken(config)


def teacher_kind(teacher: Any, config: LossConfig) -> str:
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
