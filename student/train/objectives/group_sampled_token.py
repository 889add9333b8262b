"""The sampled-token reverse-KL estimator over byte groups: the objective of a teacher
with another tokenizer (``teacher.tokenizer: other``, docs/cross-tokenizer.md).

Each selected position belongs to a group of student positions that, with a group of
teacher positions, covers the same bytes (``student/train/teacher/xvocab.py``). The
group's advantage is ``log T(bytes) - log S(bytes)``: the teacher's log-prob of the
bytes (``target_logprobs_P``, the same on every position of the group) minus the
student's, the sum of its positions' log-probs of their sampled tokens
(``cross_vocab.group_logprob_G``). Every position of the group gets it:
``loss_p = -advantage_g * log S(y_p)``, so the group's gradient is the REINFORCE step
on ``log S(bytes)`` (``cross_vocab.sampled_token_advantage_T``). With one token per
side per group it is the same-tokenizer estimator ``log T(y) - log S(y)``.

The student's group log-probs need every position of a group, and a chunk of the loss
may cut a group: :class:`GroupSampledToken` first computes the detached log-prob of
each sampled token over all ``P`` positions (one more pass of the LM head, no graph),
then the chunked loss. The figure reported per position is the group's KL estimate
``log S(bytes) - log T(bytes)`` divided by the group's positions, so it sums to the
group's estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from miniverl.common.recipe_sections import LossConfig
from miniverl.student.train.objectives.formulas import _student_logp
from miniverl.student.train.objectives.group_uld import ByteGroupObjective
from miniverl.student.train.objectives.objective import Head, TeacherTargets
from miniverl.student.train.teacher.cross_vocab import group_logprob_G


def group_sampled_token(logits_C_V: torch.Tensor, sampled_ids_P: torch.Tensor,
                        group_advantage_P: torch.Tensor, group_size_P: torch.Tensor, *,
                        temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss_C, estimate_C)``: ``-advantage * log S(y)`` and the group's KL estimate
    spread over its positions."""
    logp_C = _student_logp(logits_C_V, temperature).gather(
        -1, sampled_ids_P.long().unsqueeze(-1)).squeeze(-1)
    advantage_C = group_advantage_P.to(logp_C.dtype)
    return -advantage_C * logp_C, -advantage_C / group_size_P.to(logp_C.dtype)


@dataclass(frozen=True)
class GroupSampledToken(ByteGroupObjective):
    """:class:`Objective` whose advantage is computed per group before the chunks."""

    settings: LossConfig
    name: ClassVar[str] = "xvocab group sampled_token reverse_kl"
    reads: ClassVar[tuple[str, ...]] = ("sampled_ids_P", "target_logprobs_P", "group_first_P")

    def per_position(self, hidden_C_H, lm_head, t):
        return group_sampled_token(lm_head(hidden_C_H), t.sampled_ids_P, t.advantage_P,
                                   t.group_size_P, temperature=self.settings.temperature)

    def over_groups(self, hidden_P_H: torch.Tensor, lm_head: Head, targets: TeacherTargets, *,
                    num_global_positions: int | None) -> tuple[torch.Tensor, dict[str, float]]:
        settings = self.settings
        n = int(hidden_P_H.shape[0])
        # Present: loss() checked every field this objective reads.
        assert targets.group_first_P is not None and targets.target_logprobs_P is not None
        sampled_P, first_P = targets.sampled_ids_P, targets.group_first_P.bool()
        with torch.no_grad():
            logp_P = torch.cat([
                _student_logp(lm_head(hidden_P_H[s:s + settings.chunk_size]),
                              settings.temperature)
                .gather(-1, sampled_P[s:s + settings.chunk_size].long().unsqueeze(-1))
                .squeeze(-1).float()
                for s in range(0, n, settings.chunk_size)
            ])
            starts_G = torch.nonzero(first_P).squeeze(-1)
            ends_G = torch.cat([starts_G[1:], starts_G.new_tensor([n])])
            group_P = torch.cumsum(first_P.long(), 0) - 1
            student_G = group_logprob_G(logp_P, starts_G, ends_G)
            teacher_G = targets.target_logprobs_P.float()[starts_G]
            advantage_P = (teacher_G - student_G)[group_P]
            size_P = (ends_G - starts_G)[group_P]
        with_groups = replace(targets, advantage_P=advantage_P, group_size_P=size_P)
        return self.over_chunks(hidden_P_H, lm_head, with_groups, self.chunks(n),
                                num_global_positions)
