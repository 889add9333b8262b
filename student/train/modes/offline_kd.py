"""Mode ``offline_kd``: distillation on a fixed trajectory set, scored once.

The set (``train.fixed_set``) is a previous run's ``trajectories.jsonl``
(``train.trajectories``), the oracle traces of the training tasks (``oracle``, the
default), the teacher's own episodes of them (``teacher``, ``fixed_sets.py``), or
frozen student states (``student``): the episodes the starting policy
samples, once, before the first update, on exactly the tasks and episode seeds that
strict OPD would sample over the run's ``train.cycles`` (``cycles x rollouts_per_cycle``
episodes; scored while they are sampled when ``train.pipelining`` is on). Its targets
are requested once, bound to the version that sampled the set (0 for oracle traces),
cached, and reused by every version; a resume finds them in the cache (and the frozen
student set in ``trajectories.jsonl``). Off-policy by construction, and reported as such.

Each update draws ``rollouts_per_cycle`` trajectories: a seeded draw from the set
(``batches.fixed_draw``; with ``train.on_policy_fraction`` part of the batch is sampled
fresh instead, ``mixing.py``), or,
for frozen student states, cycle ``c``'s own episodes, so update ``c`` sees the tasks
OPD's update ``c`` sees, sampled by the starting policy instead of the current one. The
set's sampling and scoring time is in the ``offline_targets_scored`` event. The scored
set is this mode's own state (:class:`OfflineKdMode`).

This module does not log or checkpoint; the update is the step the distillation modes
share (``steps.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import Trajectory, read_trajectories, write_trajectories
from miniverl.student.rollout.oracle import oracle_trajectories
from miniverl.student.train.batches import fixed_draw
from miniverl.student.train.cached_targets import latest_for_teacher, put_scored
from miniverl.student.train.fixed_sets import teacher_set
from miniverl.student.train.mixing import mixed_cycle
from miniverl.student.train.optim import planned_cycles
from miniverl.student.train.state import CycleResult, TrainState, episode_seed, tasks_for
from miniverl.student.train.steps import distill_update, positions_of
from miniverl.student.train.teacher_link import Scored


@dataclass
class OfflineKdMode:
    """Offline KD's fixed set, scored once (:meth:`prepare`), in the set's order."""

    fixed: list[Scored] = field(default_factory=list)

    def prepare(self, state: TrainState) -> None:
        """Load or build the fixed set and score it (or find it cached), once per run."""
        if not self.fixed:
            self.fixed = prepare_fixed_set(state)

    def resume(self, state: TrainState) -> None:
        """Nothing to rebuild here: :meth:`prepare` finds a resumed run's set recorded."""

    def cycle(self, state: TrainState) -> CycleResult:
        """One update on a seeded draw from the scored fixed set (with
        ``train.on_policy_fraction``, part of the batch fresh: ``mixing.py``)."""
        if state.recipe.train.on_policy_fraction is not None:
            return mixed_cycle(state, self.fixed)
        scored = fixed_batch(state, self.fixed, state.cycle)
        t1 = time.perf_counter()
        stats = distill_update(state, scored)
        return CycleResult(stats, [s.traj for s in scored], 0.0, 0.0,
                           time.perf_counter() - t1)


def prepare_fixed_set(state: TrainState) -> list[Scored]:
    """Load or build the fixed trajectories and score each once (or find it cached);
    the scored set, in its order."""
    recipe, policy = state.recipe, state.policy
    source = recipe.train.trajectories
    if recipe.train.fixed_set == "student":
        return _prepare_student_set(state)
    if recipe.train.fixed_set == "teacher":
        # The teacher's own episodes (fixed_sets.py), bound to version 0 like oracle
        # traces; their playing time is the set's sampling time.
        played, t_play, _ = teacher_set(state)
        return _score_uncached(state, played, 0, source="teacher", t_sample=t_play)
    t0 = time.perf_counter()
    if source:
        fixed_set = read_trajectories(source)
        bad = [t.id for t in fixed_set if t.tokenizer_fp != policy.tokenizer_fp]
        if bad:
            raise ConfigError(
                f"{len(bad)} trajectories in {source} were made with another tokenizer "
                f"(first: {bad[0]}); offline KD needs the student's tokenizer"
            )
    else:
        env = recipe.environment
        fixed_set = oracle_trajectories(
            env.name, state.train_tasks, policy.tokenizer, policy.tokenizer_fp, env.params,
        )
    t_build = time.perf_counter() - t0
    # The fixed set was sampled by another policy; its targets are bound to the
    # version that sampled it (0 for oracle traces), never to the student's.
    return _score_uncached(state, fixed_set, 0, source="trajectories" if source else "oracle",
                           t_sample=t_build)


def _score_uncached(state: TrainState, fixed_set: list[Trajectory], version: int, *,
                    source: str, t_sample: float) -> list[Scored]:
    """Score, bound to ``version``, the trajectories the targets cache does not hold."""
    reused = latest_for_teacher(state.cache, state.recipe, state.teacher.identity, fixed_set)
    link = state.teacher.link
    link.begin_update(version, 0)
    for traj in fixed_set:
        if traj.id not in reused:
            link.submit(traj, positions_of(state, traj))
    return _finish(state, fixed_set, link.collect(), reused, source=source, t_sample=t_sample)


def _prepare_student_set(state: TrainState) -> list[Scored]:
    """Frozen student states: the starting policy samples every cycle's episodes once."""
    recipe = state.recipe
    n = recipe.train.rollouts_per_cycle
    link = state.teacher.link
    t0 = time.perf_counter()
    recorded = _recorded_set(state)
    if recorded:  # a resume: the set the run sampled, never one of the trained policy
        return _score_uncached(state, recorded, recorded[0].policy_version, source="student",
                               t_sample=time.perf_counter() - t0)
    cycles = planned_cycles(recipe)
    tasks = [task for c in range(cycles) for task in tasks_for(state, c, n)]
    seeds = [episode_seed(recipe.run.seed, c, i) for c in range(cycles) for i in range(n)]
    # The targets are bound to the version that samples the set: the starting one.
    link.begin_update(state.version, 0)
    pipelined = recipe.train.pipelining

    def submit(traj: Trajectory) -> None:
        link.submit(traj, positions_of(state, traj))

    fixed_set = state.runner.run(tasks, policy_version=state.version, seeds=seeds,
                                 on_finished=submit if pipelined else None)
    t_sample = time.perf_counter() - t0
    if not pipelined:
        for traj in fixed_set:
            submit(traj)
    return _finish(state, fixed_set, link.collect(), {}, source="student", t_sample=t_sample)


def _recorded_set(state: TrainState) -> list[Trajectory]:
    path = state.run.trajectories_path
    if state.step == 0 or not path.is_file():
        return []
    return [t for t in read_trajectories(path) if t.source == "rollout"]


def _finish(state: TrainState, fixed_set: list[Trajectory], scored: list[Scored],
            reused: dict[str, Scored], *, source: str, t_sample: float) -> list[Scored]:
    """Cache the fresh targets, record the set, say what it cost; the set in order."""
    recipe = state.recipe
    fresh = {s.traj.id: s for s in scored}
    put_scored(state.cache, recipe, scored)
    ordered = [reused.get(t.id) or fresh[t.id] for t in fixed_set]
    if not reused:  # a resume finds the fixed set already recorded
        write_trajectories(state.run.trajectories_path, fixed_set, append=True)
    counters = state.teacher.counters()
    state.run.event("offline_targets_scored", source=source, trajectories=len(scored),
                    reused_from_cache=len(reused),
                    positions=int(sum(len(s.positions_P) for s in scored)),
                    time_sample_s=t_sample, time_teacher_wait_s=state.teacher.link.wait_s,
                    bytes_sent=counters.get("bytes_sent", 0),
                    bytes_received=counters.get("bytes_received", 0))
    return ordered


def fixed_batch(state: TrainState, fixed: list[Scored], cycle: int) -> list[Scored]:
    """Cycle ``cycle``'s batch from the scored set ``fixed``."""
    if state.recipe.train.fixed_set == "student":
        # Cycle c trains on the episodes sampled for cycle c (OPD's tasks and seeds).
        n = state.recipe.train.rollouts_per_cycle
        start = (cycle * n) % len(fixed)
        return fixed[start:start + n]
    return fixed_draw(state.recipe, fixed, cycle, state.recipe.train.rollouts_per_cycle)
