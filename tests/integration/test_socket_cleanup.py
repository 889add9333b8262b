"""Socket files leave with their process: ``teacher.sock`` and ``control.sock``.

Users rely on a finished run directory holding no dead sockets, and on a teacher or
student started after a ``kill -9`` binding the same path without manual cleanup.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.toy_kit import ONE_LAYER, recipe_dict, spawn_teacher, toy_dir, write_recipe

pytestmark = pytest.mark.integration


def _wait_for(what: str, check, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_teacher_socket_removed_on_sigterm_and_replaced_after_kill9(tmp_path):
    model = toy_dir(ONE_LAYER, seed=0)
    sock = tmp_path / "teacher.sock"
    first = spawn_teacher(model, tmp_path, "first", endpoint=f"ipc://{sock}")
    second = None
    try:
        first.wait_ready()
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        assert sock.exists()  # kill -9 runs no cleanup: the file is stale now
        second = spawn_teacher(model, tmp_path, "second", endpoint=f"ipc://{sock}")
        assert second.wait_ready()["state"] == "READY"  # the stale file was replaced
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(30) == 0
        assert not sock.exists()
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_teacher_socket_removed_when_it_fails(tmp_path):
    # A model that cannot load ends the teacher with exit 1, after it bound its socket.
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    sock = tmp_path / "teacher.sock"
    teacher = spawn_teacher(empty, tmp_path, "broken", endpoint=f"ipc://{sock}")
    try:
        assert teacher.proc.wait(120) == 1, teacher.out.read_text()
    finally:
        teacher.stop()
    assert "bound" in teacher.events()  # it did bind, so there was a file to remove
    assert not sock.exists()


def _student(tmp_path: Path, name: str, cycles: int) -> tuple[subprocess.Popen, Path]:
    recipe = write_recipe(tmp_path / f"{name}.yaml",
                          recipe_dict("sft", tmp_path / "runs", cycles=cycles))
    cmd = [sys.executable, "-m", "miniverl.student", str(recipe), "--run-id", name,
           "--control", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    return proc, tmp_path / "runs" / name


def _control_path(run_dir: Path) -> Path | None:
    try:
        endpoint = json.loads((run_dir / "sockets.json").read_text())["control"]
    except (OSError, ValueError, KeyError):
        return None
    return Path(endpoint.removeprefix("ipc://"))


@pytest.mark.parametrize("how", ["completed", "sigterm"])
def test_control_socket_removed_when_the_student_ends(tmp_path, how):
    proc, run_dir = _student(tmp_path, how, cycles=3 if how == "completed" else 400)
    try:
        if how == "sigterm":
            _wait_for("control.sock", lambda: (p := _control_path(run_dir)) and p.exists())
            proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=300)[0].decode()
        assert proc.returncode == (0 if how == "completed" else 130), out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    control = _control_path(run_dir)
    assert control is not None and control.name == "control.sock"
    assert not control.exists()
