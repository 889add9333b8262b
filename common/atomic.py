"""Atomic file writes: write a temporary file beside the target, fsync, rename.

A reader sees either the old file or the new one, never half of one, even if the
writer is killed mid-write. Files are private to their owner by default (``0o600``:
run directories may hold endpoints, paths and tokens); ``shared=True`` gives the
permissions a plain ``open(path, "w")`` would (``0o666`` less the umask), for exports
that are meant to be handed to other people. This module does not lock; callers that need mutual
exclusion hold the run lock (:mod:`miniverl.common.rundir`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .os_errors import disk_full, is_disk_full


@contextlib.contextmanager
def publishing(out: str | Path, *, folder: bool = False) -> Iterator[Path]:
    """A temporary file (or ``folder``) beside ``out`` to build it in; renamed onto ``out``
    when the ``with`` body succeeds.

    On any failure the temporary file or folder is removed and ``out`` is left as it was,
    so a reader never sees half an output; a full disk becomes :class:`DiskFullError`
    naming ``out``. A folder replaces only a missing or empty ``out``.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    else:
        tmp = out.parent / f".{out.name}.{secrets.token_hex(4)}.tmp"
    try:
        yield tmp
        if folder and out.is_dir():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException as exc:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if is_disk_full(exc):
            raise disk_full(out) from exc
        raise


def atomic_write_bytes(path: str | Path, data: bytes, *, shared: bool = False) -> Path:
    """Replace ``path`` with ``data`` atomically; returns the path."""
    path = Path(path)
    with publishing(path) as tmp:
        # O_EXCL on a random name, like mkstemp; the umask still applies to 0o666.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if shared else 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    return path


def atomic_write_text(
    path: str | Path, text: str, encoding: str = "utf-8", *, shared: bool = False
) -> Path:
    """Replace ``path`` with ``text`` atomically."""
    return atomic_write_bytes(path, text.encode(encoding), shared=shared)


def atomic_write_json(
    path: str | Path,
    obj: Any,
    indent: int | None = 2,
    *,
    default: Callable[[Any], Any] | None = None,
    allow_nan: bool = False,
    shared: bool = False,
) -> Path:
    """Replace ``path`` with ``obj`` as JSON (sorted keys off, UTF-8 kept, trailing newline).

    ``default`` and ``allow_nan`` are :func:`json.dumps`'s: by default a value JSON cannot
    hold (an object, NaN) raises instead of being written.
    """
    text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=allow_nan, default=default)
    return atomic_write_text(path, text + "\n", shared=shared)
