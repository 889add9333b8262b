"""benchmarks/distill_report.py prints the distillation benchmark's tables from its
record, each followed by the one annotation (record, commit, command) the docs test
prints it again from, every figure the record's number."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import distill_report as report  # noqa: E402

from tests.docs.figures import TABLE_ANNOTATION  # noqa: E402


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


def test_every_table_is_printed_from_the_record_with_one_annotation(tmp_path, capsys):
    path = tmp_path / "distill_bench.json"
    data = _record()
    data["main"]["arms"]["opd"]["updates=32"]["t1_vs_seqkd"] = {
        **_iv(0.016, 0.01, 0.021), "per_seed": {"1": 0.02, "2": 0.012}, "above": 2}
    data["main"]["also_against"] = ["seqkd"]
    path.write_text(json.dumps(data))
    assert report.main(["--commit", "abc1234", "--record", str(path)]) == 0
    out = capsys.readouterr().out
    notes = [m.groupdict() for m in TABLE_ANNOTATION.finditer(out)]
    names = ["start", "grid", "updates=32", "seconds=60", "cost"]
    assert [n["command"].split("--table ")[1] for n in notes] == names
    assert {n["commit"] for n in notes} == {"abc1234"} and {n["path"] for n in notes} == {str(path)}
    assert "<!-- figure:" not in out  # the table is checked whole, not figure by figure
    assert ("| opd | 2/2 | 0.900 [0.850, 0.950] | -0.020 [-0.050, +0.010] | "
            "+0.016 [+0.010, +0.021], 2 of 2 above |") in out
    assert re.search(r"\| sft \| 0\.960 / 1\.000 \| 0\.940 / 0\.980 \| 0\.0003 \|", out)
    assert "16, -" in out  # a seed that reached no evaluation by then
    # A record before T=1 coverage says which coverage it holds.
    assert "unseen states after, greedy [95%]" in out
    # --table prints that table alone: what the docs test compares.
    assert report.main(["--record", str(path), "--table", "grid"]) == 0
    alone = capsys.readouterr().out
    assert alone.startswith("| arm | lr 0.0003") and "<!--" not in alone
    with pytest.raises(SystemExit, match="--table nope is not a table"):
        report.main(["--record", str(path), "--table", "nope"])


def test_a_record_with_t1_coverage_and_the_time_split_prints_both(tmp_path, capsys):
    data = _record()
    data["coverage_reading"] = "t1"
    for arm in data["main"]["arms"].values():
        arm["unseen_states_greedy_final"] = _iv(0.0, 0.0, 0.0)
        arm["mean_time_split"] = {"rollout_s": 8.0, "teacher_wait_s": 3.25, "update_s": 1.0,
                                  "preparation_s": 0.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert report.main(["--record", str(path), "--table", "cost"]) == 0
    out = capsys.readouterr().out
    assert ("| arm | training s (mean) | of which preparation s | rollout s | teacher wait s | "
            "update s | cell wall s (with evaluation) | unseen states after, T=1 [95%] | "
            "unseen states after, greedy [95%] |") in out
    assert "| sft | 12.3 s | 0.0 s | 8.0 s | 3.2 s | 1.0 s | 50.0 s | 0.100 [0.050, 0.150] |" in out


def test_a_missing_record_is_one_line(tmp_path, capsys):
    try:
        report.main(["--commit", "abc", "--record", str(tmp_path / "none.json")])
    except SystemExit as exc:
        assert "does not exist" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("a missing record must exit")


def test_a_record_with_a_plateau_and_a_teacher_prints_the_gap_table(tmp_path, capsys):
    # Version 3: each arm's share of the plateau-to-teacher gap, and its seconds to the
    # reach arm's final T=1 success.
    data = _record()
    data["distill"]["reach_arm"] = "rl"
    data["main"]["gap"] = {"start": {"t1": 0.6, "greedy": 0.65}, "teacher": {"t1": 1.0,
                                                                          "greedy": 1.0}}
    for name, closed, reach in (("sft", 0.75, {"per_seed": {"1": 20.0, "2": None},
                                              "reached": 1, "of": 2, "mean_s": 20.0}),
                                ("opd", -0.1, {"per_seed": {"1": None, "2": None},
                                               "reached": 0, "of": 2, "mean_s": None})):
        arm = data["main"]["arms"][name]
        arm["updates=32"] = {**arm["updates=32"], "t1_gap_closed": closed}
        arm["seconds=60"] = {**arm["seconds=60"], "t1_gap_closed": None}
        arm["seconds_to_rl_final"] = reach
    path = tmp_path / "v3.json"
    path.write_text(json.dumps(data))
    assert report.main(["--record", str(path), "--table", "gap"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("| arm | gap closed, T=1, 32 updates | gap closed, T=1, 60 s | "
                      "training s to rl's final T=1 (seeds that reached it) |")
    assert out[2] == "| sft | +0.75 | - | 20.0 s (1 of 2) |"
    assert out[3] == "| opd | -0.10 | - | - (0 of 2) |"
    assert report.main(["--record", str(path)]) == 0
    assert "#### Share of the gap closed (test split: plateau T=1 0.600, teacher 1.000)" in \
        capsys.readouterr().out


def test_a_record_with_the_training_signal_prints_its_table(tmp_path, capsys):
    data = _record()
    data["main"]["arms"]["opd"]["mean_signal"] = {
        "all_right_share": 0.890625, "train_success": 0.9814, "abs_loss_median": 4.08e-09,
        "grad_norm_median": 3.5e-07}
    data["main"]["arms"]["sft"]["mean_signal"] = {
        "all_right_share": None, "train_success": None, "abs_loss_median": 3.3e-05,
        "grad_norm_median": 0.00135}
    path = tmp_path / "signal.json"
    path.write_text(json.dumps(data))
    assert report.main(["--record", str(path), "--table", "signal"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "| sft | - | - | 3.3e-05 | 1.4e-03 |"
    assert out[3] == "| opd | 89% | 0.981 | 4.1e-09 | 3.5e-07 |"


def test_a_version_5_record_prints_its_extended_grid_clip_share_and_half_gap(tmp_path, capsys):
    # Version 5: an arm's grid may hold an extension's rate, each choice says whether it
    # is still at an edge, each arm its clip binding share and its seconds to half the gap.
    data = _record()
    data["grid"]["choice"]["sft"]["at_edge"] = None
    data["grid"]["choice"]["opd"] = {"chosen_lr": 1e-4, "at_edge": "low", "grid": [
        {"lr": 3e-4, "t1": 0.5, "greedy": 0.6}, {"lr": 1e-3, "t1": 0.4, "greedy": 0.5},
        {"lr": 1e-4, "t1": 0.55, "greedy": 0.6}]}
    data["main"]["arms"]["opd"]["mean_signal"] = {
        "all_right_share": 0.5, "train_success": 0.7, "abs_loss_median": 0.01,
        "grad_norm_median": 0.3, "clip_binding_share": 0.0625}
    data["main"]["gap"] = {"start": {"t1": 0.6}, "teacher": {"t1": 1.0}}
    data["main"]["arms"]["opd"]["half_gap_s"] = {"mean_s": 95.25, "reached": 3, "of": 5}
    path = tmp_path / "v5.json"
    path.write_text(json.dumps(data))
    assert report.main(["--record", str(path), "--table", "grid"]) == 0
    grid = capsys.readouterr().out.splitlines()
    assert grid[0] == ("| arm | lr 0.0001: T=1 / greedy | lr 0.0003: T=1 / greedy | "
                       "lr 0.001: T=1 / greedy | chosen | choice at an edge |")
    assert grid[2] == "| sft | - | 0.960 / 1.000 | 0.940 / 0.980 | 0.0003 | no |"
    assert grid[3] == "| opd | 0.550 / 0.600 | 0.500 / 0.600 | 0.400 / 0.500 | 0.0001 | low |"
    assert report.main(["--record", str(path), "--table", "signal"]) == 0
    signal = capsys.readouterr().out.splitlines()
    assert signal[0].endswith("| updates the clip bound |") and signal[3].endswith("| 6% |")
    assert report.main(["--record", str(path), "--table", "gap"]) == 0
    gap = capsys.readouterr().out.splitlines()
    assert gap[0].endswith("| training s to close half the gap (seeds that did) |")
    assert gap[3].endswith("| 95.2 s (3 of 5) |") and gap[2].endswith("| - |")
