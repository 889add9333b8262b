"""benchmarks/distill_report.py prints the distillation benchmark's tables from its
record, and every figure it prints is annotated with the path that holds it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import distill_report as report  # noqa: E402

from tests.docs.figures import ANNOTATION, matches, resolve  # noqa: E402


def _iv(mean, low, high):
    return {"mean": mean, "low": low, "high": high, "n": 2}


def _record() -> dict:
    block = {"updates_reached": {"1": 32, "2": 32}, "t1": _iv(0.9, 0.85, 0.95),
             "greedy": _iv(0.99, 0.98, 1.0)}
    other = {**block, "t1_vs_sft": _iv(-0.02, -0.05, 0.01),
             "greedy_vs_sft": _iv(0.0, -0.01, 0.01), "updates_reached": {"1": 16, "2": None}}
    arm = {"cells": 2, "ok": 2, "unseen_states_final": _iv(0.1, 0.05, 0.15),
           "mean_training_s": 12.34, "mean_preparation_s": 0.0, "mean_wall_s": 50.0}
    return {
        "baseline": "sft",
        "distill": {"lr_grid": [3e-4, 1e-3], "main_split": "test"},
        "start": {"warm_student": {"split": "eval", "greedy": 0.859, "t1": 0.617, "n": 64},
                  "teacher": {"split": "eval", "greedy": 0.969, "t1": 0.945, "n": 64}},
        "start_evals": {"warm:test": {"greedy": 0.85, "t1": 0.58, "n": 128}},
        "grid": {"choice": {"sft": {"chosen_lr": 3e-4, "grid": [
            {"lr": 3e-4, "t1": 0.96, "greedy": 1.0}, {"lr": 1e-3, "t1": 0.94, "greedy": 0.98}]}}},
        "main": {"updates": [0, 32], "seconds": [60.0],
                 "arms": {"sft": {**arm, "updates=32": block, "seconds=60": block},
                          "opd": {**arm, "updates=32": other, "seconds=60": other}}},
    }


def test_every_printed_figure_is_its_records_number(tmp_path, capsys):
    path = tmp_path / "distill_bench.json"
    data = _record()
    path.write_text(json.dumps(data))
    assert report.main(["--commit", "abc1234", "--record", str(path)]) == 0
    out = capsys.readouterr().out
    notes = list(ANNOTATION.finditer(out))
    assert len(notes) > 40
    for note in notes:
        assert matches(note["shown"], resolve(data, note["pointer"])) is None, note.group(0)
    assert "| opd | 2/2 | 0.900 [0.850, 0.950] | -0.020 [-0.050, +0.010] |" in out
    assert re.search(r"\| sft \| 0\.960 / 1\.000 \| 0\.940 / 0\.980 \| 0\.0003 \|", out)
    assert "16, -" in out  # a seed that reached no evaluation by then


def test_a_missing_record_is_one_line(tmp_path, capsys):
    try:
        report.main(["--commit", "abc", "--record", str(tmp_path / "none.json")])
    except SystemExit as exc:
        assert "does not exist" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("a missing record must exit")
