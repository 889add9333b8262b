"""benchmarks/toy_learning_report.py prints docs/toy-learning.md's tables of toy runs from
their records, each with the one table annotation the docs test prints it again from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import toy_learning_report as report  # noqa: E402

from tests.docs.figures import TABLE_ANNOTATION  # noqa: E402

RECORD = "benchmarks/results/toy_learning_more_seeds.json"


def test_one_row_per_run_with_one_annotation(capsys):
    assert report.main(["--record", RECORD, "--commit", "21053d7"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert "optimizer steps (warm-up + 40)" in rows[0] and len(rows) == 2 + 6
    assert rows[2] == "| 4 | 0% -> 100% (32/32) | 110.6 s | 63.8 s | 339 | 0.70 -> 0.84 |"
    assert rows[3] == "| 5 | 0% -> 100% (32/32) | 95.7 s | cached | 322 | 0.69 -> 0.86 |"
    (note,) = TABLE_ANNOTATION.finditer(out)
    assert (note["path"], note["commit"]) == (RECORD, "21053d7")


def test_a_missing_record_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        report.main(["--record", str(tmp_path / "none.json")])
