"""CLI: `miniverl report`, `miniverl benchmark`, `miniverl export-benchmark`, `schema benchmark`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from miniverl.cli.app import app
from miniverl.common.errors import ConfigError, MiniverlError
from miniverl.student.benchmark import run as benchmark_run
from miniverl.student.benchmark.results import BenchmarkResults, CellResult
from tests.student.report import report_runs

runner = CliRunner()


def test_report_writes_html_and_markdown(tmp_path: Path) -> None:
    run = report_runs.make_run(tmp_path / "run")
    (run / "events.jsonl").unlink()
    out, md = tmp_path / "r.html", tmp_path / "r.md"
    result = runner.invoke(app, ["report", str(run), "--out", str(out), "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    assert f"report: {out}" in result.output
    assert "note: events.jsonl is missing" in result.output  # missing inputs are named
    assert out.read_text().startswith("<!DOCTYPE html>") and md.read_text().startswith(
        "# Run report"
    )


def test_report_default_path_is_inside_the_run(tmp_path: Path) -> None:
    run = report_runs.make_run(tmp_path / "run")
    assert runner.invoke(app, ["report", str(run)]).exit_code == 0
    assert (run / "report.html").is_file()


@pytest.mark.slow
def test_report_on_a_missing_run_is_one_line_and_exit_1(tmp_path: Path) -> None:
    # Through the real entry point: a user error prints one line, no traceback.
    proc = subprocess.run(
        [sys.executable, "-m", "miniverl.cli.app", "report", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: run directory") and "Traceback" not in proc.stderr


def test_benchmark_with_a_fake_trainer_and_resume(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"run": {"name": "b", "mode": "sft"}}))
    config = tmp_path / "bench.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "cli",
                "recipe": "base.yaml",
                "baseline": "sft",
                "seeds": [0, 1],
                "budget": {"kind": "updates", "updates": 2},
                "arms": [{"name": "sft", "mode": "sft"}, {"name": "opd", "mode": "opd"}],
            }
        )
    )
    calls: list[str] = []

    class FakeCells:
        def __init__(self, endpoint, work_dir, **prepared):
            pass

        def __call__(self, recipe, seed):
            calls.append(recipe["run"]["name"])
            if len(calls) == 3 and not (tmp_path / "resumed").exists():
                raise RuntimeError("cell crashed")
            gain = 0.1 if recipe["run"]["mode"] == "opd" else 0.0
            return CellResult(updates=2, success_before=0.1, success_after=0.3 + gain + 0.01 * seed)

        def close(self):
            pass

    monkeypatch.setattr(benchmark_run, "TrainerCells", FakeCells)
    out = tmp_path / "out"
    result = runner.invoke(app, ["benchmark", str(config), "--output-dir", str(out)])
    assert result.exit_code == 1  # one failed cell: the benchmark is incomplete
    assert "cell sft seed 1: failed (RuntimeError: cell crashed)" in result.output
    (tmp_path / "resumed").touch()
    result = runner.invoke(app, ["benchmark", str(config), "--output-dir", str(out), "--resume"])
    assert result.exit_code == 0, result.output
    assert len(calls) == 5 and "| opd | 2 | 0 |" in result.output
    assert BenchmarkResults.model_validate_json((out / "results.json").read_text()).complete
    again = runner.invoke(app, ["benchmark", str(config), "--output-dir", str(out)])
    assert isinstance(again.exception, ConfigError)


def test_export_benchmark_and_schema(tmp_path: Path) -> None:
    run = report_runs.make_run(tmp_path / "run")
    out = tmp_path / "shared.json"
    result = runner.invoke(app, ["export-benchmark", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    exported = json.loads(out.read_text())
    assert exported["kind"] == "miniverl.hardware_result"
    assert str(tmp_path) not in out.read_text()
    schema = runner.invoke(app, ["schema", "benchmark"])
    assert schema.exit_code == 0
    assert json.loads(schema.output)["title"] == "HardwareResult"
    missing = runner.invoke(app, ["export-benchmark", str(tmp_path / "nope"), "--out", str(out)])
    assert isinstance(missing.exception, MiniverlError)
