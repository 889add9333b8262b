"""``miniverl status RUN`` on a run that is not running: a summary a user can act on
(steps on- and off-policy, success before -> after, wall time, where the artifacts are),
not just the word "completed"."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from miniverl.cli.app import app
from miniverl.common.manifest import finish_manifest, record_teacher
from miniverl.common.recipe import Recipe
from miniverl.common.rundir import RunDir

runner = CliRunner()
WARMUP, CYCLES = 12, 30


def _ts(second: int) -> str:
    return f"2025-01-31T12:{second // 60:02d}:{second % 60:02d}.000Z"


@pytest.fixture
def finished(tmp_path) -> RunDir:
    """An OPD run with a 12-step warm-up and 30 strict steps, written as a trainer does."""
    recipe = Recipe.model_validate({
        "run": {"name": "st", "mode": "opd"},
        "student": {"model": {"toy": {}}, "device": "cpu"},
        "teacher": {"model": {"toy": {}}, "device": "cpu"},
        "train": {"sft_warmup_steps": WARMUP, "cycles": CYCLES},
    })
    run = RunDir.create(tmp_path / "runs", recipe)
    run.set_status("running")
    events = [{"ts": _ts(0), "event": "run_started", "version": 0},
              {"ts": _ts(2), "event": "eval", "version": 0, "split": "eval", "success": 0.0,
               "n": 32},
              {"ts": _ts(80), "event": "eval", "version": 42, "split": "eval",
               "success": 0.9375, "n": 32},
              {"ts": _ts(81), "event": "run_completed", "version": 42, "steps": 42}]
    run.events_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    for step in range(1, WARMUP + CYCLES + 1):
        warm = step <= WARMUP
        run.metric({"step": step, "version": step, "mode": "opd", "on_policy": not warm,
                    "phase": "sft_warmup" if warm else "train", "loss": 0.1})
    record_teacher(run, WARMUP, {"name": "toy", "instance": "i", "gen": 0}, how="connect")
    finish_manifest(run, 42, mode_on_policy=True, on_policy_steps=CYCLES,
                    off_policy_steps=WARMUP)
    (run.checkpoints_dir / "step_42").mkdir()
    (run.checkpoints_dir / "step_42" / "state.json").write_text("{}")
    run.report_path.write_text("<html></html>")
    run.set_status("completed")
    return run


def test_a_finished_run_gets_a_summary(finished):
    result = runner.invoke(app, ["status", str(finished.path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{finished.id}: completed (not running")
    text = result.output
    assert "42 optimizer steps (30 on-policy, 12 off-policy: the SFT warm-up)" in text
    assert "parameter version 42" in text
    assert "0.0% -> 93.8% (v0 -> v42), greedy on the eval split, 32 tasks" in text
    assert "wall time  81.0 s" in text
    assert "report.html" in text and "checkpoints/step_42 (the last checkpoint)" in text
    assert str(finished.path) in text


def test_the_summary_as_json(finished):
    result = runner.invoke(app, ["status", str(finished.path), "--json"])
    data = json.loads(result.output)
    assert data["live"] is False and data["status"] == "completed"
    assert data["steps"]["on_policy"] == CYCLES and data["steps"]["off_policy"] == WARMUP
    assert (data["success"]["before"], data["success"]["after"]) == (0.0, 0.9375)
    assert data["artifacts"]["checkpoint"] == str(finished.checkpoints_dir / "step_42")


def test_a_stopped_run_says_why_and_how_to_continue(tmp_path):
    recipe = Recipe.model_validate({"run": {"name": "st", "mode": "sft"},
                                    "student": {"model": {"toy": {}}, "device": "cpu"}})
    run = RunDir.create(tmp_path / "runs", recipe)
    run.set_status("running")
    run.metric({"step": 1, "version": 1, "mode": "sft", "on_policy": False})
    run.set_status("interrupted", reason="KeyboardInterrupt")
    text = runner.invoke(app, ["status", str(run.path)]).output
    assert "interrupted" in text and "reason     KeyboardInterrupt" in text
    assert f"--resume --run-id {run.id}" in text
    assert "1 optimizer steps (0 on-policy, 1 off-policy)" in text
    assert "success" not in text  # it never evaluated: no line rather than a made-up one



@pytest.mark.parametrize("counts", [{"on_policy": None, "off_policy": 12},
                                    {"on_policy": "30", "off_policy": 12}, {}, None])
def test_damaged_counts_and_rows_are_recounted_not_a_traceback(finished, counts):
    # The module's promise: a damaged file never turns `status` into a traceback; step
    # counts that are not numbers are recounted from metrics.jsonl.
    from miniverl.cli.run_status import _steps

    with finished.metrics_path.open("a") as fh:
        fh.write(json.dumps({"step": [7], "on_policy": True, "phase": "sft_warmup"}) + "\n")
    steps = _steps(finished.metrics(), {"steps": counts, "final_version": 42})
    assert (steps["total"], steps["on_policy"], steps["off_policy"], steps["sft_warmup"]) == (
        42, CYCLES, WARMUP, WARMUP)
    assert runner.invoke(app, ["status", str(finished.path)]).exit_code == 0
