"""Content hashes for the bridge: canonical JSON digests and ``SHA256SUMS`` files.

``SHA256SUMS`` uses the coreutils format (``<hex>  <relative path>``), so
``sha256sum -c SHA256SUMS`` inside a bundle checks it without miniverl. This module
hashes and compares; it does not decide what goes into a bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

SUMS_NAME = "SHA256SUMS"


def canonical_json(obj: object) -> str:
    """One stable text for a JSON value: sorted keys, no spaces, UTF-8 kept as is."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_json(obj: object) -> str:
    return sha256_text(canonical_json(obj))


def sha256_file(path: Path) -> str:
    """Hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: Path, obj: object) -> None:
    """Write indented JSON atomically (temp file + rename)."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(
        json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8"
    )
    os.replace(tmp, path)


def write_sums(root: Path) -> Path:
    """Hash every file under ``root`` (except the sums file) into ``root/SHA256SUMS``."""
    lines = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == SUMS_NAME:
            continue
        lines.append(f"{sha256_file(path)}  {rel}\n")
    out = root / SUMS_NAME
    out.write_text("".join(lines), encoding="utf-8")
    return out


def verify_sums(root: Path) -> list[str]:
    """Problems found by recomputing ``root/SHA256SUMS``: changed, missing and unlisted files.

    An empty list means every file matches and nothing was added or removed.
    """
    sums_path = root / SUMS_NAME
    if not sums_path.is_file():
        return [f"{SUMS_NAME} is missing"]
    problems: list[str] = []
    listed: set[str] = set()
    for lineno, line in enumerate(sums_path.read_text(encoding="utf-8").splitlines(), 1):
        hexdigest, sep, rel = line.partition("  ")
        if not sep or len(hexdigest) != 64 or not rel:
            problems.append(f"{SUMS_NAME}:{lineno}: malformed line")
            continue
        if rel.startswith("/") or ".." in Path(rel).parts:
            problems.append(f"{SUMS_NAME}:{lineno}: path escapes the bundle: {rel}")
            continue
        listed.add(rel)
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: listed but missing")
        elif sha256_file(path) != hexdigest:
            problems.append(f"{rel}: sha256 differs from {SUMS_NAME}")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != SUMS_NAME and rel not in listed:
            problems.append(f"{rel}: present but not listed in {SUMS_NAME}")
    return problems
