"""The importer trusts nothing: model and adapter locations from a verl config.

A verl config is someone else's file; its model fields become paths ``train`` opens and
hub ids it downloads. Only a directory inside the config's folder or a pinned hub id
may reach the recipe; everything else is refused per field in ``import-report.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from miniverl.bridge.importer import import_verl
from miniverl.common.errors import ConfigError
from miniverl.common.recipe import load_recipe, loads_recipe

REV = "c1899de289a04d12100db370d81485cdf75e47ca"
TREV = "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e"
STUDENT = "actor_rollout_ref.model.path"
TEACHER = "distillation.teacher_models.teacher_model.model_path"
ADAPTER = "actor_rollout_ref.model.lora_adapter_path"


def _config(tmp_path: Path, **fields) -> Path:
    folder = tmp_path / "cfg"
    (folder / "models" / "student").mkdir(parents=True, exist_ok=True)
    config = {STUDENT: "./models/student", TEACHER: "Qwen/Qwen3-1.7B", **fields}
    path = folder / "verl.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _import(config: Path, out: Path):
    return import_verl(config, out, revision=REV, teacher_revision=TREV)


def _refusal(tmp_path: Path, key: str, value: str) -> dict:
    """Import a config whose ``key`` is ``value``; return that field's report entry."""
    config = _config(tmp_path, **{key: value})
    out = tmp_path / "out" / "recipe.yaml"
    with pytest.raises(ConfigError) as info:
        _import(config, out)
    # Fail closed: no recipe carries the value.
    assert not out.exists()
    assert key in str(info.value)
    report = json.loads((out.parent / "import-report.json").read_text())
    assert report["ok"] is False
    entry = next(f for f in report["fields"] if f["field"] == key)
    assert entry["label"] == "refused" and entry["value"] == value
    return entry


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("../../etc/passwd", "'..'"),
        ("models/../../outside", "'..'"),
        ("org/..", "'..'"),
        ("https://evil.example/model", "URL"),
        ("http://127.0.0.1:8000/m", "URL"),
        ("hf://Qwen/Qwen3-0.6B", "URL"),
        ("s3://bucket/model", "URL"),
        ("file:///etc/passwd", "URL"),
        ("hf:Qwen/Qwen3-0.6B", "URL"),
        ("/etc", "outside the config's folder"),
        ("~/models/student", "home-relative"),
        ("./models/missing", "does not exist"),
        ("models\\student", "backslash"),
    ],
)
@pytest.mark.parametrize("key", [STUDENT, TEACHER])
def test_untrusted_model_location_refused_per_field(tmp_path, key, value, rule):
    # A user importing a stranger's config relies on it never pointing train at an
    # arbitrary file, a URL or a place outside the config's folder.
    entry = _refusal(tmp_path, key, value)
    assert rule in entry["note"]
    # The note says what to do instead.
    assert "hub id" in entry["note"] or "./" in entry["note"] or "POSIX" in entry["note"]


def test_symlink_out_of_the_folder_refused(tmp_path):
    # `./models/link` looks local but resolves to /etc: resolved paths are what count.
    config = _config(tmp_path)
    (config.parent / "models" / "link").symlink_to("/etc")
    entry = _refusal(tmp_path, STUDENT, "./models/link")
    assert "outside the config's folder" in entry["note"]


def test_adapter_url_refused_and_local_adapter_unsupported(tmp_path):
    entry = _refusal(tmp_path, ADAPTER, "https://evil.example/adapter")
    assert "URL" in entry["note"]
    config = _config(tmp_path, **{ADAPTER: "./models/student"})
    with pytest.raises(ConfigError, match="from scratch"):
        _import(config, tmp_path / "out2" / "recipe.yaml")


def test_local_directory_inside_the_folder_imports_as_absolute_path(tmp_path):
    # The recipe usually lives elsewhere, so it holds the resolved absolute directory.
    config = _config(tmp_path)
    out = tmp_path / "elsewhere" / "recipe.yaml"
    _import(config, out)
    recipe = load_recipe(out)
    assert recipe.student.model.path == str((config.parent / "models" / "student").resolve())
    assert recipe.teacher.model.hub_id == "Qwen/Qwen3-1.7B"
    assert recipe.teacher.model.revision == TREV


def test_absolute_path_under_the_folder_imports(tmp_path):
    config = _config(tmp_path)
    absolute = str((config.parent / "models" / "student").resolve())
    config.write_text(yaml.safe_dump({STUDENT: absolute, TEACHER: "Qwen/Qwen3-1.7B"}))
    out = tmp_path / "out" / "recipe.yaml"
    report, _ = _import(config, out)
    entry = next(f for f in report["fields"] if f["field"] == STUDENT)
    assert entry["label"] == "exact"
    assert load_recipe(out).student.model.path == absolute


def test_pinned_hub_ids_import(tmp_path):
    config = _config(tmp_path, **{STUDENT: "Qwen/Qwen3-0.6B"})
    out = tmp_path / "out" / "recipe.yaml"
    _import(config, out)
    recipe = load_recipe(out)
    assert (recipe.student.model.hub_id, recipe.student.model.revision) == ("Qwen/Qwen3-0.6B", REV)


@pytest.mark.parametrize(
    "model",
    [
        {"path": "https://evil.example/model"},
        {"path": "hf://Qwen/Qwen3-0.6B"},
        {"path": "s3://bucket/model"},
        {"path": "file:///etc/passwd"},
        {"hub_id": "https://huggingface.co/Qwen/Qwen3-0.6B", "revision": REV},
    ],
)
def test_validate_refuses_url_model_location(model):
    # `miniverl validate` is the last gate before `train` opens the location.
    text = yaml.safe_dump(
        {"schema_version": 1, "run": {"name": "x", "mode": "sft"}, "student": {"model": model}}
    )
    with pytest.raises(ConfigError) as info:
        loads_recipe(text)
    assert "student.model" in str(info.value)


def test_validate_refuses_url_teacher_adapter():
    text = yaml.safe_dump(
        {
            "schema_version": 1,
            "run": {"name": "x", "mode": "opd"},
            "student": {"model": {"toy": {}}},
            "teacher": {"model": {"toy": {}}, "adapter": "https://evil.example/adapter"},
        }
    )
    with pytest.raises(ConfigError, match="teacher.adapter: a URL"):
        loads_recipe(text)
