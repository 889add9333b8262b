"""benchmarks/demo_report.py prints docs/demo.md's table of measured demo runs from their
record, with the one table annotation the docs test prints it again from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import demo_report as report  # noqa: E402

from tests.docs.figures import TABLE_ANNOTATION  # noqa: E402

RECORD = "benchmarks/results/demo_learning.json"


def test_one_row_per_run_with_one_annotation(capsys):
    assert report.main(["--record", RECORD, "--commit", "53a3e83"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert rows[0].endswith("| strict OPD (8 updates) |") and len(rows) == 2 + 16
    assert rows[2] == ("| cold | 1 | 60.2 s | 0% -> 94% (30/32) | 100%, prepared in 35.9 s | "
                       "144 | 33.4 s | 7.4 s |")
    assert rows[12].startswith("| warm | 1 |") and "100% (cached)" in rows[12]
    assert rows[-1].startswith("| fast | - |")
    (note,) = TABLE_ANNOTATION.finditer(out)
    assert (note["path"], note["commit"]) == (RECORD, "53a3e83")


def test_a_missing_record_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        report.main(["--record", str(tmp_path / "none.json")])
