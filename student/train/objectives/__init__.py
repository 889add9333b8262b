"""The training objectives, in two files: ``objective.py`` (each objective: what it reads,
the formula it calls by name, and the chunking) and ``formulas.py`` (the pure formulas,
``[P]`` tensors). Around them:

- ``table.py``: the recipe's pick from :data:`OBJECTIVES`, made once per run.
- ``variants.py``: the standard variants a recipe's ``loss`` section may add to the
  table's objective (the sampled-token estimator's importance ratio and log-ratio clamp,
  per-sequence aggregation, the task reward; docs/losses.md), and the per-step inputs
  they read that are not the teacher's.
- ``group_sampled_token.py``, ``group_uld.py``: the objectives of a teacher with another
  tokenizer (``xvocab`` targets over byte groups, ``loss.cross_vocab``;
  docs/cross-tokenizer.md).

This package does not select positions (``common/trajectory.py``), micro-batch or step
an optimizer (``student/train/updates.py``).
"""

from miniverl.student.train.objectives.formulas import (
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
from miniverl.student.train.objectives.objective import (
    OBJECTIVES,
    CrossEntropy,
    Objective,
    StepObjective,
    TeacherTargets,
    request_kind,
)
from miniverl.student.train.objectives.table import (
    objective_for,
    objective_for_kind,
)

__all__ = [
    "DIVERGENCES",
    "OBJECTIVES",
    "CrossEntropy",
    "Objective",
    "StepObjective",
    "TeacherTargets",
    "bucketed_topk_tail_distributions",
    "bucketed_topk_tail_divergence_P",
    "cross_entropy_P",
    "exact_divergence_P",
    "exact_forward_kl_P",
    "exact_jsd_P",
    "exact_reverse_kl_P",
    "log1mexp",
    "objective_for",
    "objective_for_kind",
    "request_kind",
    "sampled_token_reverse_kl_P",
]
