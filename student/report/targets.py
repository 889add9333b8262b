"""Fetch the teacher's per-token targets for the report's divergence strip.

Reads the run's targets cache through :class:`miniverl.student.targets_cache.TargetsCache`
(torch-free, like this whole package) and turns the entries of a few trajectories into, per token index
``j`` (predicted at position ``j - 1``): the teacher's log-prob of the token that is
there, its top alternatives and a divergence value for colouring.

The divergence is the sampled-token estimate ``log p_student(x) - log p_teacher(x)``
when the cache recorded student log-probs, else the teacher's surprise
``-log p_teacher(x)`` at the student's token; the note returned says which.

Never raises: when the cache is absent or unreadable the strip shows span colours
only and the returned note says why. This module does not score anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from miniverl.common.trajectory import Trajectory
from miniverl.student.targets_cache import TargetsCache

Targets = dict[str, dict[int, dict[str, Any]]]


def _cache_dir(run_dir: Path, resolved: dict[str, Any]) -> Path:
    cache = resolved.get("cache") if isinstance(resolved.get("cache"), dict) else {}
    configured = cache.get("dir")
    return Path(configured) if configured else run_dir / "targets"


def load_strip_targets(
    run_dir: Path, manifest: dict[str, Any], resolved: dict[str, Any], trajs: list[Trajectory]
) -> tuple[Targets, str]:
    """Per-trajectory, per-token teacher targets for ``trajs`` and a note on their source."""
    if not trajs:
        return {}, "no trajectories to show"
    cache_dir = _cache_dir(run_dir, resolved)
    if not (cache_dir / "index.json").is_file():
        return {}, "no targets cache in this run (SFT, or caching off): span colours only"
    try:
        cache = TargetsCache(cache_dir)
        found: Targets = {}
        kind = "teacher surprise −log p_teacher(token)"
        for traj in trajs:
            per_token, has_student = _entries_for(cache, traj)
            if per_token:
                found[traj.id] = per_token
                if has_student:
                    kind = "sampled-token divergence log p_student − log p_teacher"
    except Exception as exc:  # a damaged cache must not break the report
        return (
            {},
            f"targets cache unreadable ({type(exc).__name__}: {str(exc)[:160]}): span colours only",
        )
    if not found:
        return (
            {},
            "the targets cache holds no entries for the trajectories shown: span colours only",
        )
    return found, f"colour depth: {kind}, from the targets cache"


def _entries_for(cache: TargetsCache, traj: Trajectory) -> tuple[dict[int, dict[str, Any]], bool]:
    """Newest cached entry for one trajectory, keyed by the token index it predicts."""
    found = cache.lookup(traj.id, student_version=None)
    if found is None:
        return {}, False
    _key, arrays = found
    target_P = arrays.get("target_logprobs")
    rows = len(target_P) if target_P is not None else 0
    if "positions" in arrays:
        positions_P = np.asarray(arrays["positions"], dtype=np.int64).reshape(-1)
    else:
        # Without stored positions the rows can only be the trajectory's model positions.
        positions_P = traj.target_positions()
    if target_P is None or len(positions_P) != rows:
        return {}, False
    ids_PK = arrays.get("ids")
    lps_PK = arrays.get("logprobs")
    student_P = arrays.get("student_logprobs")
    out: dict[int, dict[str, Any]] = {}
    for i, p in enumerate(positions_P.tolist()):
        j = int(p) + 1
        if not 0 < j < len(traj.tokens):
            continue
        info: dict[str, Any] = {"target_lp": float(target_P[i])}
        if lps_PK is not None and np.ndim(lps_PK) == 2:
            order = np.argsort(-lps_PK[i])[:5]
            # exact targets are [P, V]: the column index is the token id
            info["top_ids"] = [int(ids_PK[i][o]) if ids_PK is not None else int(o) for o in order]
            info["top_lps"] = [float(lps_PK[i][o]) for o in order]
        if student_P is not None:
            info["student_lp"] = float(student_P[i])
            info["divergence"] = info["student_lp"] - info["target_lp"]
        else:
            info["divergence"] = -info["target_lp"]
        out[j] = info
    return out, student_P is not None
