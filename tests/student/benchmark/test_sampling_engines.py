"""benchmarks/sampling_engines.py without vLLM: its tables, read back from a record, and its
one-line refusals. Its measurements run under vLLM (the venv of
tests/engine/setup_vllm_venv.sh); the committed record is docs/rollouts.md's source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "sampling_engines.py"
# The sampling rows and the OPD runs were measured by two runs of the script, side by side.
RECORDS = [ROOT / "benchmarks" / "results" / name
           for name in ("sampling_engines.json", "sampling_engines_opd.json")]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("record_path", RECORDS, ids=lambda p: p.name)
def test_the_tables_of_a_committed_record_print_every_row_it_measured(record_path):
    done = _run("--table", str(record_path))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(record_path.read_text())
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    sampled = sum(len(part["rows"]) for part in record["models"].values())
    opd = 2 * len(record["opd_update"])
    # A header and a rule above each table the record has, then its rows.
    assert len(rows) == (2 + sampled if sampled else 0) + (2 + opd if opd else 0) > 0
    for name, part in record["models"].items():  # each arm's tokens/s as recorded
        row = part["rows"][0]
        assert any(f"| {name} | {row['batch']} x {row['new_tokens']} | "
                   f"{row['tokens_per_s']['hf']:,.1f} |" in line for line in rows)
    for name, part in record["opd_update"].items():
        assert any(line.startswith(f"| {name} | vllm | {part['vllm']['cycle_s_median']:.2f} |")
                   for line in rows)


def test_bad_values_are_one_line(tmp_path):
    for args, said in ((["--table", str(tmp_path / "none.json")], "is not a file"),
                       (["--models", "llama"], "each one of toy, smollm2"),
                       (["--shapes", "32by64"], "is not BATCHxTOKENS")):
        done = _run(*args, "--output-dir", str(tmp_path))
        assert done.returncode == 1 and said in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
