"""One loss over targets of two kinds: routed teachers that do not share a tokenizer.

A recipe may route one environment to a teacher with the student's tokenizer (its
targets are ``topk`` or ``exact``) and another to a teacher with its own tokenizer
(``xvocab``; docs/several-teachers.md, "Teachers with another tokenizer"). The run's
kind is then ``mixed``, and each episode is trained on by the objective of its own
targets' kind: the one a run of that teacher alone picks (``table.py``).

:func:`kind_parts` cuts one micro-batch of scored episodes into parts, one per kind:
the episodes of that kind and the rows of the micro-batch's positions they hold (an
episode's positions are consecutive rows, in micro-batch order). :class:`ByKind` gives
each part to its kind's objective (which builds the part's targets) and sums the parts'
losses, each divided by the positions of the whole optimizer step: the step's gradient
is the sum of the gradients each route's episodes give under their own objective.

This module holds no formula and picks nothing from the recipe (``table.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import Trajectory
from miniverl.student.train.objectives.objective import Head, Objective, empty_loss
from miniverl.student.train.teacher.link import Scored


def kind_parts(scored: Sequence[Scored]) -> list[tuple[str, np.ndarray, list[int]]]:
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


@dataclass(frozen=True)
class ByKind:
    """A :class:`~.objective.StepObjective`: each episode of a micro-batch by the
    objective of its own targets' kind, the parts' losses summed."""

    objectives: dict[str, Objective]  # by target kind
    kind = "mixed"

    @property
    def name(self) -> str:
        return "; ".join(f"{kind}: {o.name}" for kind, o in self.objectives.items())

    def step_inputs(self, trajs: list[Trajectory],
                    positions: list[np.ndarray]) -> list[dict[str, np.ndarray]] | None:
        """None: the objectives of a mixed run read no per-step input (the recipe
        refuses loss variants with a teacher of another tokenizer)."""
        return None

    def batch_loss(self, hidden_P_H: torch.Tensor, lm_head: Head, batch: Sequence[Scored],
                   inputs: list[dict[str, np.ndarray]] | None, *,
                   num_global_positions: int | None = None,
                   ) -> tuple[torch.Tensor, dict[str, float]]:
        """The sum of every part's loss (:func:`kind_parts`), each over its own rows of
        ``hidden_P_H`` and divided by ``num_global_positions`` (default: this
        micro-batch's positions)."""
        n = int(hidden_P_H.shape[0])
        denom = n if num_global_positions is None else num_global_positions
        total, div_sum, positions = None, 0.0, 0.0
        for kind, rows, part in kind_parts(batch):
            loss, metrics = self.objectives[kind].batch_loss(
                hidden_P_H[torch.as_tensor(rows, device=hidden_P_H.device)], lm_head,
                [batch[i] for i in part], None, num_global_positions=denom)
            total = loss if total is None else total + loss
            div_sum += metrics["divergence_sum"]
            positions += metrics["positions"]
        if total is None:  # an empty micro-batch: every parameter still gets a gradient
            return empty_loss(hidden_P_H, lm_head)
        return total, {"divergence": div_sum / max(1, n), "divergence_sum": div_sum,
                       "positions": positions}
