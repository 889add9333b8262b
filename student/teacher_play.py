"""The teacher plays episodes itself, in the student process, with its own weights.

SeqKD's fixed set (``train.fixed_set: teacher``) and the state-coverage reference of
such a run are episodes the *teacher* plays in the environment. ``mvl-score/1`` has
no generation message and needs none for this: :func:`play_as_teacher` loads
``teacher.model`` here (through ``common/modeling.py``, the path every model loads
through), checks that its tokenizer is the student's (the episodes' token ids are
trained on as they are), plays the tasks with the ordinary
:class:`~miniverl.student.rollout.runner.RolloutRunner` (the recipe's ``rollout``
section: temperature, top-p, lengths) and frees the weights again. A route to one of
the teacher's named adapters (``teacher.adapters``, an environment's ``adapter:``) plays
with that adapter merged into the base (PEFT's ``merge_and_unload``), the very adapter a
teacher server would select by name (``common/adapters.py`` resolves it and digests its
files for the episode cache). Asked to, it first
applies the recipe's competence gate (``teacher.min_success``, ``min_recovery``) to the
teacher's qualification record, as a served teacher's handshake would. The recipe refuses
a teacher this process cannot load as it stands (a ``prepare`` recipe, the one merged
``teacher.adapter``, a privileged view, another scorer).

The episodes are relabelled as the teacher's: ``source: teacher``, id
``teacher/<env>/<task>/s<seed>``, policy version 0 (no student version sampled them).
A recipe that names a shared ``cache.dir`` keeps them there
(:mod:`~miniverl.student.teacher_episodes`): an episode another run played is read
back, not played, and its recorded cost is charged to this call (``charged_s``); the
weights are not loaded at all when every episode is cached.

This module does not train, score or write files.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from miniverl.common.adapters import adapter_dir
from miniverl.common.errors import ConfigError
from miniverl.common.modeling import load_causal_lm, resolve_model_dir
from miniverl.common.qualification import require_qualified
from miniverl.common.recipe import Recipe
from miniverl.common.tokenizer_id import tokenizer_fingerprint
from miniverl.common.trajectory import Trajectory
from miniverl.student.rollout.runner import RolloutRunner
from miniverl.student.teacher_episodes import EpisodeCache, episode_id


@dataclass
class TeacherEpisodes:
    """What :func:`play_as_teacher` played and what it cost (seconds): ``time_load_s``
    and ``time_play_s`` measured now, ``charged_s`` the recorded cost of the
    ``from_cache`` episodes read from the shared cache instead of played."""

    trajectories: list[Trajectory]
    time_load_s: float
    time_play_s: float
    from_cache: int = 0
    charged_s: float = 0.0

    @property
    def success(self) -> float:
        return success_rate(self.trajectories)


def success_rate(trajs: list[Trajectory]) -> float:
    """The share of ``trajs`` the verifier accepted (0 for none)."""
    return sum(t.verifier.success for t in trajs) / len(trajs) if trajs else 0.0


def teacher_identity(recipe: Recipe, model_dir: Path) -> dict[str, Any]:
    """The identity a teacher server would report for ``teacher.model`` (what its
    qualification records are found by): a hub id at its revision, else the directory."""
    source = recipe.teacher.model
    if source.hub_id is not None:
        return {"name": source.hub_id, "model": source.hub_id, "revision": source.revision,
                "adapter_sha256": None}
    return {"name": model_dir.name, "model": str(model_dir), "revision": None,
            "adapter_sha256": None}


def teacher_dir(recipe: Recipe, tokenizer_fp: str, *, offline: bool = False,
                gate: bool = False) -> Path:
    """``teacher.model``'s directory, its tokenizer checked to be the student's.
    ``gate``: first apply ``teacher.min_success`` / ``min_recovery`` to its qualification
    record, as a served teacher's handshake does."""
    cfg = recipe.teacher
    if cfg is None:
        raise ConfigError("the teacher plays episodes with teacher.model; add a teacher section")
    model_dir = Path(resolve_model_dir(cfg.model, offline=offline))
    if gate:
        require_qualified(recipe, teacher_identity(recipe, model_dir))
    theirs = tokenizer_fingerprint(model_dir)
    if theirs != tokenizer_fp:
        raise ConfigError(
            f"teacher.model {cfg.model.describe()} has tokenizer {theirs[:19]}, the student "
            f"{tokenizer_fp[:19]}; the student trains on the teacher's token ids as they are, "
            "so both need one tokenizer: pick a teacher of the student's family"
        )
    return model_dir


def load_teacher_weights(recipe: Recipe, tokenizer_fp: str, *, offline: bool = False,
                         gate: bool = False, model_dir: Path | None = None,
                         adapter: Path | None = None) -> Any:
    """``teacher.model``'s weights, frozen, in eval mode (:func:`teacher_dir` checks it
    first, unless the caller passes the ``model_dir`` it checked); ``adapter``: a PEFT
    adapter directory merged into them."""
    if model_dir is None:
        model_dir = teacher_dir(recipe, tokenizer_fp, offline=offline, gate=gate)
    cfg = recipe.teacher
    model = load_causal_lm(
        model_dir, dtype=cfg.dtype, device=cfg.device, quantization=cfg.quantization,
        revision=cfg.model.revision, allow_cpu_quantization=cfg.allow_cpu_quantization,
    )
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        model = model.merge_and_unload()
    model.requires_grad_(False)
    model.eval()
    return model


def play_as_teacher(recipe: Recipe, tasks: list[Any], seeds: list[int], tokenizer: Any,
                    tokenizer_fp: str, *, offline: bool = False, gate: bool = False,
                    adapter: str | None = None) -> TeacherEpisodes:
    """The teacher plays ``tasks[i]`` with seed ``seeds[i]``, in task order; its weights
    are freed after (``gate``: see :func:`teacher_dir`; ``adapter``: one of
    ``teacher.adapters`` by name, merged; the shared cache: the module docstring)."""
    t0 = time.perf_counter()
    model_dir = teacher_dir(recipe, tokenizer_fp, offline=offline, gate=gate)
    merged = None
    if adapter is not None:
        merged = adapter_dir((recipe.teacher.adapters or {})[adapter], offline)
    env = recipe.environment
    ids = [episode_id(env.name, task.id, seed) for task, seed in zip(tasks, seeds, strict=True)]
    cache = EpisodeCache.for_recipe(recipe, model_dir, tokenizer_fp, adapter=merged)
    hits = cache.get(ids) if cache is not None else {}
    todo = [i for i, eid in enumerate(ids) if eid not in hits]
    played: list[Trajectory] = []
    t_load = t_play = 0.0
    if todo:
        model = load_teacher_weights(recipe, tokenizer_fp, model_dir=model_dir, adapter=merged)
        t_load = time.perf_counter() - t0
        runner = RolloutRunner(model, tokenizer, env_name=env.name, env_params=env.params,
                               rollout=recipe.rollout, tokenizer_fp=tokenizer_fp)
        t1 = time.perf_counter()
        try:
            with torch.no_grad():
                played = runner.run([tasks[i] for i in todo], policy_version=0,
                                    seeds=[seeds[i] for i in todo])
        finally:
            device = next(model.parameters()).device
            del runner, model
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        t_play = time.perf_counter() - t1
        played = [t.model_copy(update={"id": episode_id(t.environment, t.task_id, t.seed),
                                       "source": "teacher", "policy_version": 0})
                  for t in played]
        if cache is not None:
            cache.put(played, (t_load + t_play) / len(played))
    fresh = dict(zip((ids[i] for i in todo), played, strict=True))
    ordered = [fresh[eid] if eid in fresh else hits[eid][0] for eid in ids]
    return TeacherEpisodes(ordered, t_load, t_play, from_cache=len(hits),
                           charged_s=sum(cost for _, cost in hits.values()))
