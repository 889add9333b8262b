"""One loss over targets of two kinds: routed teachers that do not share a tokenizer.

A recipe may route one environment to a teacher with the student's tokenizer (its
targets are ``topk`` or ``exact``) and another to a teacher with its own tokenizer
(``xvocab``; docs/several-teachers.md, "Teachers with another tokenizer"). The run's
kind is then ``mixed``, and each episode is trained on by the objective of its own
targets' kind: the one a run of that teacher alone picks (``table.py``).

:func:`kind_parts` cuts one micro-batch into parts, one per kind: the episodes of that
kind and the rows of the micro-batch's positions they hold (an episode's positions are
consecutive rows, in micro-batch order). :class:`KindParts` holds each part's targets
(``updates.targets_for`` builds them), and :class:`ByKind` sums the parts' losses, each
divided by the positions of the whole optimizer step: the step's gradient is the sum of
the gradients each route's episodes give under their own objective.

This module holds no formula and picks nothing from the recipe (``table.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from miniverl.common.errors import ConfigError
from miniverl.student.train.objectives.objective import (
    Head,
    LossSettings,
    Objective,
    TeacherTargets,
)


def kind_parts(scored: list[Any]) -> list[tuple[str, np.ndarray, list[int]]]:
    """``[(kind, rows, episodes)]`` of a micro-batch of ``Scored`` (each with its
    ``kind``), kinds in order of first appearance: the indices of the episodes of that
    kind and the rows their positions hold."""
    parts: dict[str, tuple[list[np.ndarray], list[int]]] = {}
    offset = 0
    for i, s in enumerate(scored):
        if s.kind is None:
            raise ConfigError(f"the targets of trajectory {s.traj.id} carry no kind; a run of "
                              "routed teachers of two tokenizers needs each reply's")
        n = len(s.positions_P)
        rows, episodes = parts.setdefault(s.kind, ([], []))
        rows.append(np.arange(offset, offset + n, dtype=np.int64))
        episodes.append(i)
        offset += n
    return [(kind, np.concatenate(rows), episodes) for kind, (rows, episodes) in parts.items()]


@dataclass
class KindParts:
    """A micro-batch's targets as parts of one kind each: ``(kind, rows, targets)``,
    ``rows`` the micro-batch's positions the part's ``targets`` are for."""

    parts: list[tuple[str, torch.Tensor, TeacherTargets]]


@dataclass(frozen=True)
class ByKind(Objective):
    """Each part of a :class:`KindParts` by the objective of its kind, summed."""

    objectives: dict[str, Objective]  # by target kind
    reads: ClassVar[tuple[str, ...]] = ()

    @property
    def name(self) -> str:
        return "; ".join(f"{kind}: {o.name}" for kind, o in self.objectives.items())

    def loss(self, hidden_P_H: torch.Tensor, lm_head: Head, targets: KindParts,
             settings: LossSettings, *, num_global_positions: int | None = None,
             ) -> tuple[torch.Tensor, dict[str, float]]:
        """The sum of every part's loss, each over its own rows of ``hidden_P_H`` and
        divided by ``num_global_positions`` (default: this micro-batch's positions)."""
        if not isinstance(targets, KindParts):
            raise ConfigError(f"objective {self.name!r} reads the targets of a run of two "
                              "kinds, cut by kind (KindParts); build them with "
                              "updates.targets_for(..., kind='mixed')")
        n = int(hidden_P_H.shape[0])
        denom = n if num_global_positions is None else num_global_positions
        total, div_sum, positions = None, 0.0, 0.0
        for kind, rows, part in targets.parts:
            loss, metrics = self.objectives[kind].loss(hidden_P_H[rows], lm_head, part, settings,
                                                       num_global_positions=denom)
            total = loss if total is None else total + loss
            div_sum += metrics["divergence_sum"]
            positions += metrics["positions"]
        if total is None:  # an empty micro-batch: every parameter still gets a gradient
            total = lm_head(hidden_P_H).sum() * 0.0
        return total, {"divergence": div_sum / max(1, n), "divergence_sum": div_sum,
                       "positions": positions}
