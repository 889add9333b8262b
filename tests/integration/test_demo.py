"""`miniverl demo`, the README's first command, works end to end on a fresh cache.

A user's first contact with the project: two real processes over ZeroMQ, a teacher
prepared from an empty cache, strict OPD, and a summary that says where everything is.
``--fast`` (the machinery only) runs in every test run; the learning demo, about a
minute, is marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def _demo(*flags: str) -> tuple[subprocess.CompletedProcess, Path]:
    # A short folder: the teacher's ipc socket lives in the run directory (107-byte limit).
    work = Path(tempfile.mkdtemp(prefix="mvld"))
    env = {**os.environ, "MINIVERL_CACHE": str(work / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "miniverl.cli.app", "demo", "--output", str(work / "out"), *flags],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, work


def _checked_run(proc: subprocess.CompletedProcess, work: Path) -> Path:
    out = proc.stdout
    assert "stale replies   0 dropped" in out
    (run_dir,) = (work / "out" / "runs").iterdir()
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    assert (run_dir / "report.html").is_file()
    assert str(run_dir) in out
    events = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert "teacher_prepared" in events and "teacher_connected" in events
    # The recipes the demo ran are written out for the user to read and rerun.
    assert (work / "out" / "recipes" / "demo.yaml").is_file()
    # Without a terminal the live board prints one line per phase of each process.
    assert "teacher  serving" in proc.stderr and "student  done" in proc.stderr
    return run_dir


@pytest.mark.integration
def test_demo_fast_runs_strict_opd_from_an_empty_cache():
    proc, work = _demo("--fast", "--seed", "3")
    run_dir = _checked_run(proc, work)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(row["on_policy"] for row in metrics)
    assert [row["version"] for row in metrics] == list(range(1, len(metrics) + 1))
    assert "on-policy: yes" in proc.stdout
    assert "--fast shows the machinery only" in proc.stdout
    assert "seed: 3" in (work / "out" / "recipes" / "demo.yaml").read_text()


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_teaches_the_student_from_an_empty_cache():
    proc, work = _demo()
    run_dir = _checked_run(proc, work)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert evals[0]["success"] <= 0.1 and evals[-1]["success"] >= 0.9, evals
    prepared = next(e for e in events if e["event"] == "teacher_prepared")
    assert prepared["eval_success"] >= 0.9 and not prepared["cached"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    distilled = [r for r in rows if r["phase"] == "train"]
    assert distilled and all(r["on_policy"] for r in distilled)
    # The warm-up is SFT on oracle traces, and the summary says so.
    assert "updates off-policy" in proc.stdout and "strict OPD)" in proc.stdout
    assert "--fast" not in proc.stdout
