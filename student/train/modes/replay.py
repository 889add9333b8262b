"""Mode ``replay``: explicitly labelled off-policy distillation from a bounded buffer.

Fresh rollouts (scored for the version that sampled them) join a buffer; each update
trains on buffered rollouts at most ``train.max_lag`` versions old, re-checked per
update because each update advances the version. A seeded draw picks the batch, so a
resumed run draws what the uninterrupted one would have drawn. The buffer is this
mode's own state (:class:`ReplayMode`); a resume rebuilds it.

This module does not sample or score (``steps.sample``, ``steps.collect``) and does not
log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from miniverl.common.trajectory import read_trajectories, select_positions_for
from miniverl.protocol.pending import within_lag
from miniverl.student.train import updates
from miniverl.student.train.cached_targets import scored_for_version
from miniverl.student.train.state import CycleResult, TrainState, episode_seed, group_size
from miniverl.student.train.steps import collect, sample
from miniverl.student.train.teacher.link import Scored, empty_arrays
from miniverl.student.train.updates import StepStats

# Salts the buffer draw's seed apart from the episodes' seeds of the same cycle.
DRAW_SALT = 99_991


@dataclass
class ReplayMode:
    """Replay's buffer: scored rollouts at most ``train.max_lag`` versions old."""

    buffer: list[Scored] = field(default_factory=list)

    def prepare(self, state: TrainState) -> None:
        """Nothing to prepare: the buffer fills from the first cycle's rollouts."""

    def cycle(self, state: TrainState) -> CycleResult:
        """Fresh rollouts into the buffer, then updates on a draw of young-enough entries."""
        recipe, train = state.recipe, state.recipe.train
        lag = train.max_lag
        tasks, seeds = state.tasks.episodes(state.cycle, train.rollouts_per_cycle,
                                            group_size(recipe))
        fresh = sample(state.runner, state.teacher, tasks, seeds, version=state.version,
                       lag=lag, pipelined=train.pipelining, loss=recipe.loss,
                       seed=recipe.run.seed)
        fresh_scored, t_wait = collect(state.teacher, state.run, state.cache, fresh.trajs)
        self.buffer.extend(fresh_scored)
        self.buffer = [s for s in self.buffer if within_lag(state.version, s.student_version, lag)]
        rng = np.random.default_rng(episode_seed(state.recipe.run.seed, state.cycle, DRAW_SALT))
        n = min(len(self.buffer), train.rollouts_per_cycle)
        pick = rng.choice(len(self.buffer), size=n, replace=False)
        scored = [self.buffer[i] for i in sorted(pick)]
        t1 = time.perf_counter()
        stats: StepStats | None = None
        for _ in range(train.updates_per_batch):
            # Each update advances the version, so the lag is re-checked per update: a
            # target max_lag old at the first update is too old at the second.
            scored = [s for s in scored if within_lag(state.version, s.student_version, lag)]
            stats = updates.distill_step(
                state.policy, state.optimizer, state.scheduler, scored,
                objective=state.objective, train=train,
            )
            state.advance()
        assert stats is not None  # train.updates_per_batch is at least 1
        return CycleResult(stats, fresh.trajs, fresh.t_rollout, t_wait,
                           time.perf_counter() - t1, scored=scored)

    def resume(self, state: TrainState) -> None:
        """Rebuild the checkpointed buffer from trajectories.jsonl and the targets cache.

        Without it a resumed replay run would draw from an empty buffer and drift from
        the uninterrupted run. Rollouts younger than ``max_lag`` versions and older than
        the checkpoint are reloaded in the order they were sampled; their targets come
        from the targets cache (a rollout whose targets are missing is left out, counted).
        """
        path = state.run.trajectories_path
        if not Path(path).is_file():
            return
        lag = state.recipe.train.max_lag
        seen: set[str] = set()
        missing = 0
        for traj in read_trajectories(path):
            sampled_before = traj.policy_version < state.version
            if (not sampled_before or not within_lag(state.version, traj.policy_version, lag)
                    or traj.id in seen):
                continue
            seen.add(traj.id)
            positions = select_positions_for(traj, state.recipe.loss,
                                             seed=state.recipe.run.seed).astype(np.int32)
            if len(positions) == 0:
                arrays = empty_arrays(state.objective.kind, state.recipe.loss.top_k)
                self.buffer.append(Scored(traj, positions, arrays, traj.policy_version, {}))
                continue
            hit = scored_for_version(state.cache, traj)
            if hit is None:
                missing += 1
                continue
            self.buffer.append(hit)
        state.run.event("replay_buffer_restored", trajectories=len(self.buffer),
                        missing=missing, version=state.version)
