"""The objectives: what each one reads, the formula it calls, and the chunking.

An :class:`Objective` is one loss of the recipe's ``loss`` section (torchtune's
``ForwardKLWithChunkedOutputLoss`` beside its plain form): :meth:`Objective.loss`
evaluates it chunk by chunk, and each objective's :meth:`~Objective.per_position` is
the one place it calls its formula (``formulas.py``), every input passed by name::

    BucketedTopkTail.per_position -> formulas.bucketed_topk_tail_divergence_P(
        logits_C_V, t.topk_ids_P_K, t.topk_logprobs_P_K, t.tail_logmass_P, ...)

The records an objective reads are here too: :class:`TeacherTargets` (every
per-position input, one tensor per field, in the order the loss sees the positions),
built from a micro-batch of scored episodes by :func:`targets_of`. Each objective is
built from the recipe's ``loss`` section and keeps it (``settings``): nothing beside it
is passed per call. :data:`OBJECTIVES` is the table the recipe picks from (``table.py``
makes the pick, once per run) and :class:`CrossEntropy` the cross-entropy the SFT step
and the warm-up train with. :class:`StepObjective` is what an optimizer step asks of an
objective (this one, or ``by_kind.ByKind`` for a run of two target kinds).

The chunking: the LM head runs ``chunk_size`` positions at a time under activation
checkpointing, so ``[P, V]`` logits never exist whole, and the sum is divided by the
positions of the whole optimizer step.

To add an objective: write its formula in ``formulas.py``, a class here whose
``per_position`` calls it with the :class:`TeacherTargets` fields it reads (a new input
is a new field there), and a row of :data:`OBJECTIVES` under the recipe values that
pick it. The standard variants (``variants.py``) and the objectives of a teacher with
another tokenizer (``group_sampled_token.py``, ``group_uld.py``) are objectives too.

This module holds no formula (``formulas.py``), does not pick from the recipe
(``table.py``), micro-batch or step an optimizer (``student/train/updates.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import ClassVar, Protocol

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import LossConfig
from miniverl.common.trajectory import Trajectory
from miniverl.student.train.objectives.formulas import (
    DIVERGENCES,
    bucketed_topk_tail_divergence_P,
    cross_entropy_P,
    exact_divergence_P,
    sampled_token_reverse_kl_P,
)
from miniverl.student.train.teacher.link import Scored

Head = Callable[[torch.Tensor], torch.Tensor]  # [C, H] hidden -> [C, V] logits
TARGETS = ("exact_full_vocab", "bucketed_topk_tail")  # the values of loss.objective
ESTIMATORS = ("full", "sampled_token")


# How a missing field is named in an error: its wire name and shape.
WIRE_NAMES = {
    "sampled_ids_P": "the sampled token [P]",
    "target_logprobs_P": "target_logprobs [P]",
    "topk_ids_P_K": "ids [P, K]",
    "topk_logprobs_P_K": "logprobs [P, K]",
    "tail_logmass_P": "tail_logmass [P]",
    "logprobs_P_V": "logprobs [P, V]",
    "sampling_logprobs_P": "the student's sampling-time log-prob of the sampled token [P]",
    "weight_P": "the aggregation weight of each position [P]",
    "advantage_P": "the task-reward advantage of each position's episode [P]",
    "group_first_P": "group_first [P] (xvocab: the position starts a byte group)",
    "group_exact_P": "group_exact [P] (xvocab uld/hybrid: the group is an exact pair)",
}
# The field each reply array fills, by target kind. The wire's ``logprobs`` is named by
# its shape here: the top-k's [P, K] in a topk or xvocab reply, [P, V] in an exact one.
FIELDS_OF_KIND: dict[str, dict[str, str]] = {
    "topk": {"ids": "topk_ids_P_K", "logprobs": "topk_logprobs_P_K",
             "tail_logmass": "tail_logmass_P", "target_logprobs": "target_logprobs_P"},
    "exact": {"logprobs": "logprobs_P_V", "target_logprobs": "target_logprobs_P"},
    "xvocab": {"ids": "topk_ids_P_K", "logprobs": "topk_logprobs_P_K",
               "tail_logmass": "tail_logmass_P", "target_logprobs": "target_logprobs_P",
               "group_first": "group_first_P", "group_exact": "group_exact_P"},
    "none": {},
}
# The fields that are not the teacher's: the step fills them (``variants.step_inputs``).
STEP_FIELDS = ("sampling_logprobs_P", "weight_P", "advantage_P")


@dataclass
class TeacherTargets:
    """The per-position inputs for ``P`` selected positions, as tensors on the student's
    device, in the order the loss sees the positions.

    ``sampled_ids_P`` is the token that actually follows each position (the sampled-token
    estimator and SFT read it). Top-k targets fill ``topk_ids_P_K``,
    ``topk_logprobs_P_K`` and ``tail_logmass_P``; exact ones fill ``logprobs_P_V``;
    both fill ``target_logprobs_P`` (the teacher's log-prob of the sampled token). An
    input that is not the teacher's (a log-prob recorded at sampling time, the sequence
    a position belongs to) is one more field here.
    """

    sampled_ids_P: torch.Tensor
    target_logprobs_P: torch.Tensor | None = None
    topk_ids_P_K: torch.Tensor | None = None
    topk_logprobs_P_K: torch.Tensor | None = None
    tail_logmass_P: torch.Tensor | None = None
    logprobs_P_V: torch.Tensor | None = None
    # xvocab (student/train/teacher/xvocab.py): 1 where a position starts a byte group;
    # target_logprobs_P then holds the teacher's log-prob of the group's bytes.
    group_first_P: torch.Tensor | None = None
    # xvocab with loss.cross_vocab uld/hybrid: 1 where the group is an exact pair; the
    # group's row of topk_ids_P_K / topk_logprobs_P_K sits on its first position
    # (objectives/group_uld.py says what the row holds).
    group_exact_P: torch.Tensor | None = None
    # xvocab sampled-token: the size of each position's group (its advantage, in
    # advantage_P, is the group's; objectives/group_sampled_token.py).
    group_size_P: torch.Tensor | None = None
    # Not the teacher's: filled per step by ``variants.step_inputs`` when a variant (or
    # the task reward) reads them.
    sampling_logprobs_P: torch.Tensor | None = None
    weight_P: torch.Tensor | None = None
    advantage_P: torch.Tensor | None = None

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], sampled_ids_P: np.ndarray | torch.Tensor,
                    *, kind: str, device: torch.device | str = "cpu") -> TeacherTargets:
        """Build from a ``SCORE_OK`` / cache entry's arrays, each into the field
        :data:`FIELDS_OF_KIND` names for ``kind`` (kind ``none`` reads none: SFT and RL,
        where the next token is all the target there is)."""
        if kind not in FIELDS_OF_KIND:
            raise ConfigError(f"target kind {kind!r} is not 'topk', 'exact' or 'xvocab'")
        return cls(
            sampled_ids_P=torch.as_tensor(np.asarray(sampled_ids_P)).long().to(device),
            **{field: torch.as_tensor(np.asarray(arrays[name])).to(device)
               for name, field in FIELDS_OF_KIND[kind].items() if name in arrays},
        )

    def with_inputs(self, inputs: list[dict[str, np.ndarray]], device) -> TeacherTargets:
        """These targets with their trajectories' step ``inputs`` (``variants.py``: one
        dict per trajectory) concatenated in the order of their positions."""
        names = {name for fields_ in inputs for name in fields_}
        if not names:
            return self
        return replace(self, **{
            name: torch.from_numpy(np.concatenate([fields_[name] for fields_ in inputs]))
            .to(device) for name in names})

    def rows(self, lo: int, hi: int) -> TeacherTargets:
        """Positions ``lo:hi`` of every field that is set (one chunk's targets)."""
        return TeacherTargets(self.sampled_ids_P[lo:hi], **{
            f.name: None if (value := getattr(self, f.name)) is None else value[lo:hi]
            for f in fields(self)[1:]
        })


def missing_field(objective: str, name: str) -> ConfigError:
    """The error of an objective whose targets lack field ``name``."""
    if name in STEP_FIELDS:
        return ConfigError(
            f"loss '{objective}' needs {WIRE_NAMES[name]}, which these targets lack; build "
            "them with objectives.variants.step_inputs for the recipe's loss section")
    return ConfigError(
        f"loss '{objective}' needs teacher {WIRE_NAMES.get(name, name)}, which these targets "
        "lack; request kind 'exact' for exact_full_vocab and 'topk' for bucketed_topk_tail")


class StepObjective(Protocol):
    """What an optimizer step asks of its objective (``updates.distill_step``): the
    per-step inputs it reads and its loss over one micro-batch of scored episodes.
    :class:`Objective` is one; a run of two target kinds has ``by_kind.ByKind``, which
    gives each episode to the objective of its own kind."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str:
        """The targets it reads: ``topk``, ``exact``, ``xvocab``, ``none`` or ``mixed``."""

    def step_inputs(self, trajs: list[Trajectory],
                    positions: list[np.ndarray]) -> list[dict[str, np.ndarray]] | None: ...

    def batch_loss(self, hidden_P_H: torch.Tensor, lm_head: Head, batch: Sequence[Scored],
                   inputs: list[dict[str, np.ndarray]] | None, *,
                   num_global_positions: int | None = None,
                   ) -> tuple[torch.Tensor, dict[str, float]]: ...


def targets_of(batch: Sequence[Scored], kind: str, device) -> TeacherTargets:
    """The targets of a micro-batch of scored episodes, their replies joined in order,
    and the token each position predicts (``tokens[p + 1]``, :func:`next_tokens`)."""
    sampled_P = next_tokens([s.traj for s in batch], [s.positions_P for s in batch])
    merged = {}
    for name in batch[0].arrays if batch else ():
        parts = [s.arrays[name] for s in batch if name in s.arrays and len(s.arrays[name])]
        if parts:
            merged[name] = np.concatenate(parts)
    return TeacherTargets.from_arrays(merged, sampled_P, kind=kind, device=device)


def next_tokens(trajs: list[Trajectory], positions: list[np.ndarray]) -> np.ndarray:
    """The token each selected position predicts (``tokens[p + 1]``), concatenated."""
    return np.concatenate(
        [np.asarray(t.tokens, dtype=np.int64)[p + 1] for t, p in zip(trajs, positions, strict=True)]
    )


class Objective:
    """One objective: the :class:`TeacherTargets` fields it reads (``reads``: checked
    present before the first chunk, so a missing one is a one-line error naming it),
    the recipe's ``loss`` section it was built from (``settings``) and
    :meth:`per_position`, which calls its formula with them by name."""

    settings: LossConfig

    @property
    def name(self) -> str:
        """How metrics and errors name it (a class constant, or built from ``settings``)."""
        raise NotImplementedError

    @property
    def reads(self) -> tuple[str, ...]:
        """The :class:`TeacherTargets` fields it reads."""
        raise NotImplementedError

    @property
    def kind(self) -> str:
        """The targets it reads: ``topk``, ``exact``, ``xvocab``, or ``none`` (the next
        token only)."""
        raise NotImplementedError

    def per_position(self, hidden_C_H: torch.Tensor, lm_head: Head,
                     t: TeacherTargets) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss_C, divergence_C)`` for one chunk: the term to minimise and the figure
        reported as the divergence (the same tensor for an exact divergence; the detached
        KL estimate for the sampled-token estimator). ``lm_head`` turns ``hidden_C_H``
        into the chunk's logits inside the checkpoint (a variant that has the logits
        already passes them with :func:`given_logits` as the head)."""
        raise NotImplementedError

    def chunks(self, n: int) -> list[tuple[int, int]]:
        """``[(start, end)]`` of the chunks: ``loss.chunk_size`` positions each."""
        size = self.settings.chunk_size
        return [(lo, min(lo + size, n)) for lo in range(0, n, size)]

    def step_inputs(self, trajs: list[Trajectory],
                    positions: list[np.ndarray]) -> list[dict[str, np.ndarray]] | None:
        """Per trajectory, the inputs this objective reads that are not the teacher's,
        built over the whole optimizer step (``variants.py``); None: it reads none."""
        return None

    def check(self, targets: TeacherTargets) -> None:
        """Every field this objective reads is present; else a one-line error naming the
        first missing one and what carries it (:func:`missing_field`)."""
        missing = [name for name in self.reads if getattr(targets, name) is None]
        if missing:
            raise missing_field(self.name, missing[0])

    def batch_loss(self, hidden_P_H: torch.Tensor, lm_head: Head, batch: Sequence[Scored],
                   inputs: list[dict[str, np.ndarray]] | None, *,
                   num_global_positions: int | None = None,
                   ) -> tuple[torch.Tensor, dict[str, float]]:
        """:meth:`loss` over a micro-batch of scored episodes: their targets of this
        objective's kind (:func:`targets_of`) with the step's ``inputs`` for them."""
        targets = targets_of(batch, self.kind, hidden_P_H.device)
        if inputs is not None:
            targets = targets.with_inputs(inputs, hidden_P_H.device)
        return self.loss(hidden_P_H, lm_head, targets, num_global_positions=num_global_positions)

    def loss(self, hidden_P_H: torch.Tensor, lm_head: Head, targets: TeacherTargets, *,
             num_global_positions: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective over ``P`` selected positions (``hidden_P_H``: the student's final
        hidden states there; ``targets`` in the same order), chunk by chunk, each chunk's
        ``[C, V]`` logits under ``torch.utils.checkpoint``; the sum divided by
        ``num_global_positions``, the positions of the whole optimizer step (default
        ``P``), so micro-batches add up to one batch. ``(loss, metrics)``: ``divergence``
        (mean here), ``divergence_sum`` and ``positions`` (docs/losses.md, "Chunking and
        normalisation")."""
        self.check(targets)
        n = int(hidden_P_H.shape[0])
        if n == 0:
            return empty_loss(hidden_P_H, lm_head)
        return self.over_chunks(hidden_P_H, lm_head, targets, self.chunks(n),
                                num_global_positions)

    def over_chunks(self, hidden_P_H: torch.Tensor, lm_head: Head, targets: TeacherTargets,
                    chunks: list[tuple[int, int]], num_global_positions: int | None,
                    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The sum of :meth:`per_position` over ``chunks`` of the positions, divided by
        ``num_global_positions`` (default: these positions)."""
        n = int(hidden_P_H.shape[0])
        # Accumulate in at least fp32 (bf16 sums over thousands of positions drift), and
        # in fp64 when the caller computes in fp64.
        acc_dtype = torch.promote_types(hidden_P_H.dtype, torch.float32)
        loss_sum = hidden_P_H.new_zeros((), dtype=acc_dtype)
        div_sum = hidden_P_H.new_zeros((), dtype=acc_dtype)
        for lo, hi in chunks:
            t = targets.rows(lo, hi)
            if torch.is_grad_enabled():
                loss_C, div_C = checkpoint(self.per_position, hidden_P_H[lo:hi], lm_head, t,
                                           use_reentrant=False)
            else:
                loss_C, div_C = self.per_position(hidden_P_H[lo:hi], lm_head, t)
            loss_sum = loss_sum + loss_C.sum().to(acc_dtype)
            div_sum = div_sum + div_C.detach().sum().to(acc_dtype)
        denom = max(1, n if num_global_positions is None else num_global_positions)
        metrics = {"divergence": float(div_sum) / n, "divergence_sum": float(div_sum),
                   "positions": float(n)}
        return loss_sum / denom, metrics


def empty_loss(hidden_P_H: torch.Tensor, lm_head: Head) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of a micro-batch that selected nothing: still run the head on the empty
    batch, so every parameter gets a (zero) gradient and backward() works."""
    zero = lm_head(hidden_P_H).sum() * 0.0
    return zero, {"divergence": 0.0, "divergence_sum": 0.0, "positions": 0.0}


def given_logits(logits_C_V: torch.Tensor) -> torch.Tensor:
    """The head of logits already computed: a variant passes its chunk's logits to the
    base objective's :meth:`~Objective.per_position` with this as ``lm_head``."""
    return logits_C_V


@dataclass(frozen=True)
class FullDivergence(Objective):
    """``loss.divergence`` between the teacher's and the student's distributions, in the
    form ``loss.objective`` names; it is both the loss and the figure, and its name is
    those two values."""

    settings: LossConfig

    @property
    def name(self) -> str:
        return f"{self.settings.objective} {self.settings.divergence}"


@dataclass(frozen=True)
class ExactFullVocab(FullDivergence):
    """The exact full-vocabulary divergence against teacher log-probs ``[P, V]``."""

    reads: ClassVar[tuple[str, ...]] = ("logprobs_P_V",)
    kind: ClassVar[str] = "exact"

    def per_position(self, hidden_C_H, lm_head, t):
        s = self.settings
        div_C = exact_divergence_P(lm_head(hidden_C_H), t.logprobs_P_V, divergence=s.divergence,
                                   jsd_beta=s.jsd_beta, temperature=s.temperature)
        return div_C, div_C


@dataclass(frozen=True)
class BucketedTopkTail(FullDivergence):
    """The divergence between the ``K + 1``-bucket distributions of the teacher's top-k
    and a tail bucket."""

    reads: ClassVar[tuple[str, ...]] = ("topk_ids_P_K", "topk_logprobs_P_K", "tail_logmass_P")
    kind: ClassVar[str] = "topk"

    def per_position(self, hidden_C_H, lm_head, t):
        s = self.settings
        div_C = bucketed_topk_tail_divergence_P(
            lm_head(hidden_C_H), t.topk_ids_P_K, t.topk_logprobs_P_K, t.tail_logmass_P,
            divergence=s.divergence, jsd_beta=s.jsd_beta, temperature=s.temperature,
            tail_epsilon=s.tail_epsilon,
        )
        return div_C, div_C


@dataclass(frozen=True)
class SampledToken(Objective):
    """The sampled-token reverse-KL estimator: the policy-gradient loss and the detached
    KL estimate ``log S(y) - log T(y)`` as the figure. It reads only the teacher's
    log-prob of the sampled token, which both target kinds carry (it asks for the kind
    ``loss.objective`` names, :func:`request_kind`)."""

    settings: LossConfig
    name: ClassVar[str] = "sampled_token reverse_kl"
    reads: ClassVar[tuple[str, ...]] = ("sampled_ids_P", "target_logprobs_P")

    @property
    def kind(self) -> str:
        return request_kind(self.settings)

    def per_position(self, hidden_C_H, lm_head, t):
        return sampled_token_reverse_kl_P(lm_head(hidden_C_H), t.sampled_ids_P,
                                          t.target_logprobs_P, temperature=self.settings.temperature)


@dataclass(frozen=True)
class CrossEntropy(Objective):
    """SFT: ``-log S(next token)``, always at temperature 1 (``loss.temperature`` tempers
    the distillation targets, not the data); of the ``loss`` section it reads
    ``chunk_size`` only."""

    settings: LossConfig
    name: ClassVar[str] = "sft"
    reads: ClassVar[tuple[str, ...]] = ("sampled_ids_P",)
    kind: ClassVar[str] = "none"

    def per_position(self, hidden_C_H, lm_head, t):
        nll_C = cross_entropy_P(lm_head(hidden_C_H), t.sampled_ids_P)
        return nll_C, nll_C


def request_kind(settings: LossConfig) -> str:
    """The targets to ask the teacher for: ``exact`` log-probs ``[P, V]`` for
    ``exact_full_vocab``, else ``topk`` (the sampled-token estimator reads the target
    log-prob both kinds carry, so it follows ``loss.objective`` as well)."""
    return "exact" if settings.objective == "exact_full_vocab" else "topk"


# The table the recipe picks from: (estimator, objective, divergence) -> the objective,
# built from the recipe's ``loss`` section.
OBJECTIVES: dict[tuple[str, str, str], Callable[[LossConfig], Objective]] = {
    **{("full", "exact_full_vocab", d): ExactFullVocab for d in DIVERGENCES},
    **{("full", "bucketed_topk_tail", d): BucketedTopkTail for d in DIVERGENCES},
    **{("sampled_token", target, "reverse_kl"): SampledToken for target in TARGETS},
}
