"""Mode ``offline_kd``: distillation on a fixed trajectory set, scored once.

The set (``train.fixed_set``) is a previous run's ``trajectories.jsonl``
(``train.trajectories``), the oracle traces of the training tasks (``oracle``, the
default), the teacher's own episodes of them (``teacher``, ``fixed_sets.py``), or
frozen student states (``student``): the episodes the starting policy
samples, once, before the first update, on exactly the tasks and episode seeds that
strict OPD would sample over the run's ``train.cycles`` (``cycles x rollouts_per_cycle``
episodes; scored while they are sampled when ``train.pipelining`` is on). The oracle
set holds the traces of the training tasks that have one (``train.oracle_tasks``, the
first N; all when null). Each trajectory's targets are requested once, bound to the
version that sampled the set (0 for oracle traces), cached, and reused by every
version; a resume finds them in the cache (and the frozen student set in
``trajectories.jsonl``). Off-policy by construction, and reported as such.

Each update draws ``rollouts_per_cycle`` trajectories: a seeded draw from the set
(``state.fixed_draw``; with ``train.on_policy_fraction`` part of the batch is sampled
fresh instead, "GKD-style mixing" below, :meth:`OfflineKdMode.mixed_cycle`), or,
for frozen student states, cycle ``c``'s own episodes, so update ``c`` sees the tasks
OPD's update ``c`` sees, sampled by the starting policy instead of the current one.

The whole set is scored before the first update, unless ``train.score_fixed_set`` is
``drawn`` (oracle, teacher and ``train.trajectories`` sets): then an update scores the
drawn trajectories the run has not scored yet and the targets cache does not hold
(:class:`LazyScoredSet`), so an arm pays only for the episodes it trains on, and a
cache shared across runs (``cache.dir``) makes a set scored by one seed free for the
next. With ``run.deterministic`` every SCORE is one forward pass of its own, so the
targets, and what training computes, are the same either way. The frozen student set
is always sampled and scored first: every one of its episodes is trained on. The set's
sampling and up-front scoring time is in the ``offline_targets_scored`` event; a
``drawn`` update's scoring time is in its metrics row (``time_teacher_wait_s``). The
set is this mode's own state (:class:`OfflineKdMode`).

This module does not log or checkpoint; the update is the step the distillation modes
share (``steps.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe, on_policy_episodes
from miniverl.common.trajectory import (
    Trajectory,
    read_trajectories,
    select_positions_for,
    write_trajectories,
)
from miniverl.student.rollout.oracle import oracle_trajectories
from miniverl.student.targets_cache import TargetsCache
from miniverl.student.train import updates
from miniverl.student.train.cached_targets import latest_for_teacher, put_scored
from miniverl.student.train.fixed_sets import drawn_positions, teacher_set
from miniverl.student.train.optim import planned_cycles
from miniverl.student.train.state import (
    CycleResult,
    TrainState,
    episode_seed,
    fixed_draw,
    group_size,
)
from miniverl.student.train.steps import collect, sample
from miniverl.student.train.teacher.link import Scored, TeacherSide


@dataclass
class LazyScoredSet:
    """A fixed set scored as it is drawn: each trajectory's targets are requested the
    first time a batch holds it (bound to the set's version), unless the targets cache
    already holds them, and kept for the rest of the run."""

    trajs: list[Trajectory | None]  # by position; None where no draw of the run falls
    version: int
    scored: dict[str, Scored] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.trajs)

    def draw(self, cycle: int, count: int, *, teacher: TeacherSide, cache: TargetsCache | None,
             recipe: Recipe) -> tuple[list[Scored], list[Scored], float]:
        """``count`` trajectories drawn for ``cycle`` (``state.fixed_draw``) with their
        targets (from ``cache``, else scored by ``teacher`` now); those scored now; and
        the seconds spent waiting for the teacher."""
        drawn = fixed_draw(recipe, self.trajs, cycle, count)
        picked = [t for t in drawn if t is not None]
        if len(picked) != len(drawn):
            raise RuntimeError(f"cycle {cycle} drew a fixed-set position the run did not "
                               "plan to draw; the set was built for other cycles")
        missing = [t for t in picked if t.id not in self.scored]
        if missing:
            self.scored.update(latest_for_teacher(cache, recipe, teacher.identity, missing))
        fresh = [t for t in missing if t.id not in self.scored]
        if not fresh:
            return [self.scored[t.id] for t in picked], [], 0.0
        link = teacher.link
        link.begin_update(self.version, 0)
        for traj in fresh:
            link.submit(traj, select_positions_for(traj, recipe.loss, seed=recipe.run.seed))
        replies = link.collect()
        put_scored(cache, replies)
        self.scored.update((s.traj.id, s) for s in replies)
        return [self.scored[t.id] for t in picked], replies, link.wait_s


@dataclass
class OfflineKdMode:
    """Offline KD's fixed set: scored once before the first update (:meth:`prepare`)
    or as it is drawn (a :class:`LazyScoredSet`)."""

    fixed: list[Scored] | LazyScoredSet = field(default_factory=list)

    def prepare(self, state: TrainState) -> None:
        """Load or build the fixed set and score it (or find it cached, or leave it to
        be scored as drawn), once per run."""
        if not self.fixed:
            self.fixed = prepare_fixed_set(state)

    def resume(self, state: TrainState) -> None:
        """Nothing to rebuild here: :meth:`prepare` finds a resumed run's set recorded."""

    def cycle(self, state: TrainState) -> CycleResult:
        """One update on a seeded draw from the fixed set (with
        ``train.on_policy_fraction``, part of the batch fresh: "GKD-style mixing" below)."""
        recipe, train = state.recipe, state.recipe.train
        if train.on_policy_fraction is not None:
            return self.mixed_cycle(state, train.on_policy_fraction)
        scored, replies, t_wait = fixed_batch(self.fixed, state.cycle, teacher=state.teacher,
                                              cache=state.cache, recipe=recipe)
        t1 = time.perf_counter()
        stats = updates.distill_step(
            state.policy, state.optimizer, state.scheduler, scored,
            objective=state.objective, train=train,
        )
        state.advance()
        # The row's positions_scored are what the teacher scored for this cycle.
        return CycleResult(stats, [s.traj for s in scored], 0.0, t_wait,
                           time.perf_counter() - t1, scored=replies or None)

    def mixed_cycle(self, state: TrainState, on_policy_fraction: float) -> CycleResult:
        """The cycle with ``train.on_policy_fraction`` (GKD-style mixing, below): fresh
        episodes of version v (scored for v) and a fixed-set draw (a lazy set scores its
        first draws here, before the fresh part binds version v), one optimizer step on
        both."""
        recipe, train, fixed = state.recipe, state.recipe.train, self.fixed
        fresh_n, fixed_n = split(train.rollouts_per_cycle, on_policy_fraction)
        fixed_scored: list[Scored] = []
        if isinstance(fixed, list):
            drawn, t_fixed = fixed_draw(recipe, fixed, state.cycle, fixed_n), 0.0
        else:
            drawn, fixed_scored, t_fixed = fixed.draw(state.cycle, fixed_n, teacher=state.teacher,
                                                      cache=state.cache, recipe=recipe)
        trajs: list[Trajectory] = []
        fresh: list[Scored] = []
        t_rollout, t_wait = 0.0, 0.0
        if fresh_n:
            # The first fresh_n episodes strict OPD would sample in this cycle.
            tasks, seeds = state.tasks.episodes(state.cycle, fresh_n, group_size(recipe))
            sampled = sample(state.runner, state.teacher, tasks, seeds, version=state.version,
                             lag=0, pipelined=train.pipelining, loss=recipe.loss,
                             seed=recipe.run.seed)
            fresh, t_wait = collect(state.teacher, state.run, state.cache, sampled.trajs)
            trajs, t_rollout = sampled.trajs, sampled.t_rollout
        t_wait += t_fixed
        t1 = time.perf_counter()
        stats = updates.distill_step(
            state.policy, state.optimizer, state.scheduler, [*fresh, *drawn],
            objective=state.objective, train=train,
        )
        state.advance()
        # The row's train_success is the fresh episodes' (the fixed set's are not the
        # policy's), and its positions_scored what the teacher scored in this cycle.
        return CycleResult(
            stats, trajs or [s.traj for s in drawn], t_rollout, t_wait,
            time.perf_counter() - t1, scored=[*fresh, *fixed_scored],
            extra={"on_policy_episodes": len(fresh), "fixed_set_episodes": len(drawn)},
        )


def prepare_fixed_set(state: TrainState) -> list[Scored] | LazyScoredSet:
    """Load or build the fixed trajectories and score each once (or find it cached);
    with ``train.score_fixed_set: drawn`` (not the frozen student set), the set ready to
    be scored as it is drawn."""
    recipe, policy = state.recipe, state.policy
    source = recipe.train.trajectories
    if recipe.train.fixed_set == "student":
        return _prepare_student_set(state)
    if recipe.train.fixed_set == "teacher":
        # The teacher's own episodes (fixed_sets.py), bound to version 0 like oracle
        # traces; their playing time is the set's sampling time.
        if recipe.train.score_fixed_set == "drawn":
            # Only the tasks the planned draws hold are played, each at its position.
            size, train = len(state.tasks.all), recipe.train
            count = (split(train.rollouts_per_cycle, train.on_policy_fraction)[1]
                     if train.on_policy_fraction is not None else train.rollouts_per_cycle)
            played, t_play, recorded = teacher_set(
                state, needed=drawn_positions(state, size, count))
            where = {task.id: i for i, task in enumerate(state.tasks.all)}
            slots: list[Trajectory | None] = [None] * size
            for traj in played:
                slots[where[traj.task_id]] = traj
            return _lazy_set(state, played, source="teacher", t_sample=t_play,
                             recorded=recorded, slots=slots)
        played, t_play, recorded = teacher_set(state)
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
            env.name, state.tasks.oracle(recipe.train.oracle_tasks), policy.tokenizer,
            policy.tokenizer_fp, env.params,
        )
    t_build = time.perf_counter() - t0
    # The fixed set was sampled by another policy; its targets are bound to the
    # version that sampled it (0 for oracle traces), never to the student's.
    name = "trajectories" if source else "oracle"
    if recipe.train.score_fixed_set == "drawn":
        return _lazy_set(state, fixed_set, source=name, t_sample=t_build,
                         recorded=state.step > 0)
    return _score_uncached(state, fixed_set, 0, source=name, t_sample=t_build)


def _lazy_set(state: TrainState, fixed_set: list[Trajectory], *, source: str,
              t_sample: float, recorded: bool,
              slots: list[Trajectory | None] | None = None) -> LazyScoredSet:
    """The set, recorded (unless a resume or the teacher set's reading found it so) and
    announced; scored as it is drawn (``slots``: the set by position, where only some
    positions were built)."""
    if not recorded:
        write_trajectories(state.run.trajectories_path, fixed_set, append=True)
    slots = list(fixed_set) if slots is None else slots
    state.run.event("offline_targets_scored", source=source, trajectories=0,
                    set_size=len(fixed_set), drawn_from=len(slots), lazy=True,
                    reused_from_cache=0, positions=0, time_sample_s=t_sample,
                    time_teacher_wait_s=0.0, bytes_sent=0, bytes_received=0)
    return LazyScoredSet(slots, 0)


def _score_uncached(state: TrainState, fixed_set: list[Trajectory], version: int, *,
                    source: str, t_sample: float) -> list[Scored]:
    """Score, bound to ``version``, the trajectories the targets cache does not hold."""
    reused = latest_for_teacher(state.cache, state.recipe, state.teacher.identity, fixed_set)
    link = state.teacher.link
    link.begin_update(version, 0)
    for traj in fixed_set:
        if traj.id not in reused:
            link.submit(traj, select_positions_for(traj, state.recipe.loss,
                                                   seed=state.recipe.run.seed))
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
    tasks = [task for c in range(cycles) for task in state.tasks.of_cycle(c, n)]
    seeds = [episode_seed(recipe.run.seed, c, i) for c in range(cycles) for i in range(n)]
    # The targets are bound to the version that samples the set: the starting one.
    fixed_set = sample(state.runner, state.teacher, tasks, seeds, version=state.version, lag=0,
                       pipelined=recipe.train.pipelining, loss=recipe.loss,
                       seed=recipe.run.seed).trajs
    t_sample = time.perf_counter() - t0
    return _finish(state, fixed_set, link.collect(), {}, source="student", t_sample=t_sample)


def _recorded_set(state: TrainState) -> list[Trajectory]:
    path = state.run.trajectories_path
    if state.step == 0 or not path.is_file():
        return []
    return [t for t in read_trajectories(path) if t.source == "rollout"]


def _finish(state: TrainState, fixed_set: list[Trajectory], scored: list[Scored],
            reused: dict[str, Scored], *, source: str, t_sample: float) -> list[Scored]:
    """Cache the fresh targets, record the set, say what it cost; the set in order."""
    fresh = {s.traj.id: s for s in scored}
    put_scored(state.cache, scored)
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


def fixed_batch(fixed: list[Scored] | LazyScoredSet, cycle: int, *, teacher: TeacherSide,
                cache: TargetsCache | None, recipe: Recipe,
                ) -> tuple[list[Scored], list[Scored], float]:
    """Cycle ``cycle``'s batch from the fixed set with its targets; those the teacher
    scored for this cycle (a lazy set's first draws); the seconds it waited for them."""
    n = recipe.train.rollouts_per_cycle
    if isinstance(fixed, LazyScoredSet):
        return fixed.draw(cycle, n, teacher=teacher, cache=cache, recipe=recipe)
    if recipe.train.fixed_set == "student":
        # Cycle c trains on the episodes sampled for cycle c (OPD's tasks and seeds).
        start = (cycle * n) % len(fixed)
        return fixed[start:start + n], [], 0.0
    return fixed_draw(recipe, fixed, cycle, n), [], 0.0


# -- GKD-style mixing ------------------------------------------------------------------
# GKD-style mixing (``train.on_policy_fraction``, GKD's lambda, Agarwal et al. 2024):
# part of each offline KD batch is sampled fresh by the current policy, the rest drawn
# from the fixed set, and one distillation update trains on both.
#
# The split of a batch of ``n = train.rollouts_per_cycle`` episodes is fixed, not drawn:
# ``m = floor(fraction * n + 1/2)`` fresh episodes (:func:`split`), the first ``m``
# episodes strict OPD would sample in this cycle (its tasks and episode seeds, played by
# version ``v`` and scored for ``v``), and ``n - m`` episodes of the scored fixed set
# (:func:`~miniverl.student.train.state.fixed_draw`, seeded by the run seed and the
# cycle). Fraction 0 is offline KD's batch exactly, fraction 1 OPD's (the recipe sends
# that to ``run.mode: opd``); 0.5 of 8 is 4 fresh and 4 fixed. Both parts go through the
# loss the recipe names (``loss.divergence``, ``loss.jsd_beta``), normalised by the
# positions of the whole batch. The fixed part's targets are bound to the version that
# sampled the set, so the step is labelled off-policy; each metrics row says how many
# episodes of each kind it trained on.


def split(n: int, fraction: float) -> tuple[int, int]:
    """``(fresh, fixed)`` episodes of a batch of ``n`` at ``on_policy_fraction``."""
    fresh = on_policy_episodes(n, fraction)
    return fresh, n - fresh


