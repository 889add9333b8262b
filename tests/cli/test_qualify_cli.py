"""``miniverl qualify-teacher`` with a prepared teacher: it measures the very directory
``miniverl up`` would serve, and writes the record beside it and to the cache.

Users rely on: the identity in the record equals the one the teacher will announce
(so the gate finds it), and the command's output names the measured success.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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


def test_qualify_one_route_of_several_teachers(tmp_path, monkeypatch, capsys):
    # --route NAME measures that teacher of teachers: on each environment routed to it:
    # the records its min_success reads (docs/several-teachers.md, "Gates").
    from typer.testing import CliRunner

    from miniverl.cli.app import app
    from miniverl.common import qualification
    from miniverl.common.recipe import load_recipe
    from miniverl.common.teacher_routes import route_view, routes

    monkeypatch.setattr(qualification, "qualifications_dir", lambda: tmp_path / "q")
    teacher = {"model": {"toy": TEACHER}, "device": "cpu", "dtype": "float32",
               "memory": "resident"}
    envs = {"train_tasks": 4, "eval_tasks": 2, "test_tasks": 2}
    recipe = {
        "schema_version": 1,
        "run": {"name": "q", "mode": "opd", "output_dir": str(tmp_path / "runs")},
        "student": {"model": {"toy": ONE_LAYER}, "device": "cpu", "lora": None},
        "teachers": {"calc": teacher, "nav": {**teacher, "min_success": 0.0}},
        "environments": [{"name": "calculator", "teacher": "calc", **envs},
                         {"name": "jsonnav", "teacher": "nav", **envs}],
        "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 8, "max_total_tokens": 640,
                    "batch_size": 2},
    }
    path = write_recipe(tmp_path / "two.yaml", recipe)
    result = CliRunner().invoke(app, ["qualify-teacher", str(path), "--route", "nav"])
    assert result.exit_code == 0, result.output
    assert "on jsonnav eval (n=2)" in result.output and "calculator" not in result.output
    assert "teacher.min_success 0: qualified" in result.output
    [record] = [r for r in map(json.loads, map(Path.read_text, (tmp_path / "q").glob("*.json")))
                if r.get("kind") == qualification.RECORD_KIND]
    loaded = load_recipe(path)
    view = route_view(loaded, routes(loaded)["nav"], "jsonnav")
    identity = record["teacher"]
    assert qualification.find_record(view, identity) == record  # what nav's gate reads
    from miniverl.cli.app import run

    assert run(["qualify-teacher", str(path), "--route", "sql"]) == 1  # the entry point
    err = capsys.readouterr().err
    assert "--route sql is not a route of" in err and "its routes are calc, nav" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_mixture_is_qualified_route_by_route(tmp_path, capsys):
    # docs/environments.md: a qualification record holds one environment, so a mixture
    # recipe without --route is refused with one line before any teacher is measured.
    from miniverl.cli.app import run

    teacher = {"model": {"toy": TEACHER}, "device": "cpu", "dtype": "float32",
               "memory": "resident"}
    envs = {"train_tasks": 4, "eval_tasks": 2, "test_tasks": 2}
    recipe = {
        "schema_version": 1,
        "run": {"name": "q", "mode": "opd", "output_dir": str(tmp_path / "runs")},
        "student": {"model": {"toy": ONE_LAYER}, "device": "cpu", "lora": None},
        "teacher": teacher,
        "environments": [{"name": "calculator", **envs}, {"name": "jsonnav", **envs}],
        "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 8, "max_total_tokens": 640,
                    "batch_size": 2},
    }
    path = write_recipe(tmp_path / "mix.yaml", recipe)
    assert run(["qualify-teacher", str(path)]) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the teacher's loading progress
    assert last.startswith("error: a teacher qualifies on one environment, and this recipe "
                           "names a mixture"), err
    assert "Traceback" not in err
