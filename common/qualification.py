"""Teacher qualification records: where they live, which one fits a teacher, the gate.

A **qualification record** is what measuring a teacher's own greedy success on a
held-out split produced (``student/qualify.py`` measures; this module only stores and
reads)::

    {"kind": "miniverl.teacher_qualification", "teacher": {name, model, revision,
     adapter_sha256}, "model_dir_sha256": "sha256:...", "environment": {name, params,
     difficulty, split_seed}, "split": "eval", "n": 32, "success": 0.81, ...}

Records live in ``<cache>/qualifications/`` (one file per teacher identity, environment
and split) and, for a prepared teacher, beside its weights
(``<model dir>/miniverl_qualification.json``), so the record travels with the directory.
A record of an environment with injected faults also holds ``recovery`` (the recovery
rate after a tool error, ``student/environments/faults.py``).
:func:`require_qualified` is the competence gate (``teacher.min_success``, and
``teacher.min_recovery`` for recovery): both sides
apply it, the student when it connects or switches teachers, the teacher server before
a ``RELOAD`` takes effect, so it lives here, in the layer both import.

Matching a record to a live teacher: the environment (name, params, difficulty, split
seed), the revision and the adapter digest must be equal; the model must be the same
*content* when its directory is visible from here (a sha256 over the directory, cached
by file sizes and modification times), otherwise the same model string (a hub id at a
pinned revision, or a teacher on another machine). The most recent record wins,
``eval`` before ``test``.

This module loads no weights, measures nothing and talks to no teacher.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from miniverl.common.atomic import atomic_write_json
from miniverl.common.errors import ConfigError
from miniverl.common.hashing import sha256_dir, sha256_text
from miniverl.common.toy import cache_root

RECORD_KIND = "miniverl.teacher_qualification"
RECORD_FILE = "miniverl_qualification.json"  # beside a prepared teacher
# Files miniverl itself writes into a model directory; they never change the weights.
OWN_FILES = ("miniverl_prepared.json", RECORD_FILE)
IDENTITY_KEYS = ("name", "model", "revision", "adapter_sha256")
SPLIT_PREFERENCE = {"eval": 0, "test": 1, "train": 2}
# What the gate and its messages read from a record (student/qualify.py writes them all).
RECORD_FIELDS = ("teacher", "environment", "split", "n", "success", "date")


class TeacherNotQualified(ConfigError):
    """``teacher.min_success`` is set and the teacher has no good-enough qualification."""


def qualifications_dir() -> Path:
    """``<cache>/qualifications`` (``$MINIVERL_CACHE`` or the per-user cache)."""
    return cache_root() / "qualifications"


PRIVILEGED = "privileged_context"


def privileged_view(recipe: Any) -> bool:
    """Whether the model a qualification of this recipe measures plays the privileged view:
    the teacher of a ``teacher.mode: privileged_context`` recipe, or the model a
    ``rollout.view: privileged_context`` preparation trains (the teacher to be)."""
    return ((recipe.teacher is not None and recipe.teacher.mode == PRIVILEGED)
            or recipe.rollout.view == PRIVILEGED)


def environment_signature(recipe: Any) -> dict[str, Any]:
    """What makes two measurements of a teacher the same: the tasks (environment, params,
    difficulty, split seed) and, for a ``privileged_context`` teacher, its view.

    A privileged teacher scores with the task's privileged context in its system message,
    so it is measured, and gated, in that view: ``"view": "privileged_context"``. A record
    of its plain view (or of a preparation without ``rollout.view``) does not match it.
    """
    env = recipe.environment
    return {
        "name": env.name,
        "params": dict(env.params),
        "difficulty": env.difficulty,
        "split_seed": env.split_seed,
        **({"view": PRIVILEGED} if privileged_view(recipe) else {}),
    }


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in OWN_FILES)


def model_dir_digest(model_dir: str | Path) -> str:
    """``sha256:`` over a model directory's files (miniverl's own notes excluded).

    Hashing gigabytes on every connect would be slow, so the digest is cached per
    directory under the qualifications folder and reused while every file keeps its
    size and modification time.
    """
    root = Path(model_dir).expanduser().resolve()
    stat = sha256_text(
        json.dumps(
            [[p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns]
             for p in _files(root)]
        )
    )
    index_path = qualifications_dir() / "model_dirs.json"
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        index = {}
    hit = index.get(str(root))
    if isinstance(hit, dict) and hit.get("stat") == stat and hit.get("sha256"):
        return str(hit["sha256"])
    digest = "sha256:" + sha256_dir(root, exclude=OWN_FILES)
    index[str(root)] = {"stat": stat, "sha256": digest}
    index_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(index_path, index)
    return digest


def record_key(record: dict[str, Any]) -> str:
    """The cache file name of a record: one per teacher identity, environment and split."""
    ident = {
        "teacher": record["teacher"],
        "model_dir_sha256": record.get("model_dir_sha256"),
        "environment": record["environment"],
        "split": record["split"],
    }
    return sha256_text(json.dumps(ident, sort_keys=True))[:24]


def save_record(
    record: dict[str, Any], *, out: str | Path | None = None, beside: str | Path | None = None
) -> list[Path]:
    """Write ``record`` to the cache (and ``out``, and ``beside/RECORD_FILE``); returns paths."""
    paths = [qualifications_dir() / f"{record_key(record)}.json"]
    if beside is not None:
        paths.append(Path(beside) / RECORD_FILE)
    if out is not None:
        paths.append(Path(out))
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, record)
    return paths


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("kind") != RECORD_KIND:
        return None
    success = data.get("success")
    # A damaged or hand-edited record is no record: a NaN success passed every threshold
    # (NaN < t is false) and a missing field was a KeyError traceback at the gate.
    if (any(key not in data for key in RECORD_FIELDS) or isinstance(success, bool)
            or not isinstance(success, (int, float)) or not 0.0 <= success <= 1.0):
        return None
    return data


def _local_dir(model: str | None) -> Path | None:
    local = Path(model).expanduser() if model else None
    return local if local is not None and local.is_dir() else None


def _same_model(record: dict[str, Any], model: str | None, digests: dict[str, str]) -> bool:
    local = _local_dir(model)
    if local is not None:
        key = str(local.resolve())
        if key not in digests:
            digests[key] = model_dir_digest(local)
        return record.get("model_dir_sha256") == digests[key]
    return (record.get("teacher") or {}).get("model") == model


def _candidates(identity: dict[str, Any]) -> list[Path]:
    folder = qualifications_dir()
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    # A prepared teacher carries its record in its own directory: a copied directory,
    # or a cache whose qualifications folder was cleared, still qualifies.
    local = _local_dir(identity.get("model"))
    if local is not None and (local / RECORD_FILE).is_file():
        paths.append(local / RECORD_FILE)
    return paths


def find_record(recipe: Any, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The best qualification record for this teacher identity and the recipe's environment."""
    env = environment_signature(recipe)
    digests: dict[str, str] = {}
    found = []
    for path in _candidates(identity):
        record = _load(path)
        if record is None or record.get("environment") != env:
            continue
        teacher = record.get("teacher") or {}
        if teacher.get("revision") != identity.get("revision"):
            continue
        if teacher.get("adapter_sha256") != identity.get("adapter_sha256"):
            continue
        if not _same_model(record, identity.get("model"), digests):
            continue
        found.append(record)
    if not found:
        return None
    found.sort(key=lambda r: (SPLIT_PREFERENCE.get(str(r.get("split")), 9), _neg_date(r)))
    return found[0]


def _neg_date(record: dict[str, Any]) -> float:
    try:
        return -_dt.datetime.fromisoformat(str(record.get("date"))).timestamp()
    except ValueError:
        return 0.0


def describe_teacher(identity: dict[str, Any]) -> str:
    """``name (model@rev + adapter sha256:abcd…)`` for messages."""
    rev = f"@{str(identity['revision'])[:12]}" if identity.get("revision") else ""
    adapter = identity.get("adapter_sha256")
    extra = f" + adapter {str(adapter)[:19]}" if adapter else ""
    return f"{identity.get('name')} ({identity.get('model')}{rev}{extra})"


def require_qualified(recipe: Any, identity: dict[str, Any]) -> dict[str, Any] | None:
    """Refuse a teacher below ``teacher.min_success`` or ``teacher.min_recovery``; returns
    the record (None when neither is set)."""
    teacher = recipe.teacher
    threshold = teacher.min_success if teacher is not None else None
    min_recovery = teacher.min_recovery if teacher is not None else None
    if threshold is None and min_recovery is None:
        return None
    gate = "teacher.min_success" if threshold is not None else "teacher.min_recovery"
    env = recipe.environment
    record = find_record(recipe, identity)
    if record is None:
        view = f" in its {PRIVILEGED} view" if privileged_view(recipe) else ""
        raise TeacherNotQualified(
            f"teacher {describe_teacher(identity)} has no qualification record for "
            f"{env.name} ({env.difficulty}, split_seed {env.split_seed}){view} and "
            f"{gate} is {threshold if threshold is not None else min_recovery:g}; run "
            "`miniverl qualify-teacher RECIPE` (or `miniverl qualify-teacher RECIPE --teacher "
            f"ENDPOINT` for a running one) first or unset {gate}"
        )
    if min_recovery is not None:
        _require_recovery(record, min_recovery, identity, env)
    if threshold is not None and record["success"] < threshold:
        raise TeacherNotQualified(
            f"teacher {describe_teacher(identity)} measured success {record['success']:.3f} "
            f"on {env.name} {record['split']} (n={record['n']}, {record['date']}), below "
            f"teacher.min_success {threshold:g}; train the teacher further (teacher.prepare) "
            "or lower teacher.min_success"
        )
    return record


def _require_recovery(record: dict[str, Any], min_recovery: float, identity: dict[str, Any],
                      env: Any) -> None:
    """``teacher.min_recovery``: the record's recovery rate after a tool error."""
    rate = record.get("recovery")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        raise TeacherNotQualified(
            f"teacher {describe_teacher(identity)} has no measured recovery rate on "
            f"{env.name} {record['split']} (no episode of its eval saw a tool error) and "
            f"teacher.min_recovery is {min_recovery:g}; give the environment faults "
            "(e.g. calculator params faults: 0.5) and qualify again, or unset teacher.min_recovery"
        )
    if rate < min_recovery:
        raise TeacherNotQualified(
            f"teacher {describe_teacher(identity)} measured recovery rate {rate:.3f} after tool "
            f"errors on {env.name} {record['split']} (n={record['n']}, {record['date']}), below "
            f"teacher.min_recovery {min_recovery:g}; train the teacher on oracle traces with "
            "faults (teacher.prepare) or lower teacher.min_recovery"
        )
