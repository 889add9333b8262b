"""The plateau and margin gates: a benchmark checks both before its first cell, one line each.

A user relies on version 3 of the distillation benchmark starting only from a student at
the plateau of its data and a teacher clearly above it; these tests pin the rule (last two
validation evaluations within the tolerance; the teacher's T=1 at least the margin above
the last one), the messages (figure, rule, fix) and that no cell runs outside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miniverl.common.errors import ConfigError
from miniverl.student.benchmark.config import load_benchmark_config
from miniverl.student.benchmark.gates import margin_gate, plateau_gate, validation_curve
from miniverl.student.benchmark.run import TrainerCells, run_benchmark
from tests.student.benchmark.test_benchmark import write_config

CURVE = [{"update": 200, "t1": 0.40}, {"update": 400, "t1": 0.61}, {"update": 600, "t1": 0.625}]


def test_the_plateau_is_the_last_evaluation_when_the_last_two_agree():
    assert plateau_gate(CURVE, 0.02, "warm") == 0.625
    with pytest.raises(ConfigError, match=r"warm is not at a plateau: T=1 validation success "
                       r"0\.400 at update 200 and 0\.610 at 400 differ by 0\.210 > 0\.02; train "
                       r"it longer"):
        plateau_gate(CURVE[:2], 0.02, "warm")
    with pytest.raises(ConfigError, match=r"has 1 T=1 validation evaluation\(s\)"):
        plateau_gate(CURVE[:1], 0.02, "warm")


def test_the_teacher_must_stand_the_margin_above_the_plateau():
    assert margin_gate(0.945, 0.625, 0.15, "the teacher") == pytest.approx(0.32)
    with pytest.raises(ConfigError, match=r"the teacher's T=1 validation success 0\.945 is "
                       r"\+0\.095 over the student's plateau 0\.850, below the required "
                       r"margin 0\.15; give the student less data"):
        margin_gate(0.945, 0.85, 0.15, "the teacher")
    with pytest.raises(ConfigError, match="no T=1 validation success"):
        margin_gate(None, 0.5, 0.15, "the teacher")


def test_the_curve_is_read_from_a_runs_eval_events():
    events = [{"event": "eval", "version": 0, "success": 0.5, "sampled": {"success": 0.2}},
              {"event": "train"}, {"event": "eval", "version": 8, "success": 0.9, "split": "eval"},
              {"event": "eval", "version": 8, "success": 1.0, "sampled": {"success": 0.7}}]
    assert [(p["update"], p["greedy"], p["t1"]) for p in validation_curve(events)] == [
        (0, 0.5, 0.2), (8, 1.0, 0.7)]


def _fake_prepared(monkeypatch, tmp_path: Path, records: dict[str, dict]) -> None:
    import miniverl.student.benchmark.run as run_module

    def fake_prepare(prep, model, *, what, model_field):
        return type("Prepared", (), {"model_dir": tmp_path / f"ready-{what}",
                                     "record": records[what]})()

    monkeypatch.setattr(run_module, "prepare_model", fake_prepare)


WARM = {"steps": 600, "eval": {"split": "eval", "sampled": {"success": 0.625}},
        "evals": CURVE}
TEACHER = {"eval": {"split": "eval", "success": 0.97, "sampled": {"success": 0.945}}}
BASE = {"student": {"model": {"toy": {"hidden": 32}}},
        "teacher": {"model": {"toy": {"hidden": 128}}, "prepare": "teach.yaml"}}


def test_trainer_cells_check_both_gates_on_the_preparations(tmp_path, monkeypatch):
    _fake_prepared(monkeypatch, tmp_path, {"student_prepare": WARM, "teacher.prepare": TEACHER})
    cells = TrainerCells(None, tmp_path, student_prepare=tmp_path / "warm.yaml")
    gates = cells.check_plateau_and_margin(BASE, plateau=0.02, margin=0.15)
    assert gates == {"plateau": 0.625, "margin": pytest.approx(0.32)}
    with pytest.raises(ConfigError, match=r"the teacher \(teach\.yaml\)'s T=1 .* below the "
                       r"required margin 0\.4"):
        cells.check_plateau_and_margin(BASE, plateau=0.02, margin=0.4)


def test_a_gate_that_fails_stops_the_benchmark_before_any_cell(tmp_path, monkeypatch):
    _fake_prepared(monkeypatch, tmp_path, {"student_prepare": {**WARM, "evals": CURVE[:2]},
                                           "teacher.prepare": TEACHER})
    (tmp_path / "warm.yaml").write_text("schema_version: 1\n")
    config = write_config(tmp_path, student_prepare="warm.yaml", student_prepare_plateau=0.02,
                          teacher_margin=0.15)
    with pytest.raises(ConfigError, match="is not at a plateau"):
        run_benchmark(config, output_dir=tmp_path / "fresh")
    results = tmp_path / "fresh" / "results.json"
    assert not results.exists() or not json.loads(results.read_text())["cells"]


@pytest.mark.parametrize("gate", ["student_prepare_plateau", "teacher_margin"])
def test_a_gate_without_a_student_preparation_is_refused(tmp_path, gate):
    with pytest.raises(ConfigError, match=f"{gate} is set but student_prepare is not"):
        load_benchmark_config(write_config(tmp_path, **{gate: 0.02}))
