"""Which model and adapter locations a verl config may name: the importer's trust rule.

A verl config is a file from someone else. The model and adapter fields it carries
become paths that ``miniverl train`` opens and hub ids it downloads, so the importer
accepts exactly two shapes and refuses everything else, per field:

- a **local directory inside the config's folder** (relative to it, or absolute but
  still under it): no ``..`` component, no URL scheme, and the directory must exist
  and resolve (symlinks followed) to a place under the folder; the recipe gets the
  resolved absolute path, because the recipe is usually written somewhere else;
- a **pinned hub id**: ``ORG/NAME`` plus a 40-hex revision given on the command line
  (``--revision`` / ``--teacher-revision``).

URLs (``https://``, ``hf://``, ``s3://``, ``file://``, ...), ``..`` escapes, absolute
paths outside the folder, home-relative paths (``~``), and anything else are refused:
the written recipe never carries such a value. This module decides; it does not read
configs, write reports or contact a hub.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

HEX40 = re.compile(r"^[0-9a-f]{40}$")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
# `scheme:` at the start: https://, hf://, s3://, file://, but also `hf:org/name`.
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")

LOCAL_OR_HUB = (
    "a local directory inside the config's folder (e.g. ./models/student) or a hub id "
    "ORG/NAME pinned with a 40-hex revision"
)


@dataclass(frozen=True)
class Trusted:
    """A location the importer accepts: ``source`` is the recipe's ModelSource dict."""

    source: dict
    label: str  # exact | derived
    note: str


@dataclass(frozen=True)
class Refused:
    """A location the importer refuses: ``label`` is refused or unsupported."""

    label: str
    note: str


def check_location(
    value: object, *, key: str, base_dir: Path, revision: str | None, revision_flag: str
) -> Trusted | Refused:
    """Decide whether ``value`` (field ``key``) may enter a recipe; never raises."""
    if not isinstance(value, str) or not value.strip():
        return Refused("unsupported", f"{key} must be a non-empty string: {LOCAL_OR_HUB}")
    if any(ord(ch) < 32 for ch in value):
        return Refused("refused", f"control character in {key}; write {LOCAL_OR_HUB}")
    if URL_SCHEME.match(value) or "://" in value:
        return Refused(
            "refused",
            f"URL {value!r}: the importer fetches nothing a config names; download the "
            f"weights into the config's folder and name that directory, or use a hub id "
            f"ORG/NAME with {revision_flag}",
        )
    if "\\" in value:
        return Refused(
            "refused", f"backslash in {value!r}: write a POSIX path ({LOCAL_OR_HUB})"
        )
    if HUB_ID.match(value) and not value.startswith("."):
        return _hub_id(value, revision, revision_flag)
    return _local_dir(value, base_dir)


def _hub_id(value: str, revision: str | None, revision_flag: str) -> Trusted | Refused:
    if revision is None or not HEX40.match(revision):
        return Refused(
            "unsupported",
            f"hub id {value!r} needs a pinned 40-hex revision; pass {revision_flag} with the "
            "commit to use (for a local directory of that name write ./" + value + ")",
        )
    return Trusted(
        {"hub_id": value, "revision": revision}, "derived", "hub id pinned with the given revision"
    )


def _local_dir(value: str, base_dir: Path) -> Trusted | Refused:
    if value.startswith("~"):
        return Refused(
            "refused",
            f"home-relative path {value!r} points outside the config's folder; move the "
            "directory under that folder and name it relatively (./...)",
        )
    pure = PurePosixPath(value)
    if ".." in pure.parts or ".." in PureWindowsPath(value).parts:
        return Refused(
            "refused",
            f"'..' in {value!r} escapes the config's folder; name a directory inside it "
            "(./...) or a pinned hub id",
        )
    base = base_dir.resolve()
    candidate = Path(value) if pure.is_absolute() else base / value
    resolved = candidate.resolve()
    if not resolved.is_relative_to(base):
        where = "resolves (through a symlink)" if not pure.is_absolute() else "is"
        return Refused(
            "refused",
            f"{value!r} {where} outside the config's folder {base}; place the model "
            "directory itself under that folder (a symlink out of it is refused) or use a "
            "pinned hub id",
        )
    if not resolved.is_dir():
        return Refused(
            "refused",
            f"local model directory {value!r} does not exist under {base}; create it (a "
            "Hugging Face model directory) before importing, or use a pinned hub id",
        )
    return Trusted(
        {"path": str(resolved)},
        "exact" if str(resolved) == value else "derived",
        f"local directory inside the config's folder (recipe holds {resolved})",
    )
