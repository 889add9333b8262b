"""The steps the distillation modes share: sample and score a fresh batch
(:func:`rollout_and_score`), train on scored trajectories (:func:`train_on`,
:func:`distill_update`), and the positions a trajectory trains on (:func:`positions_of`).

Each step returns what it produced: :func:`rollout_and_score` a :class:`ScoredBatch`
(the rollouts, their targets in task order, the timings, and the first micro-batch's
forward when it ran early), which :func:`train_on` consumes. Nothing is left on the
:class:`~miniverl.student.train.state.TrainState` for a later step to find; the state
only advances (version, step).

This module keeps no mode's state (``modes/``: replay's buffer, offline KD's fixed set)
and does not log or checkpoint (``loop.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from miniverl.common.trajectory import Trajectory, select_positions_for, write_trajectories
from miniverl.protocol.pending import within_lag
from miniverl.student.train.batches import cycle_episodes, group_size
from miniverl.student.train.cached_targets import put_scored
from miniverl.student.train.state import CycleResult, TrainState
from miniverl.student.train.teacher import park as park_teacher
from miniverl.student.train.teacher import wake as wake_teacher
from miniverl.student.train.teacher_link import Scored
from miniverl.student.train.updates import (
    EarlyForward,
    StepStats,
    distill_step,
    early_forward,
    first_micro_batch,
)


@dataclass
class ScoredBatch:
    """One cycle's fresh rollouts and their targets, as :func:`rollout_and_score` made them.

    ``scored`` is in task order. ``early`` is the first micro-batch's forward, run with
    this version's weights while the teacher scored (pipelined strict OPD with a resident
    teacher; else None), and ``t_early`` the seconds it took, counted as update time.
    """

    trajs: list[Trajectory]
    scored: list[Scored]
    t_rollout: float
    t_wait: float
    early: EarlyForward | None = None
    t_early: float = 0.0


def rollout_and_score(state: TrainState, lag: int, count: int | None = None) -> ScoredBatch:
    """Sample fresh rollouts with the current version and score them for it: the
    cycle's ``rollouts_per_cycle`` episodes in groups of ``rollout.group_size``
    (``batches.py``), or its first ``count`` (part of a mixed batch, ``mixing.py``,
    whose update's first micro-batch is not these alone: no early forward)."""
    recipe = state.recipe
    n = recipe.train.rollouts_per_cycle if count is None else count
    tasks, seeds = cycle_episodes(state, state.cycle, n, group_size(recipe))
    side = state.teacher
    link = side.link
    if side.memory == "swap":
        wake_teacher(state)
    link.begin_update(state.version, lag)
    pipelined = recipe.train.pipelining

    def submit(traj: Trajectory) -> None:
        link.submit(traj, positions_of(state, traj))

    model = state.policy.model
    model.eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        trajs = state.runner.run(
            tasks, policy_version=state.version, seeds=seeds,
            on_finished=submit if pipelined else None,
        )
    model.train()
    t_rollout = time.perf_counter() - t0
    if not pipelined:
        for traj in trajs:
            submit(traj)
    early, t_early = None, 0.0
    if pipelined and lag == 0 and side.memory != "swap" and count is None:
        # The update's forward does not need the targets: run it while the teacher
        # scores the last episodes (swap keeps it after PARK, when memory is free).
        t1 = time.perf_counter()
        part = first_micro_batch(len(trajs), recipe.train.grad_accum)
        first = [trajs[i] for i in part]
        early = early_forward(
            state.policy, first, [positions_of(state, t) for t in first], state.autocast
        )
        t_early = time.perf_counter() - t1
    scored = link.collect()
    # Episodes finish (and are submitted) in any order; train in task order so a
    # pipelined update sums its loss exactly like a serial one and replay draws the
    # same rollouts from its buffer.
    rank = {id(traj): i for i, traj in enumerate(trajs)}
    scored.sort(key=lambda s: rank[id(s.traj)])
    if side.memory == "swap":
        # The update runs with the teacher's weights off the device (docs/design.md,
        # "The student loop": memory on one device).
        park_teacher(state)
    write_trajectories(state.run.trajectories_path, trajs, append=True)
    put_scored(state.cache, recipe, scored)
    return ScoredBatch(trajs, scored, t_rollout, link.wait_s, early, t_early)


def train_on(state: TrainState, batch: ScoredBatch, scored: list[Scored], *,
             lag: int) -> CycleResult:
    """``train.updates_per_batch`` distillation updates on ``scored`` (``batch.scored``
    for opd, a draw from the buffer for replay); the cycle's result reports ``batch``'s
    rollouts and timings."""
    t1 = time.perf_counter()
    stats = None
    early = batch.early
    for _ in range(state.recipe.train.updates_per_batch):
        # Each update advances the version, so replay re-checks the lag per update:
        # a target max_lag old at the first update is too old at the second.
        scored = [s for s in scored if within_lag(state.version, s.student_version, lag)]
        stats = distill_update(state, scored, early=early)
        early = None  # computed with this version's weights: one update only
    t_update = time.perf_counter() - t1 + batch.t_early
    return CycleResult(stats, batch.trajs, batch.t_rollout, batch.t_wait, t_update,
                       scored=scored)


def distill_update(state: TrainState, scored: list[Scored],
                   early: EarlyForward | None = None) -> StepStats:
    """One distillation optimizer step on ``scored``; the version advances."""
    train = state.recipe.train
    stats = distill_step(
        state.policy, state.optimizer, state.scheduler, scored,
        loss_config=state.recipe.loss, kind=state.kind, grad_accum=train.grad_accum,
        max_grad_norm=train.max_grad_norm, autocast=state.autocast, early=early,
    )
    state.advance()
    return stats


def positions_of(state: TrainState, traj: Trajectory) -> np.ndarray:
    """The positions of ``traj`` the loss trains on (and the teacher scores)."""
    return select_positions_for(traj, state.recipe.loss, seed=state.recipe.run.seed)
