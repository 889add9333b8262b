"""Episodes the teacher played, kept across runs that share a ``cache.dir``.

The teacher is frozen, and the rollout runner gives the same trajectory for the same
task, episode seed, weights and sampling settings whatever the batch
(:class:`~miniverl.student.rollout.runner.RolloutRunner`). So an episode one run made
the teacher play is the episode any other run would get there. A run that names a
shared ``cache.dir`` (a benchmark's seeds and learning rates of one arm) finds them
in ``<cache.dir>/teacher_episodes/<key>/`` instead of playing them again.

The key is a digest of everything an episode depends on: the teacher's weights (the
digest of its model directory), the tokenizer, the environment (name, parameters,
difficulty, split seed), the rollout's sampling and length settings (not its batch
size), the teacher's dtype, device and quantization, and the digest of the named
adapter it played with, if any (``adapter_sha256``). The folder holds
``episodes.jsonl`` (sealed trajectories, appended) and ``costs.json``: the seconds
each episode cost when it was played (its share of the load and play time of the call
that played it). A run that reads an episode from here is *charged* that cost
(:attr:`TeacherEpisodes.charged_s` in :mod:`~miniverl.student.teacher_play`), so a
wall-clock comparison counts the teacher's generation for every run that uses it, as
if it had played it itself; the cache saves the machine's time, not the arm's.

One writer at a time (runs sharing a cache run one after another); a reader skips
episodes without a recorded cost. This module does not play or train.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from miniverl.common.adapters import adapter_sha256
from miniverl.common.atomic import atomic_write_json
from miniverl.common.hashing import sha256_text
from miniverl.common.qualification import model_dir_digest
from miniverl.common.recipe import Recipe
from miniverl.common.trajectory import Trajectory, read_trajectories, write_trajectories

FOLDER = "teacher_episodes"


def episode_id(env_name: str, task_id: str, seed: int) -> str:
    """The id a teacher episode carries (``teacher/<env>/<task>/s<seed>``)."""
    return f"teacher/{env_name}/{task_id}/s{seed}"


def episodes_key(recipe: Recipe, model_dir: Path, tokenizer_fp: str,
                 adapter: Path | None = None) -> str:
    """The digest of what a teacher episode of ``recipe`` depends on (module docstring);
    ``adapter``: the adapter directory merged into ``model_dir``'s weights."""
    env, rollout, teacher = recipe.environment, recipe.rollout, recipe.teacher
    assert teacher is not None
    data = {
        "model": model_dir_digest(model_dir),
        "tokenizer": tokenizer_fp,
        "environment": {"name": env.name, "params": env.params, "difficulty": env.difficulty,
                        "split_seed": env.split_seed},
        "rollout": rollout.model_dump(mode="json", exclude={"batch_size", "group_size"}),
        "teacher": {"dtype": teacher.dtype, "device": teacher.device,
                    "quantization": teacher.quantization},
    }
    if adapter is not None:  # absent otherwise: a plain teacher's key is unchanged
        data["adapter"] = adapter_sha256(adapter)
    return sha256_text(json.dumps(data, sort_keys=True))[:24]


class EpisodeCache:
    """One key's folder of cached teacher episodes and their costs."""

    def __init__(self, root: str | Path, key: str):
        self.dir = Path(root) / FOLDER / key
        self.episodes_path = self.dir / "episodes.jsonl"
        self.costs_path = self.dir / "costs.json"

    @classmethod
    def for_recipe(cls, recipe: Recipe, model_dir: Path, tokenizer_fp: str,
                   adapter: Path | None = None) -> EpisodeCache | None:
        """The cache of ``recipe``'s teacher, or None unless the recipe names a shared
        ``cache.dir`` (a run's own set is kept in its ``trajectories.jsonl`` anyway)."""
        cfg = recipe.cache
        if not cfg.enabled or not cfg.dir:
            return None
        return cls(cfg.dir, episodes_key(recipe, model_dir, tokenizer_fp, adapter))

    def _costs(self) -> dict[str, float]:
        if not self.costs_path.is_file():
            return {}
        return {str(k): float(v) for k, v in
                json.loads(self.costs_path.read_text(encoding="utf-8")).items()}

    def get(self, ids: list[str]) -> dict[str, tuple[Trajectory, float]]:
        """The cached episodes among ``ids``, each with the seconds it cost."""
        if not self.episodes_path.is_file():
            return {}
        wanted, costs = set(ids), self._costs()
        found: dict[str, tuple[Trajectory, float]] = {}
        for traj in read_trajectories(self.episodes_path):
            if traj.id in wanted and traj.id in costs:
                found.setdefault(traj.id, (traj, costs[traj.id]))
        return found

    def put(self, trajs: list[Trajectory], cost_each: float) -> None:
        """Keep ``trajs``, each having cost ``cost_each`` seconds (episodes first, then the
        costs that make them visible)."""
        if not trajs:
            return
        write_trajectories(self.episodes_path, trajs, append=True)
        costs: dict[str, Any] = self._costs()
        for traj in trajs:
            costs.setdefault(traj.id, round(cost_each, 6))
        atomic_write_json(self.costs_path, costs)
