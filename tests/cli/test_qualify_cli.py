"""``miniverl qualify-teacher`` with a prepared teacher: it measures the very directory
``miniverl up`` would serve, and writes the record beside it and to the cache.

Users rely on: the identity in the record equals the one the teacher will announce
(so the gate finds it), and the command's output names the measured success.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.toy_kit import ONE_LAYER, seeded, toy_dir, write_recipe

pytest.importorskip("torch")

TEACHER = seeded(ONE_LAYER, 7)


def test_qualify_a_prepared_teacher(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from miniverl.cli.app import app
    from miniverl.student import qualify, teacher_prep

    prepared = tmp_path / "prepared-abc"
    shutil.copytree(toy_dir(TEACHER), prepared)
    monkeypatch.setattr(
        teacher_prep, "prepare_teacher",
        lambda recipe, prep, show_progress=True: teacher_prep.PreparedTeacher(prepared, True, {}),
    )
    from miniverl.common import qualification

    monkeypatch.setattr(qualification, "qualifications_dir", lambda: tmp_path / "q")
    (tmp_path / "prep.yaml").write_text("# stands in for an sft recipe\n")
    recipe = {
        "schema_version": 1,
        "run": {"name": "q", "mode": "opd", "output_dir": str(tmp_path / "runs")},
        "student": {"model": {"toy": ONE_LAYER}, "device": "cpu", "lora": None},
        "teacher": {"model": {"toy": TEACHER}, "device": "cpu", "dtype": "float32",
                    "prepare": "prep.yaml", "min_success": 0.0},
        "environment": {"name": "jsonnav", "train_tasks": 4, "eval_tasks": 2, "test_tasks": 2},
        "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 8, "max_total_tokens": 640,
                    "batch_size": 2},
    }
    path = write_recipe(tmp_path / "recipe.yaml", recipe)
    result = CliRunner().invoke(app, ["qualify-teacher", str(path), "--split", "test"])
    assert result.exit_code == 0, result.output
    assert "on jsonnav test (n=2)" in result.output and "qualified" in result.output
    beside = json.loads((prepared / qualify.RECORD_FILE).read_text())
    # What `up` serves for a prepared teacher: --model <prepared dir>, no adapter.
    assert beside["teacher"] == {"name": "prepared-abc", "model": str(prepared),
                                 "revision": None, "adapter_sha256": None}
    assert beside["split"] == "test" and beside["environment"]["name"] == "jsonnav"
    assert list((tmp_path / "q").glob("*.json"))
    # The record does not change the directory's digest it describes.
    assert qualify.model_dir_digest(prepared) == beside["model_dir_sha256"]
    bad = CliRunner().invoke(app, ["qualify-teacher", str(path), "--split", "train"])
    assert bad.exit_code != 0
