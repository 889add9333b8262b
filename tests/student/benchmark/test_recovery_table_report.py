"""benchmarks/recovery_table_report.py prints docs/recoverybench.md's results table from
the analysis record, with the one table annotation the docs test prints it again from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import recovery_table_report as report  # noqa: E402

from tests.docs.figures import TABLE_ANNOTATION  # noqa: E402

RECORD = "benchmarks/results/recovery_bench_256.json"


def test_the_table_is_the_records_figures_with_one_annotation(capsys):
    assert report.main(["--record", RECORD, "--commit", "1307d68"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 4  # header, rule, one row per arm
    assert rows[2].startswith("| `sft` | 38.8% [19.9%, 70.3%] | +38.8 [+19.9, +70.1] | "
                              "+38.8 [+36.1, +41.7] |")
    assert "| `frozen_kd` | 0.0% [0.0%, 0.0%] | (baseline) | (baseline) |" in out
    assert rows[-1].endswith("| 263 (133 / 0.6 / 56) | 373,437, 59.4 |")
    (note,) = TABLE_ANNOTATION.finditer(out)
    assert (note["path"], note["commit"]) == (RECORD, "1307d68") and RECORD in note["command"]


def test_a_missing_or_foreign_record_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        report.main(["--record", str(tmp_path / "none.json")])
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(SystemExit, match="holds no arms"):
        report.main(["--record", str(tmp_path / "x.json")])
