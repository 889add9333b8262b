"""sha256 helpers for bytes, files, directory trees, canonical JSON and ``SHA256SUMS``.

Digests are lowercase hex without a prefix; callers that store them in manifests
write ``"sha256:" + hex`` (:func:`prefixed`). ``SHA256SUMS`` uses the coreutils format
(``<hex>  <relative path>``), so ``sha256sum -c SHA256SUMS`` checks a bundle without
miniverl. :func:`seal` / :func:`seal_status` put a record's own digest inside it (a
trajectory line, the manifest, a checkpoint's ``state.json``). This module does not
decide what a digest means or when to check it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CHUNK = 1 << 20
SUMS_NAME = "SHA256SUMS"


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


def canonical_json(obj: object) -> str:
    """One stable text for a JSON value: sorted keys, no spaces, UTF-8 kept as is."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_json(obj: object) -> str:
    """Digest of :func:`canonical_json` of ``obj``."""
    return sha256_text(canonical_json(obj))


SEAL_FIELD = "digest"


def seal(record: dict, field: str = SEAL_FIELD) -> dict:
    """``record`` plus ``field`` = ``sha256:`` of the canonical JSON of the rest.

    The digest covers values, not formatting: re-indenting the file keeps it valid,
    changing any key or value does not. An existing ``field`` is replaced.
    """
    body = {k: v for k, v in record.items() if k != field}
    return {**body, field: prefixed(sha256_json(body))}


def seal_status(record: dict, field: str = SEAL_FIELD, *, required: bool = False) -> str:
    """``"ok"``, ``"unsigned"`` (no ``field``: written before files were sealed) or
    ``"mismatch"`` (the record changed after it was sealed).

    ``required``: the record's format version says it was sealed, so a missing ``field``
    is a mismatch too (one flipped byte in the field's name must not pass as "old file").
    """
    if field not in record:
        return "mismatch" if required else "unsigned"
    body = {k: v for k, v in record.items() if k != field}
    return "ok" if record[field] == prefixed(sha256_json(body)) else "mismatch"


def write_sums(root: str | Path) -> Path:
    """Hash every file under ``root`` (except the sums file) into ``root/SHA256SUMS``."""
    root = Path(root)
    lines = [
        f"{digest}  {rel}\n" for rel, digest in file_digests(root).items() if rel != SUMS_NAME
    ]
    out = root / SUMS_NAME
    out.write_text("".join(lines), encoding="utf-8")
    return out


def verify_sums(root: str | Path) -> list[str]:
    """Problems found by recomputing ``root/SHA256SUMS``: changed, missing and unlisted files.

    An empty list means every file matches and nothing was added or removed.
    """
    root = Path(root)
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
