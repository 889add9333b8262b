"""``miniverl train``, ``python -m miniverl.student`` and ``miniverl eval`` as a user runs them.

Each test starts a real Python process (the CLI's promises are about processes: exit
codes, one-line errors, nothing imported by a dry run), hence the integration marker.
A tiny sft recipe keeps the real training runs to seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.toy_kit import MINIVERL, recipe_dict, write_recipe

pytestmark = pytest.mark.integration


def recipe_file(tmp_path: Path, mode: str, **train) -> Path:
    recipe = recipe_dict(mode, tmp_path / "runs", cycles=2, **train)
    recipe["run"]["deterministic"] = False
    return write_recipe(tmp_path / f"{mode}.yaml", recipe)


def run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def miniverl(*args: str) -> list[str]:
    return [*MINIVERL, *args]


def test_dry_run_prints_the_plan_and_loads_nothing(tmp_path):
    recipe = recipe_file(tmp_path, "opd")
    # Run the CLI in a process that reports afterwards whether torch was ever imported.
    probe = (
        "import sys\n"
        "from miniverl.cli.app import main\n"
        f"sys.argv = ['miniverl', 'train', {str(recipe)!r}, '--dry-run']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print('TORCH_IMPORTED' if 'torch' in sys.modules else 'TORCH_NOT_IMPORTED')\n"
    )
    proc = run([sys.executable, "-c", probe])
    assert proc.returncode == 0, proc.stderr
    assert "dry run: nothing was loaded" in proc.stdout
    assert "TORCH_NOT_IMPORTED" in proc.stdout
    assert "--teacher" in proc.stdout  # opd without an endpoint: the plan says how to give one
    assert not (tmp_path / "runs").exists()


def test_opd_without_a_teacher_exits_1_with_one_line(tmp_path):
    proc = run(miniverl("train", str(recipe_file(tmp_path, "opd"))))
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "--teacher" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_python_m_student_trains_and_miniverl_eval_reads_the_run(tmp_path):
    recipe = recipe_file(tmp_path, "sft")
    proc = run([sys.executable, "-m", "miniverl.student", str(recipe), "--run-id", "cli",
                "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    assert "2 optimizer steps, parameter version 2" in proc.stdout
    run_dir = tmp_path / "runs" / "cli"
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"

    proc = run(miniverl("eval", "--run", str(run_dir), "--json"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["policy_version"] == 2 and summary["split"] == "eval"
    assert summary["n"] == 2 and 0.0 <= summary["success"] <= 1.0

    proc = run(miniverl("eval", "--run", str(run_dir), "--split", "test"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("test: success")


def test_miniverl_eval_without_a_checkpoint_exits_1(tmp_path):
    proc = run(miniverl("eval", "--run", str(tmp_path / "nowhere")))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr


def test_python_m_student_refuses_a_teacher_mode_without_endpoint(tmp_path):
    proc = run([sys.executable, "-m", "miniverl.student", str(recipe_file(tmp_path, "replay",
                                                                           max_lag=1))])
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error:") and "needs a teacher" in proc.stderr
