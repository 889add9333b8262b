"""Which episodes a cycle samples, and which fixed-set episodes a batch draws.

Two batch rules, both pure functions of the recipe, the run seed and the cycle, so a
resumed run builds exactly the batches the uninterrupted one would have built:

- **Groups** (``rollout.group_size`` G; dpo's ``dpo.group_size`` when that is unset):
  a cycle of ``n`` fresh episodes plays ``n // G`` tasks (the cycle's first ``n // G``
  of :func:`~miniverl.student.train.state.tasks_for`), each ``G`` times in a row, and
  episode ``i`` of the cycle has seed ``episode_seed(run.seed, cycle, i)``, so the ``G``
  episodes of one task differ in their seed only. G = 1 is the ungrouped batch: task
  ``i`` with seed ``i``, exactly what a cycle sampled before groups existed.
- **The fixed-set draw** (:func:`fixed_draw`): ``count`` episodes of the fixed set, a
  draw without replacement seeded by ``(run.seed, cycle)``, in set order. With
  ``count = rollouts_per_cycle`` it is offline KD's batch; GKD mixing
  (``train.on_policy_fraction``, ``mixing.py``) draws the part of the batch the fresh
  episodes leave.

This module samples nothing and talks to no teacher.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from miniverl.common.recipe import Recipe
from miniverl.student.train.state import TrainState, episode_seed, tasks_for

# Salts the fixed-set draw's seed apart from the episodes' seeds of the same cycle.
FIXED_DRAW_SALT = 77_777

Item = TypeVar("Item")


def group_size(recipe: Recipe) -> int:
    """Episodes per task in one cycle: ``rollout.group_size``; dpo falls back to
    ``dpo.group_size`` (the recipe refuses the two set to different values); 1 else."""
    if recipe.rollout.group_size is not None:
        return recipe.rollout.group_size
    return recipe.dpo.group_size if recipe.run.mode == "dpo" else 1


def cycle_episodes(state: TrainState, cycle: int, n: int,
                   group: int = 1) -> tuple[list[Any], list[int]]:
    """``(tasks, seeds)`` of the ``n // group * group`` fresh episodes of ``cycle``."""
    tasks = tasks_for(state, cycle, n // group)
    grouped = [task for task in tasks for _ in range(group)]
    seeds = [episode_seed(state.recipe.run.seed, cycle, i) for i in range(len(grouped))]
    return grouped, seeds


def fixed_draw(recipe: Recipe, fixed: list[Item], cycle: int, count: int) -> list[Item]:
    """``min(count, len(fixed))`` items of ``fixed`` drawn for ``cycle``, in set order."""
    k = min(count, len(fixed))
    rng = np.random.default_rng(episode_seed(recipe.run.seed, cycle, FIXED_DRAW_SALT))
    pick = rng.choice(len(fixed), size=k, replace=False)
    return [fixed[i] for i in sorted(pick)]
