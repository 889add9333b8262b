"""GKD-style mixing (``train.on_policy_fraction``, GKD's lambda, Agarwal et al. 2024):
part of each offline KD batch is sampled fresh by the current policy, the rest drawn
from the fixed set, and one distillation update trains on both.

The split of a batch of ``n = train.rollouts_per_cycle`` episodes is fixed, not drawn:
``m = floor(fraction * n + 1/2)`` fresh episodes (:func:`split`), the first ``m``
episodes strict OPD would sample in this cycle (its tasks and episode seeds, played by
version ``v`` and scored for ``v``), and ``n - m`` episodes of the scored fixed set
(:func:`~miniverl.student.train.batches.fixed_draw`, seeded by the run seed and the
cycle). Fraction 0 is offline KD's batch exactly, fraction 1 OPD's (the recipe sends
that to ``run.mode: opd``); 0.5 of 8 is 4 fresh and 4 fixed. Both parts go through the
loss the recipe names (``loss.divergence``, ``loss.jsd_beta``), normalised by the
positions of the whole batch. The fixed part's targets are bound to the version that
sampled the set, so the step is labelled off-policy; each metrics row says how many
episodes of each kind it trained on.

This module does not prepare or score the fixed set (``modes/offline_kd.py``) and
does not log.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from miniverl.common.recipe import on_policy_episodes
from miniverl.student.train.batches import fixed_draw
from miniverl.student.train.state import CycleResult, TrainState
from miniverl.student.train.steps import distill_update, rollout_and_score
from miniverl.student.train.teacher_link import Scored

if TYPE_CHECKING:
    from miniverl.student.train.modes.offline_kd import LazyScoredSet


def split(n: int, fraction: float) -> tuple[int, int]:
    """``(fresh, fixed)`` episodes of a batch of ``n`` at ``on_policy_fraction``."""
    fresh = on_policy_episodes(n, fraction)
    return fresh, n - fresh


def mixed_cycle(state: TrainState, fixed: list[Scored] | LazyScoredSet) -> CycleResult:
    """One GKD cycle: fresh episodes of version v (scored for v) and a fixed-set draw
    (a lazy set scores its first draws here, before the fresh part binds version v),
    one optimizer step on both."""
    recipe = state.recipe
    fresh_n, fixed_n = split(recipe.train.rollouts_per_cycle, recipe.train.on_policy_fraction)
    if isinstance(fixed, list):
        drawn, fixed_scored, t_fixed = fixed_draw(recipe, fixed, state.cycle, fixed_n), [], 0.0
    else:
        drawn, fixed_scored, t_fixed = fixed.draw(state, state.cycle, fixed_n)
    trajs, fresh, t_rollout, t_wait = [], [], 0.0, 0.0
    if fresh_n:
        batch = rollout_and_score(state, lag=0, count=fresh_n)
        trajs, fresh, t_rollout, t_wait = batch.trajs, batch.scored, batch.t_rollout, batch.t_wait
    t_wait += t_fixed
    t1 = time.perf_counter()
    stats = distill_update(state, [*fresh, *drawn])
    # The row's train_success is the fresh episodes' (the fixed set's are not the
    # policy's), and its positions_scored what the teacher scored in this cycle.
    return CycleResult(
        stats, trajs or [s.traj for s in drawn], t_rollout, t_wait,
        time.perf_counter() - t1, scored=[*fresh, *fixed_scored],
        extra={"on_policy_episodes": len(fresh), "fixed_set_episodes": len(drawn)},
    )
