"""The CLI face: --help, --version, doctor, validate (all errors at once), schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from miniverl.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "recipes" / "toy_cpu_opd.yaml"
runner = CliRunner()


def test_help_lists_foundation_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("doctor", "validate", "schema"):
        assert command in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("miniverl ")


def test_doctor_json(tmp_path):
    result = runner.invoke(app, ["doctor", "--json", "--output-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report["extras"]) == {"train", "cuda", "bridge", "dev"}
    for info in report["extras"].values():
        assert info["installed"] or info["hint"].startswith("pip install")
    assert report["zmq"]["installed"] and isinstance(report["zmq"]["curve"], bool)
    assert report["output_dir"]["writable"] is True


def test_doctor_human():
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "libzmq" in result.output and "extra train" in result.output


def test_doctor_prints_the_installed_stack_against_the_tested_range(monkeypatch):
    # A user on a too-old peft is told so, with the install line that fixes it.
    import miniverl.cli.foundation as foundation

    real = foundation._version
    fake = {"peft": "0.16.0", "bitsandbytes": None}
    monkeypatch.setattr(foundation, "_version",
                        lambda dist: fake[dist] if dist in fake else real(dist))
    report = foundation.compatibility_report()
    assert set(report) == set(foundation.TESTED)
    assert report["peft"] == {"range": ">=0.17", "installed": "0.16.0", "in_range": False}
    assert report["bitsandbytes"]["in_range"] is None
    assert report["torch"]["in_range"] is True  # 2.13.0+cpu: the local label is a build
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "peft          >=0.17     0.16.0 OUTSIDE the tested range: pip install 'peft>=0.17'" \
        in result.output
    assert "bitsandbytes  >=0.50     not installed" in result.output


def test_validate_good_recipe_prints_a_plan():
    result = runner.invoke(app, ["validate", str(TOY)])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output
    for word in (
        "mode",
        "strict on-policy",
        "student",
        "teacher",
        "calculator",
        "cycles",
        "objective",
    ):
        assert word in result.output


def test_validate_reports_three_mistakes_with_locations(tmp_path):
    # torchtune's lesson: a user fixing a config sees every problem in one run.
    text = TOY.read_text()
    # Regexes, not literal values: the shipped recipe's numbers get retuned.
    text, n_mode = re.subn(r"(?m)^(\s*)mode: opd\b", r"\1mode: on_policy", text)
    text, n_k = re.subn(r"(?m)^(\s*)top_k: \d+", r"\1top_k: 0", text)
    text, n_eval = re.subn(r"(?m)^(\s*)eval_every:", r"\1eval_evry:", text)
    assert (n_mode, n_k, n_eval) == (1, 1, 1), "the toy recipe changed shape"
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, result.output
    for field in ("run.mode", "loss.top_k", "train.eval_evry"):
        assert any(f"{bad}:" in e and f": {field}: " in e for e in errors), field
    assert "did you mean 'eval_every'" in result.output


def test_validate_unknown_environment(tmp_path):
    bad = tmp_path / "env.yaml"
    bad.write_text(TOY.read_text().replace("name: calculator", "name: nosuchenv"))
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert "nosuchenv" in result.output


def test_schema():
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert "run" in schema["properties"]
    explicit = runner.invoke(app, ["schema", "recipe"])
    assert json.loads(explicit.output) == schema


def test_schema_unknown_name_is_one_clear_error():
    result = runner.invoke(app, ["schema", "nope"])
    assert result.exit_code != 0
    assert "unknown schema 'nope'" in str(result.exception or result.output)
