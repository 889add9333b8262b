"""Starting a teacher process: READY before it is used, and a child that dies names its log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from miniverl.common.errors import TeacherUnavailable
from miniverl.student.teacher_process import (
    StudentExited,
    start_teacher,
    stop_teacher,
    teacher_command,
    wait_until_ready,
)

pytestmark = pytest.mark.integration  # starts real child processes


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_command_runs_the_teacher_module_with_this_interpreter() -> None:
    assert teacher_command(["--bind", "ipc:///x"]) == [
        sys.executable,
        "-m",
        "miniverl.teacher_server",
        "--bind",
        "ipc:///x",
    ]


def test_a_child_that_exits_while_loading_fails_at_once_naming_its_log(tmp_path: Path) -> None:
    # A crash during load must not look like a slow teacher: no waiting out the timeout.
    proc = _child("raise SystemExit(3)")
    proc.wait(30)
    log = tmp_path / "teacher.out"
    with pytest.raises(TeacherUnavailable, match="exited with code 3 while loading") as err:
        wait_until_ready(f"ipc://{tmp_path}/t.sock", proc, 60, log=log)
    assert str(log) in str(err.value)


def test_a_watched_student_that_exits_ends_the_wait(tmp_path: Path) -> None:
    # Under `miniverl up` there is no point in a teacher for a student that already failed.
    teacher = _child("import time; time.sleep(60)")
    student = _child("raise SystemExit(5)")
    student.wait(30)
    try:
        with pytest.raises(StudentExited) as err:
            wait_until_ready(
                f"ipc://{tmp_path}/t.sock", teacher, 60, log=tmp_path / "t", also_watch=student
            )
        assert err.value.code == 5
    finally:
        stop_teacher(teacher, timeout_s=5)


def test_start_teacher_stops_a_teacher_that_cannot_load(tmp_path: Path) -> None:
    # The real module with a model directory that does not exist: the error names the log,
    # which holds the teacher's own message, and no child is left behind.
    log = tmp_path / "teacher.out"
    with pytest.raises(TeacherUnavailable, match="while loading") as err:
        start_teacher(
            ["--model", str(tmp_path / "no-model"), "--device", "cpu", "--offline"],
            endpoint=f"ipc://{tmp_path}/t.sock",
            log=log,
            timeout_s=120,
        )
    assert str(log) in str(err.value) and log.read_text().strip()


def test_start_teacher_returns_a_ready_teacher(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.toy_kit import ONE_LAYER, toy_dir

    model_dir = toy_dir(ONE_LAYER)
    endpoint = f"ipc://{tmp_path}/t.sock"
    args = ["--model", str(model_dir), "--device", "cpu", "--dtype", "float32", "--threads", "1"]
    proc = start_teacher(args, endpoint=endpoint, log=tmp_path / "teacher.out", timeout_s=120)
    try:
        assert proc.poll() is None
        pong = wait_until_ready(endpoint, proc, 10, log=tmp_path / "teacher.out")
        assert pong["state"] == "READY"
    finally:
        stop_teacher(proc)
    assert proc.returncode is not None
