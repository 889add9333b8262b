"""Sampling against ``generate`` (benchmarks/sampling_vs_generate.py, docs/gpu.md).

Its small form times both arms on the same batch and writes a record whose fields the
page reads; both arms sample exactly the budget (the script refuses a run where one
does not); a bad shape is one line.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sampling_vs_generate as bench  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "sampling_vs_generate.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow  # imports torch and samples twice per arm: several seconds
def test_a_small_run_writes_both_arms(tmp_path):
    done = _run("--shapes", "2x8,3x4", "--pairs", "2", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "sampling_vs_generate.json").read_text())
    assert record["benchmark"] == "sampling_vs_generate" and record["pairs"] == 2
    assert [(r["batch"], r["new_tokens"]) for r in record["rows"]] == [(2, 8), (3, 4)]
    for row in record["rows"]:
        assert row["sampled_tokens"] == row["batch"] * row["new_tokens"]
        assert len(row["ours_s"]) == len(row["generate_s"]) == len(row["ratio_per_pair"]) == 2
        assert row["ours_tokens_per_s"] > 0 and row["generate_tokens_per_s"] > 0
        # The page prints each arm's median tokens/s and the median of the pairs' ratios
        # (the record's seconds are rounded to 0.1 ms: a tiny run's figure within 1%).
        for arm in ("ours", "generate"):
            assert math.isclose(row[f"{arm}_tokens_per_s"], statistics.median(
                row["sampled_tokens"] / x for x in row[f"{arm}_s"]), rel_tol=1e-2)
        assert math.isclose(row["ratio_ours_over_generate"],
                            statistics.median(row["ratio_per_pair"]), abs_tol=2e-3)
        assert math.isclose(row["ratio_of_totals"],
                            sum(row["generate_s"]) / sum(row["ours_s"]), rel_tol=1e-2)
    assert record["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": None,
                                  "environment": "calculator", "difficulty": "mixed",
                                  "split_seed": 0}
    assert "ours / generate" in done.stdout


def test_the_shapes_parse():
    assert bench.parse_shapes("32x64,8x128") == [(32, 64), (8, 128)]
    for bad in ("32", "32x", "0x8", "ax8", "8x-1"):
        with pytest.raises(ValueError, match="is not BATCHxTOKENS"):
            bench.parse_shapes(bad)


@pytest.mark.parametrize("args, said", [
    (["--shapes", "32y64"], "--shapes part '32y64' is not BATCHxTOKENS"),
    (["--pairs", "0"], "--pairs 0 must be at least 1"),
])
def test_a_bad_value_is_one_line(args, said, tmp_path):
    done = _run(*args, "--output-dir", str(tmp_path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and said in done.stderr
    assert not (tmp_path / "sampling_vs_generate.json").exists()
