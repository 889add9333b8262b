"""Mode ``offline_kd``: distillation on a fixed trajectory set, scored once.

The set is a previous run's ``trajectories.jsonl`` (``train.trajectories``) or the
oracle traces of the training tasks. Its targets are requested once, bound to the
version that sampled the set (0 for oracle traces), cached, and reused by every
version; a resume finds them in the cache. Off-policy by construction, and reported
as such.

This module does not sample rollouts, log or checkpoint.
"""

from __future__ import annotations

import time

import numpy as np

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import read_trajectories, write_trajectories
from miniverl.student.rollout.oracle import oracle_trajectories
from miniverl.student.train.cached_targets import latest_for_teacher, put_scored
from miniverl.student.train.link import Scored
from miniverl.student.train.modes.opd import distill_update, positions_of
from miniverl.student.train.state import CycleResult, TrainState, episode_seed

# Salts the batch draw's seed apart from the episodes' seeds of the same cycle.
DRAW_SALT = 77_777


def offline_kd_cycle(state: TrainState) -> CycleResult:
    """One update on a seeded draw from the scored fixed set."""
    scored = fixed_batch(state, state.cycle)
    t1 = time.perf_counter()
    stats = distill_update(state, scored)
    return CycleResult(stats, [s.traj for s in scored], 0.0, 0.0, time.perf_counter() - t1)


def prepare_fixed_set(state: TrainState) -> None:
    """Load or build the fixed trajectories and score each once (or find it cached)."""
    recipe, policy = state.recipe, state.policy
    source = recipe.train.trajectories
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
    reused = latest_for_teacher(state.cache, recipe, state.teacher.identity, fixed_set)
    link = state.teacher.link
    # The fixed set was sampled by another policy; its targets are bound to the
    # version that sampled it (0 for oracle traces), never to the student's.
    link.begin_update(0, 0)
    for traj in fixed_set:
        if traj.id not in reused:
            link.submit(traj, positions_of(state, traj))
    fresh = {s.traj.id: s for s in link.collect()}
    put_scored(state.cache, recipe, list(fresh.values()))
    state.fixed_scored = [reused.get(t.id) or fresh[t.id] for t in fixed_set]
    scored = list(fresh.values())
    if not reused:  # a resume finds the fixed set already recorded
        write_trajectories(state.run.trajectories_path, fixed_set, append=True)
    state.run.event("offline_targets_scored", trajectories=len(scored),
                    reused_from_cache=len(reused),
                    positions=int(sum(len(s.positions_P) for s in scored)))


def fixed_batch(state: TrainState, cycle: int) -> list[Scored]:
    n = min(state.recipe.train.rollouts_per_cycle, len(state.fixed_scored))
    rng = np.random.default_rng(episode_seed(state.recipe.run.seed, cycle, DRAW_SALT))
    pick = rng.choice(len(state.fixed_scored), size=n, replace=False)
    return [state.fixed_scored[i] for i in sorted(pick)]
