"""The teacher's own episodes as a fixed set (``train.fixed_set: teacher``).

In the arm's preparation (before its first cycle, after the SFT warm-up) the teacher
plays each training task the run will train on once (SeqKD: the tasks of its planned
cycles; offline KD: every task, or, with ``train.score_fixed_set: drawn``, those its
planned draws hold), in task order, with episode seeds drawn from the run seed and the
task's position (:func:`teacher_set`, :mod:`~miniverl.student.teacher_play`): its weights are
loaded in the student process, sample at the recipe's rollout settings, and are freed
again. In ``sft`` no teacher server holds a handshake, so the teacher's competence gate
(``teacher.min_success``, ``min_recovery``) is applied here, before it plays. The set is written to the run's ``trajectories.jsonl`` (``source: teacher``), so
a resumed run reads it back instead of playing it again. The ``teacher_set_played``
event records the episodes, the teacher's success on them and the seconds spent
loading and playing; that time is inside the run's wall clock (``wall_s``), so an arm
that needs the set pays for it. With a shared ``cache.dir`` the episodes another run
already played are read back (:mod:`~miniverl.student.teacher_episodes`); the event
counts them (``from_cache``) and holds the seconds they cost when they were played
(``time_charged_s``), which a wall-clock comparison adds to the arm's clock.

Two modes use it:

- ``sft`` (SeqKD, Kim and Rush 2016): cross-entropy on the teacher's episodes instead
  of the oracle traces; cycle ``c`` trains on the teacher's episodes of the tasks the
  oracle batch of cycle ``c`` would hold (:class:`TeacherBatches`).
- ``offline_kd``: the set is scored once by the teacher server, like the oracle set,
  and drawn from the same way (KD on teacher samples).

This module does not score, log metrics or checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miniverl.common.teacher_routes import environment_view, routes, teacher_of_environment
from miniverl.common.trajectory import Trajectory, read_trajectories, write_trajectories
from miniverl.student.teacher_play import TeacherEpisodes, play_as_teacher, success_rate
from miniverl.student.train.optim import planned_cycles
from miniverl.student.train.state import TrainState, TrainTasks, episode_seed, fixed_draw

# The teacher set's episode seeds come from this cycle number, far past any real cycle,
# so they never equal the seeds of the student's own episodes.
TEACHER_SET_CYCLE = 20_000_000


def recorded_teacher_set(path: Path) -> list[Trajectory]:
    """The teacher's episodes a run already recorded in ``trajectories.jsonl``, each
    once (a resume without a targets cache records the offline KD set again)."""
    if not Path(path).is_file():
        return []
    kept: dict[str, Trajectory] = {}
    for traj in read_trajectories(path):
        if traj.source == "teacher":
            kept.setdefault(traj.id, traj)
    return list(kept.values())


def teacher_set(state: TrainState,
                needed: list[int] | None = None) -> tuple[list[Trajectory], float, bool]:
    """``(set, seconds, recorded)``: one teacher episode per training task (only the
    tasks at the positions ``needed``, when given: the ones the run will train on), in
    task order; ``recorded`` when a resumed run found the set it had played. Task ``i``
    has the same episode seed either way, so a partial set is the whole one's episodes
    of those tasks."""
    t0 = time.perf_counter()
    recorded = recorded_teacher_set(state.run.trajectories_path)
    if recorded:
        seconds = time.perf_counter() - t0
        state.run.event("teacher_set_played", episodes=len(recorded), recorded=True,
                        success=success_rate(recorded), time_load_s=0.0, time_play_s=seconds)
        return recorded, seconds, True
    recipe = state.recipe
    tasks = state.tasks.all
    seeds = [episode_seed(recipe.run.seed, TEACHER_SET_CYCLE, i) for i in range(len(tasks))]
    if needed is not None:
        tasks, seeds = [tasks[i] for i in needed], [seeds[i] for i in needed]
    # SeqKD has no served teacher whose handshake applies teacher.min_success: gate here
    # (offline_kd's teacher server has passed it by now).
    played = play_set(state, tasks, seeds, gate=recipe.run.mode == "sft")
    state.run.event("teacher_set_played", episodes=len(played.trajectories), recorded=False,
                    success=played.success, time_load_s=played.time_load_s,
                    time_play_s=played.time_play_s, from_cache=played.from_cache,
                    time_charged_s=played.charged_s)
    return played.trajectories, time.perf_counter() - t0, False


def play_set(state: TrainState, tasks: list[Any], seeds: list[int], *,
             gate: bool) -> TeacherEpisodes:
    """The teacher's episodes of ``tasks``, in task order. A mixture's tasks are played
    environment by environment, each by its environment's teacher (its route's, with
    several teachers: SeqKD from several specialists, docs/several-teachers.md; a route
    to a named adapter plays with that adapter merged)."""
    recipe, policy = state.recipe, state.policy
    if state.tasks.mixture is None:
        return play_as_teacher(recipe, tasks, seeds, policy.tokenizer, policy.tokenizer_fp,
                               offline=state.offline, gate=gate)
    teacher_of = teacher_of_environment(recipe)
    adapter_of = {env: route.adapter for route in routes(recipe).values()
                  for env in route.environments}
    where: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        where.setdefault(state.tasks.mixture.environment_of[task.id], []).append(i)
    out: list[Trajectory | None] = [None] * len(tasks)
    total = TeacherEpisodes([], 0.0, 0.0)
    for env, positions in where.items():
        view = environment_view(recipe, env, teacher_of[env])
        part = play_as_teacher(view, [tasks[i] for i in positions], [seeds[i] for i in positions],
                               policy.tokenizer, policy.tokenizer_fp, offline=state.offline,
                               gate=gate, adapter=adapter_of.get(env))
        for i, traj in zip(positions, part.trajectories, strict=True):
            out[i] = traj
        total = TeacherEpisodes([], total.time_load_s + part.time_load_s,
                                total.time_play_s + part.time_play_s,
                                total.from_cache + part.from_cache,
                                total.charged_s + part.charged_s)
    total.trajectories = [traj for traj in out if traj is not None]  # every task played
    return total


def seqkd_positions(state: TrainState) -> list[int]:
    """The positions (in the training tasks) of every task SeqKD's planned cycles train
    on: the only ones whose teacher episode it needs."""
    n = state.recipe.train.rollouts_per_cycle
    where = {task.id: i for i, task in enumerate(state.tasks.all)}
    return sorted({where[task.id] for c in range(planned_cycles(state.recipe))
                   for task in state.tasks.of_cycle(c, n)})


def drawn_positions(state: TrainState, size: int, count: int) -> list[int]:
    """The positions of a fixed set of ``size`` that the planned cycles' draws of
    ``count`` (``state.fixed_draw``) hold."""
    everything = list(range(size))
    return sorted({i for c in range(planned_cycles(state.recipe))
                   for i in fixed_draw(state.recipe, everything, c, count)})


@dataclass
class TeacherBatches:
    """SeqKD's batches: the teacher's episode of each task an oracle batch would hold."""

    by_task: dict[str, Trajectory] = field(default_factory=dict)

    def prepare(self, state: TrainState) -> None:
        """Play (or read back) the teacher set, once per run, and record it."""
        if self.by_task:
            return
        trajs, _, recorded = teacher_set(state, needed=seqkd_positions(state))
        if not recorded:
            write_trajectories(state.run.trajectories_path, trajs, append=True)
        self.by_task = {t.task_id: t for t in trajs}

    def batch(self, cycle: int, *, tasks: TrainTasks, n: int) -> list[Trajectory]:
        """The teacher's episodes of ``cycle``'s ``n`` training tasks."""
        return [self.by_task[t.id] for t in tasks.of_cycle(cycle, n)]
