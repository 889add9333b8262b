"""One line for the operating-system errors a user can fix: missing paths, permissions, full disks.

Every entry point (``miniverl``, ``python -m miniverl.student``, ``python -m
miniverl.teacher_server``) passes an :class:`OSError` that escaped a command through
:func:`os_error_line`: a missing file, a directory where a file was expected, a
permission, a read-only file system or a full disk becomes ``what, why, fix`` on one
line and exit code 1. Any other ``OSError`` gets ``None`` and keeps its traceback,
because it is more likely a bug than a user's mistake.

:func:`disk_full` builds the :class:`~miniverl.common.errors.DiskFullError` writers
raise: it names the path being written and the space left on its file system. This
module does not catch anything itself.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from .errors import DiskFullError

# errno -> (why, fix) for the errors a user causes and can undo.
_FIXABLE: dict[int, tuple[str, str]] = {
    errno.ENOENT: ("does not exist", "check the path"),
    errno.ENOTDIR: ("has a part that is not a directory", "check the path"),
    errno.EISDIR: ("is a directory, a file was expected", "pass a file"),
    errno.EACCES: ("permission denied", "fix the permissions or choose another path"),
    errno.EPERM: ("operation not permitted", "fix the permissions or choose another path"),
    errno.EROFS: ("is on a read-only file system", "choose a writable location"),
    errno.ENAMETOOLONG: ("name is too long", "choose a shorter path"),
    errno.ENOTEMPTY: ("directory is not empty", "choose a new path or empty it"),
    errno.EEXIST: ("already exists", "choose a new path or remove it"),
}
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def free_space(path: str | Path) -> str:
    """Free bytes, human readable, on the file system holding ``path`` (or its parents)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free: float = shutil.disk_usage(probe).free
    except OSError:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if free < 1024 or unit == "TiB":
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return "unknown"  # pragma: no cover - the loop always returns


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-space (or out-of-quota) error from the OS."""
    return isinstance(exc, OSError) and exc.errno in _FULL


def disk_full(path: str | Path) -> DiskFullError:
    """The error for a write to ``path`` that ran out of space."""
    return DiskFullError(
        errno.ENOSPC,
        f"no space left on device writing {path} ({free_space(path)} free); free some "
        "space or write somewhere else (--out / --output-dir)",
    )


def os_error_line(exc: OSError) -> str | None:
    """``what: why; fix`` for an OSError a user can fix, else ``None`` (a likely bug)."""
    path = exc.filename if exc.filename is not None else None
    if exc.errno in _FULL:
        if isinstance(exc, DiskFullError):
            return str(exc.strerror)
        if path is None:  # a failed write() names no file: report where we stand
            return (
                f"no space left on device ({free_space(Path.cwd())} free under "
                f"{Path.cwd()}); free some space or write somewhere else"
            )
        return (
            f"no space left on device writing {path} ({free_space(path)} free); free "
            "some space or write somewhere else"
        )
    if exc.errno not in _FIXABLE or path is None:
        return None
    why, fix = _FIXABLE[exc.errno]
    target = f" -> {exc.filename2}" if exc.filename2 else ""
    return f"{path}{target}: {why}; {fix}"
