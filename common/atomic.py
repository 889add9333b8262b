"""Atomic file writes: write a temporary file beside the target, fsync, rename.

A reader sees either the old file or the new one, never half of one, even if the
writer is killed mid-write. This module does not lock; callers that need mutual
exclusion hold the run lock (:mod:`miniverl.common.rundir`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Replace ``path`` with ``data`` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        # A failed write must not leave a stray temp file next to the real one.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``text`` atomically."""
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    """Replace ``path`` with ``obj`` as JSON (sorted keys off, trailing newline)."""
    text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False)
    return atomic_write_text(path, text + "\n")
