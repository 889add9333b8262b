"""Mode ``rl``: reinforcement learning on the task reward alone, the baseline on-policy
distillation is measured against (docs/training.md, "rl").

One cycle: the cycle's tasks, each played ``rollout.group_size`` times with version
``v``; each episode's reward is its verifier's score; one optimizer step on
``-A · log S(y)`` over the episodes' trained positions, ``A`` the reward minus the
mean of the other episodes of its task (``loss.reward_baseline: group``) or of the
update (``batch``): REINFORCE with a leave-one-out baseline, as GRPO and RLOO use it,
without a ratio or a clip (each batch is trained on once, by the version that sampled
it). ``v -> v + 1``. No teacher is asked, so the cycle costs its sampling and its
update only.

This module keeps no state between cycles and does not log or checkpoint (``loop.py``).
"""

from __future__ import annotations

import time

import torch

from miniverl.common.trajectory import select_positions_for, write_trajectories
from miniverl.student.train import updates
from miniverl.student.train.state import CycleResult, TrainState, group_size
from miniverl.student.train.teacher.link import Scored


class RlMode:
    """RL on the verifier's score: nothing carries over from one cycle to the next."""

    def cycle(self, state: TrainState) -> CycleResult:
        """One update: fresh episodes of v, their rewards, one policy-gradient step."""
        recipe, train = state.recipe, state.recipe.train
        # 1. Draw the tasks, each played group_size times.
        tasks, seeds = state.tasks.episodes(state.cycle, train.rollouts_per_cycle,
                                            group_size(recipe))

        # 2. Sample with version v (no teacher: nothing is sent).
        t0 = time.perf_counter()
        with torch.no_grad():
            trajs = state.runner.run(tasks, policy_version=state.version, seeds=seeds)
        t_rollout = time.perf_counter() - t0
        write_trajectories(state.run.trajectories_path, trajs, append=True)

        # 3. The policy gradient on the task reward and one optimizer step.
        t1 = time.perf_counter()
        episodes = [Scored(t, select_positions_for(t, recipe.loss, seed=recipe.run.seed), {},
                           state.version, {}) for t in trajs]
        stats = updates.distill_step(
            state.policy, state.optimizer, state.scheduler, episodes,
            objective=state.objective, train=train,
        )

        # 4. v -> v + 1; the loop logs the cycle.
        state.advance()
        return CycleResult(stats, trajs, t_rollout, 0.0, time.perf_counter() - t1)

    def prepare(self, state: TrainState) -> None:
        """Nothing to prepare: no teacher to score a set, and each cycle samples its own."""

    def resume(self, state: TrainState) -> None:
        """Nothing to rebuild: the checkpoint holds everything a cycle reads."""
