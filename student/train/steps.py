"""The stages the sampling modes share: sample fresh episodes with each finished one sent
to the teacher (:func:`sample`), and collect the teacher's targets and record both
(:func:`collect`). Each takes the objects it uses (the runner, the teacher side, the
run directory, the settings it reads), never the run's whole state: the mode's cycle
unpacks that and calls them (strict OPD, ``modes/opd.py``, with its early forward
between them).

Each stage returns what it produced; nothing is left on an object for a later stage
to find.

This module keeps no mode's state (``modes/``: replay's buffer, offline KD's fixed set),
takes no optimizer step (``updates.py``) and does not log (``loop.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from miniverl.common.recipe_sections import LossConfig
from miniverl.common.rundir import RunDir
from miniverl.common.trajectory import Trajectory, select_positions_for, write_trajectories
from miniverl.student.rollout.runner import RolloutRunner
from miniverl.student.targets_cache import TargetsCache
from miniverl.student.targets_entries import scored_entries
from miniverl.student.train.teacher.link import Scored, TeacherSide


@dataclass
class Sampled:
    """One cycle's fresh episodes in task order, the positions each was sent to the
    teacher with (the positions the loss trains on), and the seconds sampling took."""

    trajs: list[Trajectory]
    positions: list[np.ndarray]
    t_rollout: float


def sample(runner: RolloutRunner, teacher: TeacherSide, tasks: list[Any], seeds: list[int], *,
           version: int, lag: int, pipelined: bool, loss: LossConfig, seed: int) -> Sampled:
    """Play one episode per task with ``version``, each sent to the teacher (scored for
    this version, accepted up to ``lag`` versions later) with its positions (``loss``'s
    rule, seeded by the run ``seed``) as soon as it ends (``pipelined``; else after the
    last).

    With ``teacher.memory: swap`` the teacher is woken first (its weights back on the
    device before it scores; docs/up.md, "Memory strategies on one device")."""
    link = teacher.link
    if teacher.memory == "swap":
        teacher.wake()
    link.begin_update(version, lag)
    positions: dict[int, np.ndarray] = {}

    def to_teacher(traj: Trajectory) -> None:
        positions[id(traj)] = select_positions_for(traj, loss, seed=seed)
        link.submit(traj, positions[id(traj)])

    t0 = time.perf_counter()
    with torch.no_grad():
        trajs = runner.run(tasks, policy_version=version, seeds=seeds,
                           on_finished=to_teacher if pipelined else None)
    t_rollout = time.perf_counter() - t0
    if not pipelined:
        for traj in trajs:
            to_teacher(traj)
    return Sampled(trajs, [positions[id(traj)] for traj in trajs], t_rollout)


def collect(teacher: TeacherSide, run: RunDir, cache: TargetsCache | None,
            trajs: list[Trajectory]) -> tuple[list[Scored], float]:
    """Wait for the targets of ``trajs`` (the client keeps only fresh replies); record the
    trajectories in ``run`` and their targets in ``cache``; ``(scored in task order,
    seconds waited)``. With ``teacher.memory: swap`` the teacher is parked after, so the
    update runs with its weights off the device."""
    scored = teacher.link.collect()
    # Episodes finish (and are submitted) in any order; train in task order so a
    # pipelined update sums its loss exactly like a serial one and replay draws the
    # same rollouts from its buffer.
    rank = {id(traj): i for i, traj in enumerate(trajs)}
    scored.sort(key=lambda s: rank[id(s.traj)])
    if teacher.memory == "swap":
        teacher.park()
    write_trajectories(run.trajectories_path, trajs, append=True)
    if cache is not None:  # every target the run trains on, on record
        cache.put_many(scored_entries(scored))
    return scored, teacher.link.wait_s
