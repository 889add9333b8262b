"""Mode ``replay``: explicitly labelled off-policy distillation from a bounded buffer.

Fresh rollouts (scored for the version that sampled them) join a buffer; each update
trains on buffered rollouts at most ``train.max_lag`` versions old, re-checked per
update because each update advances the version. A seeded draw picks the batch, so a
resumed run draws what the uninterrupted one would have drawn.

This module does not sample or score (``opd.rollout_and_score``) and does not log.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from miniverl.common.trajectory import read_trajectories
from miniverl.protocol.pending import within_lag
from miniverl.student.train.cached_targets import scored_for_version
from miniverl.student.train.modes.opd import positions_of, rollout_and_score, train_on
from miniverl.student.train.state import CycleResult, TrainState, episode_seed
from miniverl.student.train.teacher_link import Scored, empty_arrays

# Salts the buffer draw's seed apart from the episodes' seeds of the same cycle.
DRAW_SALT = 99_991


def replay_cycle(state: TrainState) -> CycleResult:
    """Fresh rollouts into the buffer, then updates on a draw of young-enough entries."""
    lag = state.recipe.train.max_lag
    trajs, scored, t_rollout, t_wait = rollout_and_score(state, lag)
    state.replay_buffer.extend(scored)
    state.replay_buffer = [s for s in state.replay_buffer
                           if within_lag(state.version, s.student_version, lag)]
    rng = np.random.default_rng(episode_seed(state.recipe.run.seed, state.cycle, DRAW_SALT))
    n = min(len(state.replay_buffer), state.recipe.train.rollouts_per_cycle)
    pick = rng.choice(len(state.replay_buffer), size=n, replace=False)
    drawn = [state.replay_buffer[i] for i in sorted(pick)]
    return train_on(state, trajs, drawn, lag=lag, t_rollout=t_rollout, t_wait=t_wait)


def restore_buffer(state: TrainState) -> None:
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
        positions = positions_of(state, traj).astype(np.int32)
        if len(positions) == 0:
            arrays = empty_arrays(state.kind, state.recipe.loss.top_k)
            state.replay_buffer.append(Scored(traj, positions, arrays, traj.policy_version, {}))
            continue
        hit = scored_for_version(state.cache, traj)
        if hit is None:
            missing += 1
            continue
        state.replay_buffer.append(hit)
    state.run.event("replay_buffer_restored", trajectories=len(state.replay_buffer),
                    missing=missing, version=state.version)
