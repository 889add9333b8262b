"""CLI on sealed run files: a changed trajectory line or manifest makes `inspect`,
`report` and `eval` exit 1 with one line naming the file; old unsealed files still read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miniverl.cli.app import app
from miniverl.common.errors import ProvenanceError
from miniverl.common.rundir import RunDir
from tests.student.report import report_runs

runner = CliRunner()


def _flip_verdict(path: Path, line: int = 1) -> None:
    # The edit a hand or a flipped bit makes: valid JSON, valid trajectory, other meaning.
    lines = path.read_text().splitlines()
    record = json.loads(lines[line])
    record["verifier"]["success"] = not record["verifier"]["success"]
    lines[line] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_inspect_refuses_a_changed_line_in_one_line(tmp_path: Path) -> None:
    run = report_runs.make_run(tmp_path / "run")
    _flip_verdict(run / "trajectories.jsonl")
    proc = subprocess.run(
        [sys.executable, "-m", "miniverl.cli.app", "inspect", str(run / "trajectories.jsonl")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: {run / 'trajectories.jsonl'}:2: the line does not match")


def test_report_writes_the_page_but_exits_1_on_a_changed_line(tmp_path: Path) -> None:
    run = report_runs.make_run(tmp_path / "run")
    _flip_verdict(run / "trajectories.jsonl", line=2)
    result = runner.invoke(app, ["report", str(run)])
    assert isinstance(result.exception, ProvenanceError)
    assert "trajectories.jsonl:3: the line does not match its digest" in str(result.exception)
    assert "does not match its digest" in (run / "report.html").read_text()


def test_report_exits_1_on_a_changed_or_broken_manifest(tmp_path: Path) -> None:
    run = report_runs.make_run(tmp_path / "run")
    manifest = run / "manifest.json"
    original = manifest.read_text()
    assert '"mode": "opd"' in original
    manifest.write_text(original.replace('"mode": "opd"', '"mode": "sft"'))
    result = runner.invoke(app, ["report", str(run)])
    assert isinstance(result.exception, ProvenanceError), result.output
    assert "manifest.json does not match its digest" in str(result.exception)
    manifest.write_text(original[:-5])  # cut short
    result = runner.invoke(app, ["report", str(run)])
    assert isinstance(result.exception, ProvenanceError), result.output
    assert "manifest.json is not valid JSON" in str(result.exception)


def test_report_reads_old_unsealed_files_with_a_note(tmp_path: Path) -> None:
    run = report_runs.make_run(tmp_path / "run")
    path = run / "trajectories.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "digest"}) + "\n"
                            for r in rows))
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert f"{len(rows)} line(s) carry no digest" in result.output


def test_resume_and_eval_check_run_files_first(tmp_path: Path) -> None:
    # RunDir.verify is what resume and `eval` call before reading anything else.
    run = report_runs.make_run(tmp_path / "run")
    RunDir.open(run).verify()
    _flip_verdict(run / "trajectories.jsonl", line=0)
    try:
        RunDir.open(run).verify()
    except ProvenanceError as exc:
        assert "trajectories.jsonl:1:" in str(exc)
    else:
        raise AssertionError("a changed trajectory line passed RunDir.verify")
