"""Memory of one teacher process serving two adapters against two processes
(benchmarks/adapters_memory.py, docs/several-teachers.md): its small form starts both
arms, has each score a request per adapter, and writes the record the page reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # three teacher processes and two adapters: about 30 s
def test_the_small_form_measures_both_arms(tmp_path):
    pytest.importorskip("peft")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "adapters_memory.py"),
                           "--hidden", "64", "--layers", "2", "--output-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "two processes hold" in done.stdout
    record = json.loads((tmp_path / "adapters_memory.json").read_text())
    one, two = record["one_process_two_adapters"], record["two_processes"]
    assert (one["processes"], two["processes"]) == (1, 2)
    # Each process was measured after it scored (an RSS only grows by a few MiB there).
    assert all(b > 0 for b in one["rss_scored_bytes"] + two["rss_scored_bytes"])
    # Two interpreters and two copies of the base hold more than one of each.
    assert two["rss_scored_total_bytes"] > one["rss_scored_total_bytes"]
    base = record["base"]["parameter_bytes"]
    assert two["parameter_bytes"] == 2 * base
    assert one["parameter_bytes"] == base + sum(record["adapters"]["parameter_bytes"].values())
    assert record["ratio_rss_scored"] == pytest.approx(
        two["rss_scored_total_bytes"] / one["rss_scored_total_bytes"])
