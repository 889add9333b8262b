"""benchmarks/xvocab_report.py prints docs/cross-tokenizer.md's results tables from the
cross-tokenizer benchmark's analyses, each with the one table annotation the docs test
prints it again from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import xvocab_report as report  # noqa: E402

from tests.docs.figures import TABLE_ANNOTATION  # noqa: E402


def test_the_table_is_the_analysis_figures_with_one_annotation(capsys):
    record = "benchmarks/results/xvocab_v3_bench.json"
    assert report.main(["--record", record, "--commit", "d0e7d83"]) == 0
    out = capsys.readouterr().out
    assert ("| `opd_xvocab` | 0.430 → 0.497 | 0.430, 0.547, 0.516 | 1.000 → 0.938 | "
            "-0.141 [-0.234, -0.078] | 97.5% | 51.9% | 141.8 |") in out
    assert "| `sft` | 0.430 → 0.638 | 0.664, 0.625, 0.625 | 1.000 → 1.000 | - | - | - | 2.3 |" in out
    (note,) = TABLE_ANNOTATION.finditer(out)
    assert (note["path"], note["commit"]) == (record, "d0e7d83")


def test_a_missing_record_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        report.main(["--record", str(tmp_path / "none.json")])
