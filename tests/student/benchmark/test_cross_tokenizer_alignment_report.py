"""benchmarks/cross_tokenizer_alignment_report.py prints docs/cross-tokenizer.md's alignment
table from its record, with the one table annotation the docs test prints it again from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cross_tokenizer_alignment_report as report  # noqa: E402

from tests.docs.figures import TABLE_ANNOTATION  # noqa: E402

RECORD = "benchmarks/results/cross_tokenizer_alignment.json"


def test_one_row_per_pair_with_one_annotation(capsys):
    assert report.main(["--record", RECORD, "--commit", "6473b16"]) == 0
    out = capsys.readouterr().out
    assert ("| toy byte → Qwen3 | 263 | 100.0% | 0.2% | 3,329 | 53.6% | 93.3% | 8.5% |"
            in out.splitlines())
    assert "| Qwen3 → SmolLM2 | 39,237 | 25.9% | 79.8% | 2,266 |" in out
    (note,) = TABLE_ANNOTATION.finditer(out)
    assert (note["path"], note["commit"]) == (RECORD, "6473b16")


def test_a_missing_record_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        report.main(["--record", str(tmp_path / "none.json")])
