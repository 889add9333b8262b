"""A bundle per verl release: what ``export-verl --verl-version`` writes and what reads it.

A user on verl 0.9.1 exports with ``--verl-version 0.9.1`` and relies on: the pin files
naming that release, the trainer choice 0.9 reads (``trainer.use_v1``), the launch script
refusing another verl or a missing TransferQueue, ``bridge doctor`` passing, and
``import-verl`` giving the run's recipe back. The checks by verl's own code are in
test_verl_real.py (marker ``verl``).
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from miniverl.bridge import profile
from miniverl.bridge.bundle import export_verl
from miniverl.bridge.doctor import doctor
from miniverl.bridge.importer import import_verl
from miniverl.common.errors import ConfigError


@pytest.fixture(scope="module")
def bundle_091(toy_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle-091") / "bundle"
    export_verl(toy_run, out, verl_version="0.9.1")
    return out


def test_a_091_bundle_names_its_release_and_trainer(bundle_091, toy_bundle):
    manifest = json.loads((bundle_091 / "provenance/manifest.json").read_text())
    assert manifest["verl"] == profile.VERL_TARGETS["0.9.1"].identity
    assert (bundle_091 / "recipe/REQUIRED_VERL.txt").read_text().startswith(
        "verl==0.9.1\nwheel sha256 db6e6f2a")
    flat = profile.flatten(yaml.safe_load((bundle_091 / "recipe/verl-overrides.yaml").read_text()))
    assert flat["trainer.use_v1"] is True and flat["trainer.v1.trainer_mode"] == "sync"
    assert flat["critic.enable"] is False
    # 0.8.0 has no v1 trainer: its bundle does not write the key.
    flat_080 = profile.flatten(yaml.safe_load((toy_bundle / "recipe/verl-overrides.yaml").read_text()))
    assert "trainer.use_v1" not in flat_080 and flat_080["critic.enable"] is False
    launch = (bundle_091 / "recipe/launch.template.sh").read_text()
    assert 'verl.__version__ != "0.9.1"' in launch
    assert "import transfer_queue" in launch and "TransferQueue>=0.1.10" in launch
    readme = (bundle_091 / "README.md").read_text()
    assert "verl 0.9.1 bundle" in readme and "official verl 0.8.0 and 0.9.1" in readme


def test_doctor_passes_a_091_bundle_and_reports_its_release(bundle_091, monkeypatch):
    monkeypatch.delenv("BASE_MODEL_DIR", raising=False)
    monkeypatch.delenv("TEACHER_MODEL_DIR", raising=False)
    result = doctor(bundle_091)
    assert result["ok"], [c for c in result["checks"] if c["status"] == "fail"]
    assert result["verl"] == profile.VERL_TARGETS["0.9.1"].identity


def test_a_091_bundle_imports_back_with_nothing_refused(bundle_091, tmp_path):
    report, _ = import_verl(bundle_091, tmp_path / "recipe.yaml")
    assert report["ok"] and not report["counts"]["refused"], report["counts"]
    labels = {f["field"]: f["label"] for f in report["fields"]}
    assert labels["trainer.use_v1"] == "informational"


def test_a_v1_key_in_a_080_bundle_is_refused(toy_bundle, tmp_path):
    # 0.8.0 does not read trainer.use_v1: an edited 0.8.0 bundle carrying it is refused.
    bundle = tmp_path / "bundle"
    shutil.copytree(toy_bundle, bundle)
    path = bundle / "recipe/verl-overrides.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["trainer"]["use_v1"] = True
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ConfigError, match="(?s)1 problem.*a verl 0.8.0 bundle does not write "
                       "trainer.use_v1; remove it"):
        import_verl(path, tmp_path / "recipe.yaml")
    assert not (tmp_path / "recipe.yaml").exists()


def test_an_unknown_release_is_refused_naming_the_choices(toy_run, tmp_path):
    with pytest.raises(ConfigError, match=r"--verl-version '0\.7\.0'.*0\.8\.0, 0\.9\.1"):
        export_verl(toy_run, tmp_path / "b", verl_version="0.7.0")
    assert not (tmp_path / "b").exists()
