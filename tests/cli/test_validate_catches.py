"""`validate` catches what `up` would, one mistake one line (issue 53).

What a user relies on (docs/recipes.md, "Errors", "Names", "Paths"): a teacher named
``../../../../s`` or ``a=b``, an adapter named ``a/b``, ``adapters: {}``, an adapter
folder that does not exist, ``../../../../etc`` or a file instead of a folder are each
refused by ``miniverl validate`` with exactly one line and exit 1, before any process
or folder exists; ``up`` refuses the same recipe without creating a run folder and
without changing the mode of any folder; a recipe's paths resolve from its own folder
whatever the current directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from miniverl.cli.app import run

TOY = "{toy: {}}"


def routed(teacher_name: str = "nav", adapters: str | None = None, out: str = "runs") -> str:
    """Two teachers (calc, ``teacher_name``), or one teacher with ``adapters``."""
    head = (f"schema_version: 1\nrun: {{name: t, mode: opd, output_dir: {out}}}\n"
            f"student: {{model: {TOY}, device: cpu, dtype: float32}}\n")
    if adapters is not None:
        return head + (f"teacher: {{model: {TOY}, device: cpu, adapters: {adapters}}}\n"
                       "environments:\n  - {name: calculator, adapter: x}\n"
                       "  - {name: jsonnav, adapter: y}\n")
    return head + (f"teachers:\n  calc: {{model: {TOY}, device: cpu}}\n"
                   f"  '{teacher_name}': {{model: {TOY}, device: cpu}}\n"
                   "environments:\n  - {name: calculator, teacher: calc}\n"
                   f"  - {{name: jsonnav, teacher: '{teacher_name}'}}\n")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    for name in ("x", "y"):
        (tmp_path / "ad" / name).mkdir(parents=True)
        (tmp_path / "ad" / name / "adapter_config.json").write_text("{}")
    (tmp_path / "afile").write_text("not a folder")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # paths resolve from the recipe's folder, not from here
    return tmp_path


CASES = {
    "traversal": (routed("../../../../s"), "teacher name '../../../../s' must be 1-64"),
    "equals": (routed("a=b"), "teacher name 'a=b' must be 1-64"),
    "adapter slash": (routed(adapters="{'a/b': ad/x, x: ad/x, y: ad/y}"),
                      "adapter name 'a/b' must be 1-64"),
    "no adapters": (routed(adapters="{}"), "teacher.adapters: Dictionary should have at least 1"),
    "missing adapter": (routed(adapters="{x: ad/missing, y: ad/y}"),
                        "teacher.adapters.x: '{root}/ad/missing' does not exist"),
    # ETC: the relative path from the recipe's folder to /etc, however deep that folder is.
    "etc": (routed(adapters="{x: ETC, y: ad/y}"), "holds no adapter_config.json"),
    "file": (routed(adapters="{x: afile, y: ad/y}"), "'{root}/afile' is a file, not a folder"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_mistake_is_one_line_of_validate(folder, case, capsys):
    text, words = CASES[case]
    recipe = folder / "r.yaml"
    recipe.write_text(text.replace("ETC", os.path.relpath("/etc", folder)))
    code = run(["validate", str(recipe)])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 1 and captured.out == ""
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and words.format(root=folder) in lines[0]


def test_good_adapters_resolve_from_the_recipes_folder(folder, capsys):
    recipe = folder / "r.yaml"
    recipe.write_text(routed(adapters="{x: ad/x, y: ad/y}"))
    assert run(["validate", str(recipe)]) == 0, capsys.readouterr().err
    from miniverl.common.recipe import load_recipe

    assert load_recipe(recipe).teacher.adapters == {"x": str(folder / "ad" / "x"),
                                                    "y": str(folder / "ad" / "y")}


def modes(root: Path) -> dict[str, int]:
    """The mode of every folder under ``root`` and of ``root``'s parents."""
    found = {str(p): stat.S_IMODE(os.stat(p).st_mode) for p in (root, *root.parents)}
    for where, subdirs, _ in os.walk(root):
        for sub in subdirs:
            found[str(Path(where) / sub)] = stat.S_IMODE(os.stat(Path(where) / sub).st_mode)
    return found


@pytest.mark.parametrize("case", ["traversal", "missing adapter", "file"])
def test_up_refuses_before_any_folder_exists_and_changes_no_mode(folder, case, capsys):
    # The traversal name once made `up` exit 0 having set a folder outside the run folder
    # (the machine's temporary folder, in one variant) to 0700.
    out = folder / "out"
    out.mkdir()
    os.chmod(out, 0o755)
    text = CASES[case][0].replace("output_dir: runs", f"output_dir: {out}")
    recipe = folder / "r.yaml"
    recipe.write_text(text)
    before = modes(folder)
    code = run(["up", str(recipe), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("error: "), err
    assert modes(folder) == before  # nothing created, no mode changed
    assert list(out.iterdir()) == []


def test_a_run_that_fails_while_starting_says_why_in_its_status(tmp_path):
    # A teacher that cannot load made `up` stop the student, which marked its run
    # `interrupted` with reason null; the run failed, and its status now says why.
    import json
    from types import SimpleNamespace

    from miniverl.cli.supervisor import Supervisor
    from miniverl.common.recipe import loads_recipe
    from miniverl.common.rundir import RunDir

    recipe = loads_recipe(routed().replace("output_dir: runs", f"output_dir: {tmp_path}"))
    run_dir = RunDir.create(tmp_path, recipe)
    run_dir.set_status("running")
    run_dir.set_status("interrupted")  # what the stopped student wrote
    fake = SimpleNamespace(run=run_dir, _stopping=True, console=None)
    Supervisor._close_abandoned_run(fake, "MiniverlError: teacher nav: no such adapter",
                                    failed_start=True)
    status = json.loads(run_dir.status_path.read_text())
    assert status["status"] == "failed"
    assert status["reason"] == "MiniverlError: teacher nav: no such adapter"
    # A student stopped on purpose (Ctrl-C) stays interrupted: only a failed start is failed.
    other = RunDir.create(tmp_path, recipe)
    other.set_status("running")
    Supervisor._close_abandoned_run(SimpleNamespace(run=other, _stopping=True, console=None),
                                    "a second Ctrl-C killed the student")
    assert json.loads(other.status_path.read_text())["status"] == "interrupted"


def test_model_paths_and_preparations_resolve_from_the_recipes_folder_too(folder, capsys):
    from miniverl.common.recipe import load_recipe

    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_text("{}")
    text = routed().replace(f"student: {{model: {TOY}", "student: {model: {path: model}")
    recipe = folder / "r.yaml"
    recipe.write_text(text)
    assert run(["validate", str(recipe)]) == 0, capsys.readouterr().err
    assert load_recipe(recipe).student.model.path == str(folder / "model")
    # A preparation that is not beside the recipe is one line, as a missing model is.
    recipe.write_text(text.replace("calc: {model: {toy: {}}, device: cpu}",
                                   "calc: {model: {toy: {}}, device: cpu, prepare: prep.yaml}")
                      .replace("student: {model: {path: model}", "student: {model: {path: gone}"))
    assert run(["validate", str(recipe)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3, lines  # two problems and the count line
    assert f"student.model.path: '{folder}/gone' does not exist" in lines[0]
    assert "teachers.calc.prepare: 'prep.yaml' is not a file" in lines[1]


def test_trajectories_and_key_files_resolve_from_the_recipes_folder(folder, capsys):
    # Offline KD's train.trajectories and a remote teacher's CURVE key files are read
    # from the recipe's folder like every other path (they were read from the current
    # directory, so the same recipe trained on another file depending on where it ran).
    from miniverl.common.recipe import load_recipe

    (folder / "trajs.jsonl").write_text("")
    (folder / "keys").mkdir()
    for name in ("student.key_secret", "server.key"):
        (folder / "keys" / name).write_text("")
    text = (f"schema_version: 1\nrun: {{name: t, mode: offline_kd}}\n"
            f"student: {{model: {TOY}, device: cpu, dtype: float32}}\n"
            f"teacher: {{model: {TOY}, endpoint: 'tcp://127.0.0.1:5555', curve_secret_key: KEY, "
            "curve_server_key: keys/server.key}\n"
            "environment: {name: calculator}\ntrain: {trajectories: TRAJ}\n")
    recipe = folder / "r.yaml"
    recipe.write_text(text.replace("KEY", "keys/student.key_secret").replace("TRAJ", "trajs.jsonl"))
    assert run(["validate", str(recipe)]) == 0, capsys.readouterr().err
    loaded = load_recipe(recipe)
    assert loaded.train.trajectories == str(folder / "trajs.jsonl")
    assert loaded.teacher.curve_secret_key == str(folder / "keys" / "student.key_secret")
    assert loaded.teacher.curve_server_key == str(folder / "keys" / "server.key")
    # Missing, or a folder: one line each, naming the path looked at.
    capsys.readouterr()
    recipe.write_text(text.replace("KEY", "keys").replace("TRAJ", "gone.jsonl"))
    assert run(["validate", str(recipe)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3, lines  # two problems and the count line
    assert f"teacher.curve_secret_key: '{folder}/keys' is a folder, not a file" in lines[0]
    assert f"train.trajectories: '{folder}/gone.jsonl' does not exist" in lines[1]
