"""Export provenance: the recorded rebuild commands run as written, and a bundle names the
prepared teacher a run actually trained against (not the raw toy spec it started from)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from miniverl.bridge import teacher_source
from miniverl.bridge.bundle import export_verl
from miniverl.bridge.doctor import doctor
from miniverl.common.errors import ConfigError
from miniverl.common.toy import toy_model_dir


def _bash(command: str, cwd: Path) -> subprocess.CompletedProcess:
    # `python` in a recorded command is the interpreter of the environment miniverl is in.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def _same_weights(a: Path, b: Path) -> bool:
    return teacher_source.weights_digest(a) == teacher_source.weights_digest(b)


def _fetch_lines(bundle: Path, cwd: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BASE_MODEL_DIR", "TEACHER_MODEL_DIR")}
    proc = subprocess.run(["bash", str(bundle / "recipe/launch.template.sh")], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    prefix = "  fetch them with: "
    return [line[len(prefix):] for line in proc.stderr.splitlines() if line.startswith(prefix)]


@pytest.mark.slow
def test_recorded_rebuild_commands_run_through_bash(toy_bundle, tmp_path):
    # The command in base_model.json once lost its JSON quotes in the shell
    # (NameError: name 'heads' is not defined); a user pastes it as written.
    base = json.loads((toy_bundle / "model/base_model.json").read_text())
    for identity, dest in ((base, "base-model"), (base["teacher"], "teacher-model")):
        proc = _bash(identity["download"], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert _same_weights(tmp_path / dest, toy_model_dir(identity["toy"]))


def test_launch_template_fetch_lines_run_through_bash(toy_bundle, tmp_path):
    # The template prints the same commands; pasted from its output they must work too.
    lines = _fetch_lines(toy_bundle, tmp_path)
    base = json.loads((toy_bundle / "model/base_model.json").read_text())
    assert lines == [base["download"], base["teacher"]["download"]]
    for line in lines:
        proc = _bash(line, tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert _same_weights(tmp_path / "base-model", toy_model_dir(base["toy"]))
    assert _same_weights(tmp_path / "teacher-model", toy_model_dir(base["teacher"]["toy"]))
    # With the weights fetched, the next thing a user lacks is usually verl itself: one
    # line that names the fix, not a Python traceback.
    if importlib.util.find_spec("verl") is None:
        proc = _bash("BASE_MODEL_DIR=base-model TEACHER_MODEL_DIR=teacher-model bash "
                     f"{toy_bundle}/recipe/launch.template.sh", tmp_path)
        assert proc.returncode == 1
        assert proc.stderr.splitlines() == [
            "error: verl is not installed; this bundle needs verl==0.8.0 (pip install verl==0.8.0)"
        ]


# ------------------------------------------------------------------ prepared teacher


def test_bundle_names_the_prepared_teacher(prepared_run, tmp_path, monkeypatch):
    run, prepared = prepared_run
    bundle = tmp_path / "bundle"
    export_verl(run, bundle)
    teacher = json.loads((bundle / "model/base_model.json").read_text())["teacher"]
    assert teacher["source"] == "prepared" and teacher["name"] == prepared.name
    assert teacher["prep_recipe"] == "toy_cpu_opd_teacher.yaml"  # a name, not a local path
    assert teacher["prep_digest"] == "sha256:" + "ab" * 32
    assert teacher["steps"] == 40 and teacher["eval_success"] == 0.95
    assert teacher["model_dir_sha256"] == teacher_source.weights_digest(prepared)
    assert teacher["qualification"]["success"] == 0.95
    assert teacher["prepared_from"]["source"] == "toy"
    # Its fetch command, as recorded and as the launch template prints it, copies exactly
    # the weights the run trained against.
    work = tmp_path / "work"
    work.mkdir()
    assert teacher["download"] in _fetch_lines(bundle, work)
    proc = _bash(teacher["download"], work)
    assert proc.returncode == 0, proc.stderr
    assert _same_weights(work / "teacher-model", prepared)
    monkeypatch.delenv("BASE_MODEL_DIR", raising=False)
    result = doctor(bundle)
    assert result["ok"], [c for c in result["checks"] if c["status"] != "pass"]


def test_export_refuses_a_prepared_teacher_gone_from_the_cache(prepared_run, tmp_path):
    run, prepared = prepared_run
    (prepared / teacher_source.PREPARED_FILE).unlink()
    with pytest.raises(ConfigError, match=f"prepared teacher {prepared.name}.*qualify-teacher"):
        export_verl(run, tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()


def test_a_raw_teacher_stays_named_by_its_spec(toy_bundle):
    teacher = json.loads((toy_bundle / "model/base_model.json").read_text())["teacher"]
    assert teacher["source"] == "toy" and "prepared_from" not in teacher
