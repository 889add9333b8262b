"""OS errors a user can fix become one line; anything else keeps its traceback."""

from __future__ import annotations

import errno

import pytest

from miniverl.common import atomic
from miniverl.common.errors import DiskFullError, MiniverlError
from miniverl.common.os_errors import disk_full, os_error_line


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (FileNotFoundError(errno.ENOENT, "x", "runs/a/b.json"), "runs/a/b.json: does not exist"),
        (IsADirectoryError(errno.EISDIR, "x", "runs"), "runs: is a directory"),
        (PermissionError(errno.EACCES, "x", "/root/f"), "/root/f: permission denied"),
        (OSError(errno.EROFS, "x", "/ro/f"), "/ro/f: is on a read-only file system"),
    ],
)
def test_fixable_errors_name_the_path_and_the_fix(exc, expected):
    line = os_error_line(exc)
    assert line is not None and line.startswith(expected) and ";" in line


def test_unknown_errors_are_left_to_the_traceback():
    # An I/O error or an errno-less OSError is more likely a bug than a user's mistake.
    assert os_error_line(OSError(errno.EIO, "Input/output error", "f")) is None
    assert os_error_line(OSError("no errno")) is None
    assert os_error_line(FileNotFoundError(errno.ENOENT, "no file named")) is None


def test_disk_full_names_path_and_free_space(tmp_path):
    exc = disk_full(tmp_path / "out.json")
    assert isinstance(exc, MiniverlError) and isinstance(exc, OSError)
    assert str(exc).startswith(f"no space left on device writing {tmp_path / 'out.json'} (")
    assert " free)" in str(exc) and "[Errno" not in str(exc)


def test_atomic_write_on_a_full_disk_raises_disk_full_and_leaves_nothing(tmp_path, monkeypatch):
    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(DiskFullError, match="out.json"):
        atomic.atomic_write_json(tmp_path / "out.json", {"a": 1})
    assert list(tmp_path.iterdir()) == []
