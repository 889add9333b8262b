"""Fatal errors still say why: a full disk, ``up --quiet``, and the two process entries.

A user whose disk fills up relies on the message naming the file being written and the
space left, with nothing half-written left behind; a user running ``up --quiet`` relies
on a failed run printing its reason even though child output is hidden; the ``python -m``
entries of the student and the teacher answer a bad recipe like ``miniverl`` does.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from rich.console import Console

from miniverl.cli.app import run

REV = "c1899de289a04d12100db370d81485cdf75e47ca"


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _verl_config(tmp_path):
    config = tmp_path / "verl.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "actor_rollout_ref.model.path": "Qwen/Qwen3-0.6B",
                "distillation.teacher_models.teacher_model.model_path": "Qwen/Qwen3-1.7B",
            }
        )
    )
    return config


def test_full_disk_during_import_names_path_and_free_space(tmp_path, monkeypatch, capsys):
    import miniverl.common.atomic as atomic

    real_fdopen = os.fdopen

    def full_disk(fd, *args, **kwargs):
        handle = real_fdopen(fd, *args, **kwargs)
        handle.write = _enospc  # the write itself fails, as on a full disk
        return handle

    monkeypatch.setattr(atomic.os, "fdopen", full_disk)
    out = tmp_path / "out" / "recipe.yaml"
    argv = ["import-verl", str(_verl_config(tmp_path)), "--out", str(out)]
    code = run([*argv, "--revision", REV, "--teacher-revision", REV])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.startswith("error: no space left on device writing ")
    assert str(out.parent / "import-report.json") in err and " free)" in err
    assert len(err.strip().splitlines()) == 1
    # Nothing half-written: no recipe, no report, no temporary file.
    assert list(out.parent.iterdir()) == []


def test_full_disk_during_convert_dataset_leaves_nothing(tmp_path, monkeypatch, capsys):
    import pyarrow.parquet as pq

    from miniverl.student.environments import make_tasks

    tasks = tmp_path / "tasks.jsonl"
    lines = [json.dumps(t.to_dict()) for t in make_tasks("calculator", "train", 2, "mixed", 0, {})]
    tasks.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(pq, "write_table", _enospc)
    dst = tmp_path / "out" / "t.parquet"
    code = run(["convert-dataset", str(tasks), str(dst), "--to", "verl",
                "--environment", "calculator"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"no space left on device writing {dst}" in err and " free)" in err
    assert list(dst.parent.iterdir()) == []


def _run_whose_report_fails(tmp_path, monkeypatch, error: OSError) -> Path:
    """A completed run's folder whose report cannot be built: ``build_report`` raises
    ``error``."""

    def report_fails(*_args, **_kwargs):
        raise error

    monkeypatch.setattr("miniverl.student.report.build.build_report", report_fails)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").write_text('{"status": "completed"}')
    return run_dir


def test_os_errors_a_user_can_fix_are_one_line(tmp_path, monkeypatch, capsys):
    # A write that names no file (a failed write() call) still says how much is free.
    no_space = OSError(errno.ENOSPC, "No space left on device")
    code = run(["report", str(_run_whose_report_fails(tmp_path, monkeypatch, no_space))])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: no space left on device (") and "free" in err


def test_unexpected_exceptions_are_not_swallowed(tmp_path, monkeypatch):
    # A bug must keep its traceback: only errors a user can fix become one line.
    bug = OSError(errno.EIO, "Input/output error")
    run_dir = _run_whose_report_fails(tmp_path, monkeypatch, bug)
    with pytest.raises(OSError, match="Input/output"):
        run(["report", str(run_dir)])


def _quiet_supervisor(tail: list[str], echo: bool = False):
    from miniverl.cli.supervisor import Supervisor

    console = Console(record=True, width=400)
    sup = Supervisor.__new__(Supervisor)
    sup.echo, sup._stopping, sup.console = echo, False, console
    sup.student = SimpleNamespace(pump=SimpleNamespace(tail=deque(tail)))
    sup.run = SimpleNamespace(logs_dir=Path("runs/x/logs"))
    return sup, console


def test_up_quiet_still_prints_why_the_student_failed():
    tail = ["loading", "error: recipe r.yaml: student.model: no config.json; fix the path", ""]
    sup, console = _quiet_supervisor(tail)
    sup._say_why(1)
    text = console.export_text()
    assert "student exited with code 1: error: recipe r.yaml: student.model" in text
    assert "student.log" in text


def test_up_without_quiet_does_not_repeat_the_error():
    # Without --quiet the child's line was already shown once.
    sup, console = _quiet_supervisor(["error: boom"], echo=True)
    sup._say_why(1)
    assert console.export_text().strip() == ""


@pytest.mark.integration
@pytest.mark.parametrize("module", ["miniverl.student", "miniverl.teacher_server"])
@pytest.mark.slow
def test_process_entries_answer_a_binary_recipe_with_one_line(tmp_path, module):
    recipe = tmp_path / "bin.yaml"
    recipe.write_bytes(b"\xdf\x00\xff" * 50)
    args = [str(recipe)] if module == "miniverl.student" else ["--recipe", str(recipe)]
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: recipe {recipe} is not UTF-8 text (byte 0); pass a recipe YAML file"
    ]
