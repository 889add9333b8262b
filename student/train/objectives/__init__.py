"""The training objectives, in one place: what each reads, its per-position function,
the chunking, and the table the recipe picks from.

- ``per_position.py``: the pure formulas (exact and top-k + tail forward/reverse KL and
  JSD, the sampled-token reverse-KL estimator, cross-entropy), ``[P]`` tensors.
- ``objective.py``: :class:`Objective` (the fields it reads, its per-position function,
  its chunked evaluation), the records it reads (:class:`TeacherTargets`,
  :class:`LossSettings`) and :func:`chunked_loss`.
- ``table.py``: :data:`OBJECTIVES`, keyed by the recipe's ``(loss.estimator,
  loss.objective, loss.divergence)``, :data:`SFT`, and the two calls the update step
  makes (:func:`distillation_loss`, :func:`sft_loss`).
- ``variants.py``, ``sampled_token.py``, ``step_inputs.py``: the standard variants a
  recipe's ``loss`` section may add to the table's objective (the sampled-token
  estimator's importance ratio and log-ratio clamp, per-sequence aggregation, the task
  reward; docs/losses.md): the wrapper, its formulas, and the per-step inputs that are
  not the teacher's.
- ``group_sampled_token.py``, ``group_uld.py``: the objectives of a teacher with another
  tokenizer (``xvocab`` targets over byte groups, ``loss.cross_vocab``;
  docs/cross-tokenizer.md): the group sampled-token estimator, and ULD and the hybrid
  with exact matching.

This package does not select positions (``common/trajectory.py``), micro-batch or step
an optimizer (``student/train/updates.py``).
"""

from miniverl.student.train.objectives.objective import (
    LossSettings,
    Objective,
    TeacherTargets,
    chunked_loss,
)
from miniverl.student.train.objectives.per_position import (
    DIVERGENCES,
    bucketed_topk_tail_distributions,
    bucketed_topk_tail_divergence_P,
    cross_entropy_P,
    exact_divergence_P,
    exact_forward_kl_P,
    exact_jsd_P,
    exact_reverse_kl_P,
    log1mexp,
    sampled_token_reverse_kl_P,
)
from miniverl.student.train.objectives.table import (
    ESTIMATORS,
    OBJECTIVES,
    SFT,
    TARGETS,
    distillation_loss,
    objective_for,
    request_kind,
    sft_loss,
)

__all__ = [
    "DIVERGENCES",
    "ESTIMATORS",
    "OBJECTIVES",
    "SFT",
    "TARGETS",
    "LossSettings",
    "Objective",
    "TeacherTargets",
    "bucketed_topk_tail_distributions",
    "bucketed_topk_tail_divergence_P",
    "chunked_loss",
    "cross_entropy_P",
    "distillation_loss",
    "exact_divergence_P",
    "exact_forward_kl_P",
    "exact_jsd_P",
    "exact_reverse_kl_P",
    "log1mexp",
    "objective_for",
    "request_kind",
    "sampled_token_reverse_kl_P",
    "sft_loss",
]
