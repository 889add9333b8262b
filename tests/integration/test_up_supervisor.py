"""The ``up`` supervisor's bookkeeping around its children, with stand-in processes.

No model is loaded: the "student" is a tiny Python child that dies the way a real one
can (SIGKILL from the OOM killer), and the run directory is real. What a user relies
on: a run whose student was killed is marked ``failed`` (not ``running`` forever) and
``up`` exits 128 + signal like a shell; ``up --resume`` of a run that is still going
is refused before it starts a second teacher on the live run's socket.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tests.toy_kit import TWO_LAYER, seeded, write_recipe

pytestmark = pytest.mark.integration

RECIPE = {
    "schema_version": 1,
    "run": {"name": "sup", "mode": "opd", "seed": 0},
    "student": {"model": {"toy": TWO_LAYER}, "device": "cpu", "lora": None},
    "teacher": {"model": {"toy": seeded(TWO_LAYER, 1)}, "device": "cpu"},
    "environment": {"name": "calculator", "train_tasks": 4, "eval_tasks": 2, "test_tasks": 2},
    "train": {"cycles": 2, "rollouts_per_cycle": 1},
}


def supervisor(tmp_path: Path, **kwargs):
    from miniverl.cli.supervisor import Supervisor

    path = write_recipe(tmp_path / "sup.yaml", RECIPE)
    return Supervisor(path, output_dir=str(tmp_path / "runs"), console=Console(quiet=True),
                      show_progress=False, echo=False, **kwargs)


def test_killed_student_fails_the_run(tmp_path):
    # `kill -9` of the student: the run says `failed` with a reason, exit code 137.
    from miniverl.common.rundir import RunDir

    sup = supervisor(tmp_path)
    sup.run = RunDir.create(sup.output_dir, sup.recipe, run_id="killed")
    sup.run.logs_dir.mkdir(exist_ok=True)
    sup.run.set_status("running")
    sup.student = sup._spawn([sys.executable, "-c",
                              "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                             "[student]", "student.log")
    assert sup._watch() == 128 + signal.SIGKILL
    status = json.loads((sup.run.path / "status.json").read_text())
    assert status["status"] == "failed" and "-9" in status["reason"], status
    events = [json.loads(line) for line in sup.run.events_path.read_text().splitlines()]
    assert events[-1]["event"] == "run_failed"


def test_resume_of_a_live_run_is_refused_before_any_process(tmp_path):
    # A second `up --resume` must not bind the live run's teacher socket.
    from miniverl.common.errors import RunLockedError
    from miniverl.common.rundir import RunDir

    sup = supervisor(tmp_path)
    live = RunDir.create(sup.output_dir, sup.recipe, run_id="live")
    with live.lock():
        again = supervisor(tmp_path, resume=True, run_id="live")
        with pytest.raises(RunLockedError):
            again.run_all()
        assert again.student is None and again.teacher is None
    assert not (live.path / "teacher.sock").exists()


def test_student_exit_code_passes_through(tmp_path):
    # A student that closed its run itself keeps its status and its exit code.
    from miniverl.common.rundir import RunDir

    sup = supervisor(tmp_path)
    sup.run = RunDir.create(sup.output_dir, sup.recipe, run_id="plain")
    sup.run.logs_dir.mkdir(exist_ok=True)
    sup.run.set_status("running")
    sup.run.set_status("failed", reason="ConfigError: bad")
    sup.student = sup._spawn([sys.executable, "-c", "raise SystemExit(1)"], "[student]",
                             "student.log")
    assert sup._watch() == 1
    status = json.loads((sup.run.path / "status.json").read_text())
    assert (status["status"], status["reason"]) == ("failed", "ConfigError: bad")


def test_teacher_use_needs_a_live_run(tmp_path):
    # `miniverl teacher use` on a run that is not running says so in one line.
    from typer.testing import CliRunner

    from miniverl.cli.app import app

    result = CliRunner().invoke(app, ["teacher", "use", str(tmp_path), "tcp://127.0.0.1:5555"])
    assert result.exit_code == 1
    assert "no live control socket" in str(result.exception)


def test_teacher_that_fails_to_load_fails_up_fast(tmp_path, monkeypatch):
    # A teacher that crashes while loading ends `up` at once with its last log lines,
    # stops the student (which trained nothing yet) and marks the run failed.
    import time

    import miniverl.cli.supervisor as supervisor_module
    from miniverl.common.errors import MiniverlError

    monkeypatch.setattr(supervisor_module, "START_FAILED_GRACE_S", 0.5)
    sup = supervisor(tmp_path, run_id="badteacher")
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "time.sleep(600)")  # a student busy in its first eval
    monkeypatch.setattr(sup, "_start_student", lambda: setattr(sup, "student", sup._spawn(
        [sys.executable, "-c", stubborn], "[student]", "student.log")))
    monkeypatch.setattr(sup, "_teacher_cmd", lambda: [
        sys.executable, "-c", "print('load_failed: not a model'); raise SystemExit(1)"])
    t0 = time.monotonic()
    with pytest.raises(MiniverlError, match="load_failed: not a model"):
        sup.run_all()
    assert time.monotonic() - t0 < 60
    assert sup.student.poll() is not None and sup.teacher.poll() == 1
    status = json.loads((sup.run.path / "status.json").read_text())
    assert status["status"] == "failed" and "while loading" in status["reason"], status


def test_teacher_waits_for_a_preparation_as_long_as_the_student_does(tmp_path):
    # A real model's preparation outlasts the 600 s startup default (SmolLM2: ~12 min on a
    # loaded 2-core machine); the teacher must not give up on the directory before the
    # student gives up on the teacher, or the run fails after the preparation succeeded.
    from miniverl.common.rundir import RunDir

    sup = supervisor(tmp_path)
    sup.recipe = sup.recipe.model_copy(update={"runtime": sup.recipe.runtime.model_copy(
        update={"teacher_startup_timeout_s": 600.0, "unavailable_timeout_s": 1800.0})})
    sup.run = RunDir.create(sup.output_dir, sup.recipe, run_id="waits")
    sup.endpoint = "ipc:///tmp/never-bound"
    sup.teacher_model_dir = tmp_path / "not-prepared-yet"
    cmd = sup._teacher_cmd()
    assert cmd[cmd.index("--wait-for-model") + 1] == "1800.0"
