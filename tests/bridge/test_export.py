"""Level 1 and Level 3 exports from a toy LoRA run, and the doctor that rechecks them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from miniverl.bridge import profile
from miniverl.bridge.doctor import STATUSES, doctor
from miniverl.common.errors import ConfigError
from miniverl.common.hashing import verify_sums


def test_export_adapter_loads_with_peft(toy_run, tmp_path):
    # Level 1: the adapter is standard PEFT — the stock loader accepts it onto the base.
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from miniverl.bridge.artifacts import export_adapter
    from miniverl.common.modeling import resolve_model_dir
    from miniverl.common.recipe import load_recipe

    out = tmp_path / "adapter"
    summary = export_adapter(toy_run, out)
    assert summary["kind"] == "lora" and summary["step"] == 4
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }
    base_dir = resolve_model_dir(load_recipe(toy_run / "recipe.resolved.yaml").student.model)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), out)
    saved = toy_run / "checkpoints" / "step_4" / "adapter" / "adapter_model.safetensors"
    assert (out / "adapter_model.safetensors").read_bytes() == saved.read_bytes()
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
    with pytest.raises(ConfigError, match="not empty"):
        export_adapter(toy_run, out)


def test_bundle_layout_and_hazards(toy_bundle):
    for rel in profile.BUNDLE_FILES.values():
        assert (toy_bundle / rel).exists(), rel
    overrides = yaml.safe_load((toy_bundle / "recipe/verl-overrides.yaml").read_text())
    flat = profile.flatten({k: v for k, v in overrides.items() if k not in ("defaults", "hydra")})
    adapter = json.loads((toy_bundle / "model/adapter/adapter_config.json").read_text())
    # verl 0.8.0 hazards: a reward path without a name crashes; lora_rank 0 ignores the
    # adapter; LoRA weights reach vLLM only through the safetensors loader.
    assert flat["reward.custom_reward_function.name"] == "compute_score"
    assert flat["reward.custom_reward_function.path"] == "reward/compute_score.py"
    assert flat["actor_rollout_ref.model.lora_rank"] == adapter["r"] == 4
    assert flat["actor_rollout_ref.model.lora_alpha"] == adapter["lora_alpha"]
    assert sorted(flat["actor_rollout_ref.model.target_modules"]) == sorted(
        adapter["target_modules"]
    )
    assert flat["actor_rollout_ref.rollout.load_format"] == "safetensors"
    assert (toy_bundle / "recipe/REQUIRED_VERL.txt").read_text().splitlines() == [
        "verl==0.8.0",
        "commit 7aed6b230776f963fa09509c10d9c3a767d1102c",
        "profile single-gpu-online-distillation-v1",
    ]
    assert adapter["base_model_name_or_path"] == ""  # a toy base: no path leaks


def test_export_refuses_existing_bundle(toy_run, toy_bundle):
    from miniverl.bridge.bundle import export_verl

    with pytest.raises(ConfigError, match="already exists"):
        export_verl(toy_run, toy_bundle)
    assert not [p for p in toy_bundle.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_launch_template_refuses_without_weights(toy_bundle):
    env = {k: v for k, v in os.environ.items() if k not in ("BASE_MODEL_DIR", "TEACHER_MODEL_DIR")}
    proc = subprocess.run(
        ["bash", str(toy_bundle / "recipe/launch.template.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "base model weights are not present" in proc.stderr
    assert "toy_model_dir(" in proc.stderr and "teacher-model" in proc.stderr


DOCTOR_KEYS = {
    "schema_version": int,
    "bundle": str,
    "profile": str,
    "verl": dict,
    "ok": bool,
    "launchable": bool,
    "launch_blockers": list,
    "distributed_execution": str,
    "checks": list,
}
CHECK_NAMES = [
    "hashes",
    "layout",
    "required_verl",
    "overrides",
    "parquet",
    "tool_config",
    "reward",
    "adapter",
    "tokenizer",
    "privacy",
]


def _assert_schema(result):
    assert set(result) == set(DOCTOR_KEYS)
    for key, kind in DOCTOR_KEYS.items():
        assert isinstance(result[key], kind), key
    for check in result["checks"]:
        assert set(check) == {"name", "status", "detail"} and check["status"] in STATUSES


def test_doctor_passes_fresh_bundle(toy_bundle, monkeypatch):
    monkeypatch.delenv("BASE_MODEL_DIR", raising=False)
    monkeypatch.delenv("TEACHER_MODEL_DIR", raising=False)
    result = doctor(toy_bundle)
    _assert_schema(result)
    assert [c["name"] for c in result["checks"]] == CHECK_NAMES
    assert result["ok"], [c for c in result["checks"] if c["status"] == "fail"]
    assert all(c["status"] == "pass" for c in result["checks"]), result["checks"]
    assert result["launchable"] is False and result["distributed_execution"] == "not tested"
    assert any("base model weights absent" in b for b in result["launch_blockers"])


def test_flipped_byte_is_detected(toy_bundle, tmp_path):
    # A user relies on SHA256SUMS to notice any change after export.
    bundle = tmp_path / "b"
    shutil.copytree(toy_bundle, bundle)
    target = bundle / "data/train.parquet"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    assert verify_sums(bundle) == ["data/train.parquet: sha256 differs from SHA256SUMS"]
    result = doctor(bundle)
    assert not result["ok"]
    hashes = next(c for c in result["checks"] if c["name"] == "hashes")
    assert hashes["status"] == "fail" and "data/train.parquet" in hashes["detail"]


def test_doctor_flags_a_leaked_path_and_bad_override(toy_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(toy_bundle, bundle)
    over = bundle / "recipe/verl-overrides.yaml"
    over.write_text(over.read_text().replace("lora_rank: 4", "lora_rank: 0"))
    (bundle / "provenance/notes.txt").write_text("weights at /home/alice/models/qwen\n")
    from miniverl.common.hashing import write_sums

    write_sums(bundle)  # re-sign so only the content checks can catch it
    result = doctor(bundle)
    status = {c["name"]: c for c in result["checks"]}
    assert status["hashes"]["status"] == "pass"
    assert status["overrides"]["status"] == "fail" and "lora_rank" in status["overrides"]["detail"]
    assert (
        status["privacy"]["status"] == "fail"
        and "provenance/notes.txt" in status["privacy"]["detail"]
    )


def test_doctor_cli_json_and_exit_code(toy_bundle, tmp_path):
    from typer.testing import CliRunner

    from miniverl.cli.app import app

    runner = CliRunner()
    ok = runner.invoke(app, ["bridge", "doctor", str(toy_bundle), "--json"])
    assert ok.exit_code == 0, ok.output
    _assert_schema(json.loads(ok.stdout))
    bad = tmp_path / "b"
    shutil.copytree(toy_bundle, bad)
    (bad / "reward/compute_score.py").write_text("def compute_score(*a, **k):\n    return 0.0\n")
    failed = runner.invoke(app, ["bridge", "doctor", str(bad)])
    assert failed.exit_code == 1
    assert "FAILED" in failed.output


def test_full_finetune_run_exports_hf_model_dir(toy_run, tmp_path):
    # student.lora: null -> the export is a plain Hugging Face model directory.
    from miniverl.bridge.artifacts import export_adapter
    from miniverl.common.modeling import resolve_model_dir
    from miniverl.common.recipe import Recipe
    from miniverl.common.rundir import RunDir
    from tests.bridge.conftest import RECIPE

    recipe = Recipe.model_validate({**RECIPE, "student": {**RECIPE["student"], "lora": None}})
    run = RunDir.create(tmp_path / "runs", recipe, run_id="full-run")
    base = resolve_model_dir(recipe.student.model)
    shutil.copytree(base, run.checkpoints_dir / "step_1" / "model")
    summary = export_adapter(run.path, tmp_path / "out")
    assert summary["kind"] == "full" and summary["lora"] is None
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not any(n.startswith("adapter_") for n in names)
