"""Where model and adapter references lead: a local directory, or a pinned hub snapshot.

A teacher names its weights the way a user does: a local Hugging Face directory, or a
hub id at a pinned 40-hex revision; an adapter among several named ones may pin its
commit in its value (``ORG/NAME@<40-hex>``). :func:`resolve_dir` turns either into a
local directory (``offline`` never touches the network and names the missing files),
:func:`adapter_dir` does it for a named adapter, and :func:`adapter_sha256` is an
adapter's identity: the digest of its files. The teacher server loads adapters with
these, and so does the student process when the teacher plays its own episodes
(``student/teacher_play.py``): one adapter, one identity, in both.

This module loads no weights; huggingface_hub is imported inside the functions.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from miniverl.common.errors import ConfigError
from miniverl.common.modeling import resolve_model_dir

HEX40 = re.compile(r"^[0-9a-f]{40}$")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Files a hub snapshot needs before from_pretrained can work offline.
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
# A hub adapter among --adapters is pinned in its value: NAME=ORG/NAME@<40-hex>.
PINNED_HUB_ADAPTER = re.compile(r"^(?P<ref>[A-Za-z0-9][\w.-]*/[\w.-]+)@(?P<revision>[0-9a-f]{40})$")


def _missing_hub_files(repo_id: str, revision: str, files: tuple[str, ...]) -> list[str]:
    """Which of ``files`` are not in the local Hugging Face cache for this revision."""
    from huggingface_hub import try_to_load_from_cache

    missing = []
    for name in files:
        hit = try_to_load_from_cache(repo_id, name, revision=revision)
        if not isinstance(hit, str):
            missing.append(name)
    return missing


def resolve_dir(ref: str, revision: str | None, offline: bool, *, what: str = "model") -> Path:
    """A local directory for a model or adapter reference (local path or pinned hub id)."""
    local = Path(ref).expanduser()
    if local.is_dir():
        return local
    if not HUB_ID.match(ref):
        raise ConfigError(
            f"{what} {ref!r} is neither a local directory nor a hub id (ORG/NAME); "
            "pass an existing directory or a hub id with --revision"
        )
    if not revision or not HEX40.match(revision):
        raise ConfigError(
            f"hub {what} {ref!r} needs a pinned 40-hex --revision (got {revision!r}); "
            "branches and tags drift, commits do not"
        )
    if offline:
        wanted = ADAPTER_FILES if what == "adapter" else REQUIRED_FILES
        missing = _missing_hub_files(ref, revision, wanted)
        if what != "adapter" and len(_missing_hub_files(ref, revision, WEIGHT_FILES)) == 2:
            missing.append(" or ".join(WEIGHT_FILES))
        if missing:
            raise ConfigError(
                f"offline mode: hub {what} {ref}@{revision[:12]} is missing from the local "
                f"cache: {', '.join(missing)}; download it once online "
                f"(huggingface-cli download {ref} --revision {revision}) or drop --offline"
            )
    if what == "adapter":
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(ref, revision=revision, local_files_only=offline))
        except Exception as exc:
            raise ConfigError(
                f"could not fetch adapter {ref}@{revision[:12]}: {type(exc).__name__}: {exc}"
            ) from exc
    return resolve_model_dir({"hub_id": ref, "revision": revision}, offline=offline)


def adapter_sha256(adapter_dir: Path) -> str:
    """``sha256:`` digest over the adapter weights and config (name, then bytes, per file)."""
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        file = adapter_dir / name
        if not file.is_file():
            raise ConfigError(
                f"adapter directory {str(adapter_dir)!r} has no {name}; save the adapter "
                "with PeftModel.save_pretrained (safetensors)"
            )
        digest.update(name.encode() + b"\0")
        with file.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def adapter_dir(ref: str, offline: bool) -> Path:
    """A named adapter's directory: ``ref`` itself, or the pinned hub id it names."""
    pinned = PINNED_HUB_ADAPTER.match(ref)
    if pinned is not None and not Path(ref).expanduser().is_dir():
        return resolve_dir(pinned["ref"], pinned["revision"], offline, what="adapter")
    return resolve_dir(ref, None, offline, what="adapter")
