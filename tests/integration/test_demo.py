"""`miniverl demo`, the README's first command, works end to end on a fresh cache.

A user's first contact with the project: two real processes over ZeroMQ, a teacher
prepared from an empty cache, strict OPD, and a summary that says where everything is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


@pytest.mark.integration
def test_demo_runs_strict_opd_from_an_empty_cache():
    # A short folder: the teacher's ipc socket lives in the run directory (107-byte limit).
    work = Path(tempfile.mkdtemp(prefix="mvld"))
    env = {**os.environ, "MINIVERL_CACHE": str(work / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "miniverl.cli.app", "demo", "--output", str(work / "out")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "on-policy: yes" in out
    assert "stale replies   0 dropped" in out
    (run_dir,) = (work / "out" / "runs").iterdir()
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    assert (run_dir / "report.html").is_file()
    assert str(run_dir) in out
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(row["on_policy"] for row in metrics)
    assert [row["version"] for row in metrics] == list(range(1, len(metrics) + 1))
    events = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert "teacher_prepared" in events and "teacher_connected" in events
    # The recipes the demo ran are written out for the user to read and rerun.
    assert (work / "out" / "recipes" / "demo.yaml").is_file()
