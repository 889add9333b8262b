"""The stages the sampling modes share: sample fresh episodes with each finished one sent
to the teacher (:func:`sample`), collect the teacher's targets and record both
(:func:`collect`), the positions a trajectory trains on (:func:`positions_of`), and the
two together for a mode that needs no stage between them (:func:`rollout_and_score`:
replay, GKD mixing). Strict OPD (``modes/opd.py``) calls :func:`sample` and
:func:`collect` itself, with its early forward between them.

Each stage returns what it produced; nothing is left on the
:class:`~miniverl.student.train.state.TrainState` for a later stage to find.

This module keeps no mode's state (``modes/``: replay's buffer, offline KD's fixed set),
takes no optimizer step (``updates.py``) and does not log (``loop.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from miniverl.common.trajectory import Trajectory, select_positions_for, write_trajectories
from miniverl.student.targets_entries import scored_entries
from miniverl.student.train.state import TrainState, cycle_episodes, group_size
from miniverl.student.train.teacher import park as park_teacher
from miniverl.student.train.teacher import wake as wake_teacher
from miniverl.student.train.teacher_link import Scored


def sample(state: TrainState, tasks: list[Any], seeds: list[int], *,
           lag: int) -> tuple[list[Trajectory], float]:
    """Play one episode per task with the current version, each sent to the teacher
    (scored for this version, accepted up to ``lag`` versions later) as soon as it ends
    (``train.pipelining``; else after the last); ``(trajectories in task order, seconds)``.

    With ``teacher.memory: swap`` the teacher is woken first (its weights back on the
    device before it scores; docs/up.md, "Memory strategies on one device")."""
    link = state.teacher.link
    if state.teacher.memory == "swap":
        wake_teacher(state)
    link.begin_update(state.version, lag)
    pipelined = state.recipe.train.pipelining

    def to_teacher(traj: Trajectory) -> None:
        link.submit(traj, positions_of(state, traj))

    t0 = time.perf_counter()
    with torch.no_grad():
        trajs = state.runner.run(tasks, policy_version=state.version, seeds=seeds,
                                 on_finished=to_teacher if pipelined else None)
    t_rollout = time.perf_counter() - t0
    if not pipelined:
        for traj in trajs:
            to_teacher(traj)
    return trajs, t_rollout


def collect(state: TrainState, trajs: list[Trajectory]) -> tuple[list[Scored], float]:
    """Wait for the targets of ``trajs`` (the client keeps only fresh replies); record the
    trajectories and their targets in the run directory; ``(scored in task order,
    seconds waited)``. With ``teacher.memory: swap`` the teacher is parked after, so the
    update runs with its weights off the device."""
    scored = state.teacher.link.collect()
    # Episodes finish (and are submitted) in any order; train in task order so a
    # pipelined update sums its loss exactly like a serial one and replay draws the
    # same rollouts from its buffer.
    rank = {id(traj): i for i, traj in enumerate(trajs)}
    scored.sort(key=lambda s: rank[id(s.traj)])
    if state.teacher.memory == "swap":
        park_teacher(state)
    write_trajectories(state.run.trajectories_path, trajs, append=True)
    if state.cache is not None:  # every target the run trains on, on record
        state.cache.put_many(scored_entries(scored))
    return scored, state.teacher.link.wait_s


@dataclass
class Fresh:
    """One cycle's fresh rollouts and their targets (task order), with the seconds each took."""

    trajs: list[Trajectory]
    scored: list[Scored]
    t_rollout: float
    t_wait: float


def rollout_and_score(state: TrainState, lag: int, count: int | None = None) -> Fresh:
    """The cycle's ``rollouts_per_cycle`` episodes (its first ``count``: the fresh part
    of a mixed batch), sampled and scored for the current version."""
    n = state.recipe.train.rollouts_per_cycle if count is None else count
    tasks, seeds = cycle_episodes(state, state.cycle, n, group_size(state.recipe))
    trajs, t_rollout = sample(state, tasks, seeds, lag=lag)
    scored, t_wait = collect(state, trajs)
    return Fresh(trajs, scored, t_rollout, t_wait)


def positions_of(state: TrainState, traj: Trajectory) -> np.ndarray:
    """The positions of ``traj`` the loss trains on (and the teacher scores)."""
    return select_positions_for(traj, state.recipe.loss, seed=state.recipe.run.seed)
