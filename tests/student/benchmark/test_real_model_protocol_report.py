"""benchmarks/real_model_protocol_report.py prints docs/real-models.md's protocol table
from its record, with the one table annotation the docs test prints it again from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import real_model_protocol_report as report  # noqa: E402

from tests.docs.figures import TABLE_ANNOTATION  # noqa: E402

RECORD = "benchmarks/results/real_model_protocol.json"


def test_one_row_per_measurement_the_request_named_once(capsys):
    assert report.main(["--record", RECORD, "--commit", "1628088"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert rows[2] == "| 1 episode (374 tokens), response | 39 | topk 16 | 2.13 | 1.79 | x0.84 | 154 |"
    assert rows[3] == "|  |  | topk 64 | 1.58 | 2.10 | x1.33 | 536 |"
    assert rows[4].endswith("| exact | 2.12 | 2.22 | x1.05 | 196,629 |")
    (note,) = TABLE_ANNOTATION.finditer(out)
    assert (note["path"], note["commit"]) == (RECORD, "1628088")


def test_a_missing_record_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        report.main(["--record", str(tmp_path / "none.json")])
