"""sha256 helpers for bytes, files and directory trees.

Digests are lowercase hex without a prefix; callers that store them in manifests
write ``"sha256:" + hex`` (:func:`prefixed`). This module does not decide what a
digest means or when to check it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8"))


def sha256_file(path: str | Path) -> str:
    """Digest of one file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_dir(path: str | Path, exclude: tuple[str, ...] = ()) -> str:
    """Digest of a directory tree: relative paths and file digests, in sorted order.

    Renaming, adding, removing or editing any file changes it; file timestamps and the
    directory's own location do not. ``exclude`` drops files whose name matches exactly.
    """
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        if file.name in exclude:
            continue
        rel = file.relative_to(root).as_posix()
        digest.update(f"{rel}\0{sha256_file(file)}\n".encode())
    return digest.hexdigest()


def file_digests(path: str | Path) -> dict[str, str]:
    """``{relative posix path: sha256}`` for every file under ``path`` (for SHA256SUMS)."""
    root = Path(path)
    return {
        f.relative_to(root).as_posix(): sha256_file(f)
        for f in sorted(p for p in root.rglob("*") if p.is_file())
    }


def prefixed(hex_digest: str) -> str:
    return hex_digest if hex_digest.startswith("sha256:") else f"sha256:{hex_digest}"
