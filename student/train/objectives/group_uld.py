"""ULD over byte groups, and the per-group hybrid with exact matching: objectives of a
teacher with another tokenizer (``loss.cross_vocab: uld | hybrid``,
docs/cross-tokenizer.md).

Each selected position belongs to a group of student positions that, with a group of
teacher positions, covers the same bytes (``student/train/teacher/xvocab.py``). The
targets carry one row per group, on the group's first position:

- ``topk_logprobs_P_K``: the teacher's top-k merged over the group's teacher positions
  (``cross_vocab.merge_group_topk``, ``observed``: the first position's top-k times the
  probabilities of the group's later actual tokens), as log-probs, and in
  ``tail_logmass_P`` the mass outside it, merged the same way;
- ``group_exact_P`` (``hybrid`` only): 1 where the group is one token per side and the
  two tokens are a pair of the :class:`~miniverl.student.train.teacher.cross_vocab.VocabMap`;
  the row is then the teacher's top-k carried into the student's vocabulary
  (``cross_vocab.project_topk``: ids in ``topk_ids_P_K``, ``-inf`` where a teacher
  token has no student twin).

The group's loss is, on an exact group, the forward KL on the projected top-k
(``cross_vocab.exact_forward_kl_P``); on any other group, ULD from the teacher's top-k
(``cross_vocab.uld_topk_distance_G``) between the student's probabilities merged the
same way (``cross_vocab.merge_group_probs``) and the teacher's merged top-k. It sits on
the group's first position (the others carry 0), so the step's sum over positions is the
sum over groups, divided by the step's positions like every objective.

Merging needs every position of a group in one chunk: :class:`GroupULD` cuts the
positions into chunks of whole groups, at most ``chunk_size`` positions each (a group
longer than that is a chunk of its own), so a chunk boundary never falls inside a group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import LossConfig
from miniverl.student.train.objectives.objective import (
    Head,
    Objective,
    TeacherTargets,
    empty_loss,
)
from miniverl.student.train.teacher.cross_vocab import (
    exact_forward_kl_P,
    merge_group_probs,
    uld_topk_distance_G,
)


def group_chunks(first_P: torch.Tensor, chunk_size: int) -> list[tuple[int, int]]:
    """``[(start, end)]``: consecutive runs of whole groups (a group starts where
    ``first_P`` is 1), each at most ``chunk_size`` positions unless one group is longer."""
    n = int(first_P.shape[0])
    bounds = [*torch.nonzero(first_P.bool()).squeeze(-1).tolist(), n]
    chunks, lo = [], 0
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):
        if e - lo > chunk_size and s > lo:
            chunks.append((lo, s))
            lo = s
    chunks.append((lo, n))
    return chunks


def group_uld(logits_C_V: torch.Tensor, sampled_ids_P: torch.Tensor,
              group_first_P: torch.Tensor, group_exact_P: torch.Tensor,
              topk_ids_P_K: torch.Tensor, topk_logprobs_P_K: torch.Tensor,
              tail_logmass_P: torch.Tensor, *, temperature: float,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss_C, loss_C)`` over a chunk of whole groups: each group's loss on its first
    position, 0 on the others (see the module doc)."""
    n = logits_C_V.shape[0]
    scaled_C_V = logits_C_V.float() / temperature
    probs_C_V = torch.softmax(scaled_C_V, dim=-1)
    starts_G = torch.nonzero(group_first_P.bool()).squeeze(-1)
    ends_G = torch.cat([starts_G[1:], starts_G.new_tensor([n])])
    student_G_V = merge_group_probs(probs_C_V, sampled_ids_P, starts_G, ends_G, "observed")
    teacher_G_K = topk_logprobs_P_K[starts_G].float().exp()
    loss_G = uld_topk_distance_G(student_G_V, teacher_G_K,
                                 tail_logmass_P[starts_G].float().exp())
    exact_G = group_exact_P[starts_G].bool()
    if bool(exact_G.any()):
        rows = starts_G[exact_G]
        kl = exact_forward_kl_P(scaled_C_V[rows], topk_ids_P_K[rows].long(),
                                topk_logprobs_P_K[rows])
        loss_G = loss_G.masked_scatter(exact_G, kl.to(loss_G.dtype))
    loss_C = torch.zeros(n, dtype=loss_G.dtype, device=loss_G.device).index_add(0, starts_G,
                                                                                 loss_G)
    return loss_C, loss_C


class ByteGroupObjective(Objective):
    """An :class:`Objective` over byte groups (``group_sampled_token.py``, :class:`GroupULD`):
    a micro-batch with no aligned position is a zero loss that still backwards, and the
    first position must start a group; then :meth:`over_groups`."""

    kind: ClassVar[str] = "xvocab"

    def loss(self, hidden_P_H: torch.Tensor, lm_head: Head, targets: TeacherTargets, *,
             num_global_positions: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        if int(hidden_P_H.shape[0]) == 0:
            return empty_loss(hidden_P_H, lm_head)
        self.check(targets)
        assert targets.group_first_P is not None  # self.check: it reads group_first_P
        if not bool(targets.group_first_P[0]):
            raise ConfigError("xvocab targets must start a group at their first position; "
                              "build them with student/train/teacher/xvocab.py")
        return self.over_groups(hidden_P_H, lm_head, targets,
                                num_global_positions=num_global_positions)

    def over_groups(self, hidden_P_H: torch.Tensor, lm_head: Head, targets: TeacherTargets, *,
                    num_global_positions: int | None) -> tuple[torch.Tensor, dict[str, float]]:
        """The chunked loss (:meth:`Objective.over_chunks`) over targets that start a
        group."""
        raise NotImplementedError


@dataclass(frozen=True)
class GroupULD(ByteGroupObjective):
    """:class:`Objective` whose chunks hold whole groups (``hybrid``: exact groups by
    forward KL; the same formula, which reads ``group_exact_P``)."""

    settings: LossConfig
    reads: ClassVar[tuple[str, ...]] = ("sampled_ids_P", "group_first_P", "group_exact_P",
                                        "topk_ids_P_K", "topk_logprobs_P_K", "tail_logmass_P")

    @property
    def name(self) -> str:
        return ("xvocab group hybrid (exact + uld)" if self.settings.cross_vocab == "hybrid"
                else "xvocab group uld")

    def per_position(self, hidden_C_H, lm_head, t):
        return group_uld(lm_head(hidden_C_H), t.sampled_ids_P, t.group_first_P,
                         t.group_exact_P, t.topk_ids_P_K, t.topk_logprobs_P_K,
                         t.tail_logmass_P, temperature=self.settings.temperature)

    def over_groups(self, hidden_P_H, lm_head, targets, *, num_global_positions):
        # The chunks hold whole groups (the module doc).
        return self.over_chunks(hidden_P_H, lm_head, targets,
                                group_chunks(targets.group_first_P, self.settings.chunk_size),
                                num_global_positions)
