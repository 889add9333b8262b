"""benchmarks/real_model_learning_report.py prints docs/real-model-learning.md's two tables
from the benchmark's record, each with the one table annotation the docs test prints it
again from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import real_model_learning_report as report  # noqa: E402

from tests.docs.figures import TABLE_ANNOTATION  # noqa: E402

RECORD = "benchmarks/results/real_model_learning.json"


def test_the_arm_and_cell_tables_are_the_records_figures(capsys):
    assert report.main(["--record", RECORD, "--table", "arms", "--commit", "def4585"]) == 0
    arms = capsys.readouterr().out
    assert "| opd | 3/3 | 3.1% | 99.5% | +96.4 [+93.8, +99.0] | 663 s (730 s) |" in arms
    (note,) = TABLE_ANNOTATION.finditer(arms)
    assert note["command"].endswith("--table arms") and note["commit"] == "def4585"
    assert report.main(["--record", RECORD, "--table", "cells"]) == 0
    cells = capsys.readouterr().out
    assert ("| opd | 1 | 3.1% → 100.0% | +96.9 [+92.2, +100.0] | 730 s | 370 / 1 / 272 | "
            "100% of 64 | final_answer 64 |") in cells
    assert len([line for line in cells.splitlines() if line.startswith("|")]) == 2 + 9


def test_a_missing_record_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        report.main(["--record", str(tmp_path / "none.json"), "--table", "arms"])
