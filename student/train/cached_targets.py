"""The targets cache as the training loop uses it: where replies are stored, and under
which key; what a resume or a fixed set reads back as :class:`Scored`.

An entry's key names the trajectory, the student version the targets were scored for,
and the teacher: its name, plus its adapter and its mode when those change what it
answers (a privileged view of the same trajectory is another entry), and the process
``(instance, gen)`` (``student/targets_entries.py``, ``scored_entries``). Strict OPD
records its targets with ``scored_entries`` directly; the reading back here (a fixed
set, a resumed replay buffer) runs in the modes that reuse targets.

This module does not decide what to score or train on (``modes/``) and does not know
the cache's file format (``student/targets_cache.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from miniverl.common.errors import StaleTargetError
from miniverl.common.recipe import Recipe
from miniverl.common.rundir import RunDir
from miniverl.common.trajectory import Trajectory
from miniverl.student.targets_cache import TargetsCache
from miniverl.student.targets_entries import CacheIdentity, EntryKey, scored_entries, teacher_key
from miniverl.student.train.policy import Policy
from miniverl.student.train.teacher.link import Scored


def open_cache(recipe: Recipe, run: RunDir, policy: Policy, kind: str) -> TargetsCache | None:
    """The run's targets cache (``cache.dir`` or ``<run>/targets``); None when off."""
    cfg = recipe.cache
    if not cfg.enabled or not recipe.needs_teacher:
        return None
    if kind in ("xvocab", "mixed"):  # not cached yet: docs/cross-tokenizer.md says what is missing
        return None
    loss = recipe.loss
    root = Path(cfg.dir) if cfg.dir else run.targets_dir
    return TargetsCache(
        root,
        CacheIdentity(
            tokenizer_fp=policy.tokenizer_fp,
            vocab_size=policy.vocab_size,
            kind=kind,
            k=loss.top_k if kind == "topk" else policy.vocab_size,
            objective=loss.objective,
            temperature=loss.temperature,
        ),
    )


def teacher_mode(recipe: Recipe) -> str:
    """``teacher.mode`` (``standard`` without a teacher section): part of an entry's key."""
    return recipe.teacher.mode if recipe.teacher is not None else "standard"


def put_scored(cache: TargetsCache | None, scored: list[Scored]) -> None:
    """Store every reply that has positions, in one shard (nothing when the cache is off),
    each under what its teacher was shown (``Scored.mode``)."""
    if cache is not None:
        cache.put_many(scored_entries(scored))


def latest_for_teacher(cache: TargetsCache | None, recipe: Recipe, teacher: dict[str, Any],
                       trajs: list[Trajectory]) -> dict[str, Scored]:
    """The newest targets this teacher produced for each of ``trajs``, by trajectory id
    (offline_kd: a resume finds its fixed set already scored)."""
    if cache is None:
        return {}
    name = teacher_key(teacher, teacher_mode(recipe))
    by_traj: dict[str, EntryKey] = {}
    entries = cache.keys()  # sorted EntryKeys (a cache is not a mapping)
    for key in entries:
        if key.teacher == name and (key.trajectory_id not in by_traj
                                    or key > by_traj[key.trajectory_id]):
            by_traj[key.trajectory_id] = key
    out: dict[str, Scored] = {}
    for traj in trajs:
        newest = by_traj.get(traj.id)
        if newest is None:
            continue
        arrays = dict(cache.get(newest))
        positions = arrays.pop("positions", None)
        if positions is None:
            continue
        out[traj.id] = Scored(traj, np.asarray(positions), arrays, newest.student_version,
                              {**teacher, "instance": newest.instance, "gen": newest.gen})
    return out


def scored_for_version(cache: TargetsCache | None, traj: Trajectory) -> Scored | None:
    """The targets scored for the version that sampled ``traj``; None if there are none
    (replay: a resume rebuilds its buffer from them)."""
    if cache is None:
        return None
    try:
        hit = cache.lookup(traj.id, student_version=traj.policy_version)
    except StaleTargetError:
        return None
    if hit is None:
        return None
    key, arrays = hit
    arrays = dict(arrays)
    positions = arrays.pop("positions").astype(np.int32)
    teacher = {"name": key.teacher, "instance": key.instance, "gen": key.gen}
    return Scored(traj, positions, arrays, key.student_version, teacher)
