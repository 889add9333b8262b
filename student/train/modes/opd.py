"""Mode ``opd``: strict on-policy distillation.

One cycle: sample fresh rollouts with version ``v``, request targets tagged ``v``
(pipelined: each episode's SCORE leaves as soon as it ends), take exactly one optimizer
step, ``v -> v + 1``. The client drops any reply not for ``v`` or not from the teacher
the update is bound to; nothing stale reaches the loss. With pipelining and a resident
teacher, the update's first forward runs while the teacher scores the last episodes
(the :class:`~miniverl.student.train.steps.ScoredBatch` carries it to the update).

This module keeps no state between cycles and does not log or checkpoint (``loop.py``);
the steps it runs are shared with the other distillation modes (``steps.py``).
"""

from __future__ import annotations

from miniverl.student.train.state import CycleResult, TrainState
from miniverl.student.train.steps import rollout_and_score, train_on


class OpdMode:
    """Strict on-policy distillation: nothing carries over from one cycle to the next."""

    def prepare(self, state: TrainState) -> None:
        """Nothing to prepare: every cycle samples its own batch."""

    def resume(self, state: TrainState) -> None:
        """Nothing to rebuild: the checkpoint holds everything a cycle reads."""

    def cycle(self, state: TrainState) -> CycleResult:
        """One strict on-policy cycle: fresh rollouts of version v, scored for v, one step."""
        batch = rollout_and_score(state, lag=0)
        return train_on(state, batch, batch.scored, lag=0)
