"""``manifest.json``: what a run was, on what, with which code and models.

The manifest records versions (python, OS, miniverl, key packages), hardware (CPU
count, GPUs when torch is already loaded), the git commit of the source tree when
there is one, recipe digest and seeds, model ids/revisions, the tokenizer
fingerprint, the teacher identities per student-version range, and a measurement
status. It is written atomically and updated as the run learns facts (tokenizer,
teacher identity). Every write seals it: ``digest`` is the sha256 of the rest of its
canonical JSON, recomputed on each write; :func:`read_manifest` refuses a manifest that
does not match it (a manifest without one still reads, with a warning). Call
:func:`~miniverl.common.redact.redact` before sharing it.

This module does not import torch: GPU facts are recorded only if the caller's
process has already imported it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .atomic import atomic_write_json
from .clock import utc_now_ms
from .errors import ProvenanceError
from .hashing import SEAL_FIELD, seal, seal_status
from .recipe import Recipe, recipe_digest

log = logging.getLogger(__name__)

# 2: sealed (a "digest" field); a version-2 manifest without one is refused.
MANIFEST_VERSION = 2
PACKAGES = (
    "miniverl",
    "torch",
    "transformers",
    "peft",
    "tokenizers",
    "accelerate",
    "bitsandbytes",
    "pydantic",
    "pyzmq",
    "msgpack",
    "numpy",
    "safetensors",
    "pyarrow",
)


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed distribution versions; None for packages that are not installed."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_info(path: str | Path | None = None) -> dict[str, Any] | None:
    """Commit and dirty flag of the git tree holding ``path`` (the source by default)."""
    root = Path(path) if path else Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)}


def hardware_info() -> dict[str, Any]:
    """CPU facts always; GPU facts only if torch is already imported in this process."""
    info: dict[str, Any] = {
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "gpus": [],
    }
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["gpus"].append(
                {"index": i, "name": props.name, "total_memory_bytes": int(props.total_memory)}
            )
    return info


def _model_entry(placement: Any) -> dict[str, Any] | None:
    if placement is None:
        return None
    source = placement.model
    entry: dict[str, Any] = {
        "source": "hub" if source.hub_id else (
            "path" if source.path else ("gguf" if source.gguf else "toy")),
        "id": source.hub_id or source.path or source.gguf,
        "revision": source.revision,
        "toy": source.toy.model_dump() if source.toy else None,
        "dtype": placement.dtype,
        "quantization": placement.quantization,
    }
    if hasattr(placement, "adapter"):
        entry["adapter"] = placement.adapter
        entry["adapter_revision"] = placement.adapter_revision
    return entry


def build_manifest(recipe: Recipe, run_id: str, **extra: Any) -> dict[str, Any]:
    """A fresh manifest for ``recipe``; ``extra`` keys are added at the top level."""
    manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "run_id": run_id,
        "created_at": utc_now_ms(),
        "mode": recipe.run.mode,
        # What the plan promises: an SFT warm-up is off-policy. finish_manifest replaces
        # it with what the run did (counted from its metrics rows).
        "on_policy": recipe.on_policy and recipe.train.sft_warmup_steps == 0,
        "steps": {"on_policy": 0, "off_policy": 0},
        "final_version": None,
        "recipe_digest": recipe_digest(recipe),
        "seeds": {"run": recipe.run.seed, "split": recipe.environment.split_seed}
        if recipe.environments is None else {"run": recipe.run.seed, "split": {
            env.name: env.split_seed for env in recipe.environments}},
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "packages": package_versions(),
        "hardware": hardware_info(),
        "git": git_info(),
        "models": {
            "student": _model_entry(recipe.student),
            "teacher": _model_entry(recipe.teacher),
        },
        "tokenizer_fp": None,
        # Each entry: {from_version, to_version, name, instance, gen, how}; to_version is
        # the last student version the teacher scored, None while it still serves.
        "teachers": [],
        "measurement": {"status": "not_measured"},
    }
    manifest.update(extra)
    return manifest


def manifest_seal_status(manifest: dict[str, Any]) -> str:
    """:func:`~miniverl.common.hashing.seal_status` of a manifest: from version 2 on a
    missing digest is a mismatch (a flipped byte in its name must not read as "old")."""
    version = manifest.get("manifest_version")
    return seal_status(manifest, required=isinstance(version, int) and version >= 2)


def check_manifest(manifest: Any, where: str | Path) -> dict[str, Any]:
    """The manifest without its digest; ProvenanceError if the digest does not match.

    An unsealed manifest (written before manifests were sealed) is returned with one
    logged warning.
    """
    if not isinstance(manifest, dict):
        raise ProvenanceError(
            f"{where}: not a JSON object; the manifest is corrupted, restore it from a copy"
        )
    status = manifest_seal_status(manifest)
    if status == "mismatch":
        raise ProvenanceError(
            f"{where}: the manifest does not match its {SEAL_FIELD} (sha256 of its content); "
            "it was modified or corrupted after the run wrote it; restore it from a copy or "
            "rerun"
        )
    if status == "unsigned":
        log.warning(
            "warning: %s has no %s (written before manifests were sealed): it is read, but "
            "changes to it cannot be detected", where, SEAL_FIELD,
        )
    return {k: v for k, v in manifest.items() if k != SEAL_FIELD}


def load_manifest(path: str | Path) -> dict[str, Any]:
    """Read and check ``manifest.json`` at ``path``; every failure is a ProvenanceError."""
    path = Path(path)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProvenanceError(
            f"{path}: not valid JSON ({exc}); the manifest is corrupted, restore it from a "
            "copy or rerun"
        ) from None
    return check_manifest(manifest, path)


def read_manifest(run: Any) -> dict[str, Any]:
    """The run's checked manifest (without its digest)."""
    return load_manifest(run.manifest_path)


def write_manifest(run: Any, manifest: dict[str, Any] | None = None, **fields: Any) -> dict:
    """Write ``manifest`` (default: the current one) with ``fields`` set, atomically.

    The digest is recomputed on every write (the manifest changes during a run).
    """
    manifest = dict(read_manifest(run) if manifest is None else manifest)
    manifest.pop(SEAL_FIELD, None)
    manifest.update(fields)
    atomic_write_json(run.manifest_path, seal(manifest))
    return manifest


def update_manifest(run: Any, **fields: Any) -> dict[str, Any]:
    """Set top-level ``fields`` (shallow merge) and rewrite atomically; returns the result."""
    return write_manifest(run, None, **fields)


def record_teacher(run: Any, from_version: int, identity: dict[str, Any], how: str,
                   route: str | None = None) -> None:
    """Close the open teacher range at ``from_version - 1`` and open a new one; with
    several teachers, each ``route`` (docs/several-teachers.md) keeps its own ranges."""
    manifest = read_manifest(run)
    teachers = manifest.setdefault("teachers", [])
    for entry in reversed(teachers):
        if entry.get("route") == route:
            if entry.get("to_version") is None:
                entry["to_version"] = max(from_version - 1, entry["from_version"])
            break
    teachers.append({"from_version": from_version, "to_version": None, "how": how,
                     **({"route": route} if route is not None else {}), **identity})
    write_manifest(run, manifest)


def finish_manifest(run: Any, final_version: int, *, mode_on_policy: bool,
                    on_policy_steps: int, off_policy_steps: int) -> dict[str, Any]:
    """Record how a run ended: its final version, how many of its optimizer steps were
    on-policy, ``on_policy`` true only if every one was (and the mode, ``recipe.
    on_policy``, says so), and the open teacher range closed.

    The last teacher scored versions up to ``final_version - 1`` (the final version's
    weights are the result; nothing scored them), the same rule :func:`record_teacher`
    uses when a teacher is replaced. A resumed run that connects again opens a new range.
    """
    manifest = read_manifest(run)
    for entry in manifest.setdefault("teachers", []):  # one open range per route
        if entry.get("to_version") is None:
            entry["to_version"] = max(final_version - 1, entry["from_version"])
    manifest["final_version"] = final_version
    manifest["steps"] = {"on_policy": on_policy_steps, "off_policy": off_policy_steps}
    manifest["on_policy"] = mode_on_policy and off_policy_steps == 0
    return write_manifest(run, manifest)
