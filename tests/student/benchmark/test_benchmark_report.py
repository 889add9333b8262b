"""benchmarks/benchmark_report.py prints a committed benchmark's per-arm table as its own
summary.md holds it, with the one table annotation the docs test prints it again from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import benchmark_report as report  # noqa: E402

from tests.docs.figures import TABLE_ANNOTATION  # noqa: E402

RECORD = "benchmarks/results/toy/results.json"


def test_the_table_is_the_summarys_with_one_annotation(capsys):
    assert report.main(["--record", RECORD, "--commit", "d4fe514"]) == 0
    out = capsys.readouterr().out
    summary = (ROOT / "benchmarks/results/toy/summary.md").read_text()
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert rows == [line for line in summary.splitlines() if line.startswith("|")]
    (note,) = TABLE_ANNOTATION.finditer(out)
    assert (note["path"], note["commit"]) == (RECORD, "d4fe514")


def test_a_missing_or_foreign_record_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        report.main(["--record", str(tmp_path / "none.json")])
    (tmp_path / "x.json").write_text("[]")
    with pytest.raises(SystemExit, match="is not a benchmark's results.json"):
        report.main(["--record", str(tmp_path / "x.json")])
