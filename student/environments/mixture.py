"""Mixtures of environments: several environments' tasks, each remembered by its
environment, and the cycle draw that picks among them by weight.

A recipe's ``environments:`` names several environments, each with its own params,
difficulty, splits and weight (docs/environments.md, "Mixtures"). :func:`mixture_tasks`
makes every environment's tasks of one split exactly as a single ``environment:`` makes
them (``make_tasks``) and records which environment each task id belongs to, so a runner
plays each task in its own environment and tags its episode with that name.
:func:`draw` picks a cycle's tasks: episode ``i`` of cycle ``c`` takes environment ``k``
with probability ``weight_k / sum(weights)`` and one of that environment's tasks
uniformly, both from a hash of ``(run seed, cycle, i)`` alone, so a resumed run draws
exactly what the uninterrupted one drew, whatever came before.

This module is torch-free and numpy-free (the bridge uses it). It does not play episodes
(``student/rollout/runner.py``) or validate recipes (``common/recipe.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from miniverl.common.errors import ConfigError

from .base import Task
from .registry import make_tasks


@dataclass(frozen=True)
class Mixture:
    """One split of a mixture: each environment's tasks, params and weight, in recipe
    order, and the environment of every task id."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    tasks: dict[str, list[Task]]
    params: dict[str, dict[str, Any]]
    environment_of: dict[str, str]

    def all_tasks(self) -> list[Task]:
        """Every environment's tasks, environment after environment in recipe order."""
        return [task for name in self.names for task in self.tasks[name]]


def split_size(member: Any, split: str) -> int:
    """How many tasks of ``split`` an environment section asks for."""
    return {"train": member.train_tasks, "eval": member.eval_tasks,
            "test": member.test_tasks}[split]


def mixture_tasks(members: Sequence[Any], split: str, cap: int | None = None) -> Mixture:
    """The ``split`` tasks of every environment of ``members`` (the recipe's
    ``environments``), at most ``cap`` per environment."""
    tasks: dict[str, list[Task]] = {}
    environment_of: dict[str, str] = {}
    for member in members:
        n = split_size(member, split)
        n = n if cap is None else min(n, cap)
        made = make_tasks(member.name, split, n, member.difficulty, member.split_seed,
                          params=member.params)
        for task in made:
            other = environment_of.setdefault(task.id, member.name)
            if other != member.name:
                raise ConfigError(
                    f"environments: {member.name} and {other} both make task {task.id}, so "
                    "its episodes could not be told apart; mix environments whose tasks "
                    "have their own ids (a plugin's `name` attribute names its ids)")
        tasks[member.name] = made
    return Mixture(
        names=tuple(member.name for member in members),
        weights=tuple(float(member.weight) for member in members),
        tasks=tasks,
        params={member.name: dict(member.params) for member in members},
        environment_of=environment_of,
    )


def _uniform(*parts: int) -> float:
    """A number in [0, 1) from a hash of ``parts``: the same parts, the same number."""
    digest = hashlib.sha256(("mixture:" + ":".join(map(str, parts))).encode()).hexdigest()
    return int(digest[:13], 16) / 16**13


def draw(mixture: Mixture, run_seed: int, cycle: int, n: int) -> list[Task]:
    """The ``n`` tasks of ``cycle``: each picks its environment by weight, then one of
    that environment's tasks uniformly (with replacement across episodes)."""
    total = sum(mixture.weights)
    out = []
    for i in range(n):
        point = _uniform(run_seed, cycle, i, 0) * total
        k, cumulative = 0, mixture.weights[0]
        # Past every bound only by rounding: the last environment with a weight.
        while point >= cumulative and k + 1 < len(mixture.weights):
            k += 1
            cumulative += mixture.weights[k]
        while mixture.weights[k] == 0.0:
            k -= 1
        tasks = mixture.tasks[mixture.names[k]]
        out.append(tasks[int(_uniform(run_seed, cycle, i, 1) * len(tasks))])
    return out
