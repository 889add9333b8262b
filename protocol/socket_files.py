"""The file an ``ipc://`` bind creates, and removing it when its process ends.

ZeroMQ unlinks an ipc socket file only when its context is terminated in an orderly
way; the teacher ends with ``os._exit`` and the student's control thread is a daemon,
so ``teacher.sock`` and ``control.sock`` used to stay in run directories. A server
calls :func:`bound_file` right after ``bind`` and :func:`remove_bound_file` on its way
out (normal exit, SIGTERM, error). The removal checks the file is still the one this
bind made (same device and inode), so a process that ends late never deletes the
socket of a newer one bound at the same path. After ``kill -9`` the file stays; the
next bind at that path replaces it (ZeroMQ unlinks a stale socket file before binding).

This module does not bind, connect or check endpoints (that is
:mod:`miniverl.protocol.endpoints`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BoundFile:
    """An ipc socket file as it was right after the bind."""

    path: Path
    device: int
    inode: int


def bound_file(endpoint: str | None) -> BoundFile | None:
    """The socket file behind ``endpoint`` (an ``ipc://`` path), or None for tcp/abstract."""
    if not endpoint or not endpoint.startswith("ipc://") or endpoint.startswith("ipc://@"):
        return None
    path = Path(endpoint[len("ipc://"):])
    try:
        info = path.stat()
    except OSError:
        return None
    return BoundFile(path, info.st_dev, info.st_ino)


def remove_bound_file(bound: BoundFile | None) -> bool:
    """Remove the socket file if it is still the one :func:`bound_file` saw; True if removed.

    A private short-path folder (``mvl-*`` in the temp dir, made when the run path is
    too long for a socket) is removed with it once empty.
    """
    if bound is None:
        return False
    try:
        info = bound.path.stat()
    except OSError:
        return False
    if (info.st_dev, info.st_ino) != (bound.device, bound.inode):
        return False  # another process bound this path since: its socket, not ours
    with contextlib.suppress(FileNotFoundError):
        os.unlink(bound.path)
    parent = bound.path.parent
    if parent.name.startswith("mvl-") and parent.parent == Path(tempfile.gettempdir()):
        with contextlib.suppress(OSError):
            parent.rmdir()
    return True
