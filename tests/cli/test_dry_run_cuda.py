"""``train --dry-run`` says in one line when the recipe wants a CUDA device the machine
lacks (the real run would stop at the model load), and says nothing when it has one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from miniverl.cli.app import app

torch = pytest.importorskip("torch")

runner = CliRunner()
QWEN = Path(__file__).parents[2] / "recipes" / "qwen3_opd_calculator.yaml"


def _dry_run(recipe: Path):
    result = runner.invoke(app, ["train", str(recipe), "--dry-run"])
    assert result.exit_code == 0, result.output
    return [line for line in result.output.splitlines() if line.startswith("warning:")]


def _with_device(tmp_path: Path, device: str) -> Path:
    data = yaml.safe_load(QWEN.read_text())
    data["student"]["device"] = device
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_cuda_recipe_on_a_machine_without_cuda_gets_one_warning(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    warnings = _dry_run(QWEN)  # the shipped GPU recipe: student.device cuda
    assert len(warnings) == 1
    assert "student.device is 'cuda'" in warnings[0] and "CUDA is not available" in warnings[0]
    assert "student.device: cpu" in warnings[0]  # the fix


def test_a_missing_device_index_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    warnings = _dry_run(_with_device(tmp_path, "cuda:3"))
    assert len(warnings) == 1 and "1 CUDA device(s)" in warnings[0] and "cuda:0" in warnings[0]


def test_no_warning_where_the_device_exists_or_is_not_cuda(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _dry_run(QWEN) == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _dry_run(_with_device(tmp_path, "cpu")) == []
    assert _dry_run(_with_device(tmp_path, "auto")) == []
