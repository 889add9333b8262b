"""export-verl -> import-verl: miniverl's own bundle imports back as an equivalent recipe;
the shipped example verl config imports as its README says."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from miniverl.bridge import artifacts, profile
from miniverl.bridge.bundle import build_overrides, export_verl
from miniverl.bridge.importer import import_verl
from miniverl.common.errors import ConfigError
from miniverl.common.hashing import write_sums
from miniverl.common.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "verl" / "qwen3_opd_calculator.yaml"


def _overrides(bundle: Path) -> dict:
    return yaml.safe_load((bundle / profile.BUNDLE_FILES["overrides"]).read_text())


def _reexport(recipe, bundle: Path) -> dict:
    """The overrides ``recipe`` would export to, with the bundle's own LoRA and prompt room."""
    manifest = json.loads((bundle / profile.BUNDLE_FILES["manifest"]).read_text())
    return build_overrides(recipe, manifest["lora"], run_name=recipe.run.name,
                           max_prompt=manifest["max_prompt_length"]["value"])


def _assert_equivalent(imported, source, bundle: Path) -> None:
    # Everything verl runs is the same, and so is what verl has no field for.
    assert _reexport(imported, bundle) == _reexport(source, bundle)
    assert imported.student.model == source.student.model
    assert imported.teacher.model == source.teacher.model
    assert imported.student.lora is None or source.student.lora is not None
    if source.student.lora is not None:
        for key in ("r", "alpha", "target_modules"):
            assert getattr(imported.student.lora, key) == getattr(source.student.lora, key)
    assert imported.environment == source.environment
    for section, keys in {
        "run": ("name", "mode", "seed"),
        "rollout": ("max_turns", "max_new_tokens_per_turn", "max_total_tokens", "temperature",
                    "top_p"),
        "train": ("cycles", "rollouts_per_cycle", "grad_accum", "lr", "save_every", "eval_every"),
        "loss": ("objective", "divergence", "top_k"),
    }.items():
        for key in keys:
            assert getattr(getattr(imported, section), key) == getattr(
                getattr(source, section), key), f"{section}.{key}"


@pytest.mark.parametrize("form", ["overrides file", "bundle directory"])
def test_lora_bundle_round_trip(toy_run, toy_bundle, tmp_path, form):
    config = toy_bundle if form == "bundle directory" else toy_bundle / "recipe/verl-overrides.yaml"
    report, report_path = import_verl(config, tmp_path / "recipe.yaml")
    assert report["ok"] and not report["counts"]["refused"] and not report["counts"]["unsupported"]
    # Every field the exporter wrote is accounted for in the report.
    fields = {f["field"] for f in report["fields"]}
    assert set(profile.flatten(_overrides(toy_bundle))) <= fields
    _assert_equivalent(load_recipe(tmp_path / "recipe.yaml"),
                       artifacts.load_run_recipe(toy_run), toy_bundle)


def test_full_finetune_bundle_round_trip(tmp_path):
    from miniverl.common.modeling import resolve_model_dir
    from miniverl.common.recipe import Recipe
    from miniverl.common.rundir import RunDir
    from tests.bridge.conftest import RECIPE

    source = Recipe.model_validate({**RECIPE, "student": {**RECIPE["student"], "lora": None},
                                    "train": {**RECIPE["train"], "grad_accum": 2}})
    run = RunDir.create(tmp_path / "runs", source, run_id="full-run")
    shutil.copytree(resolve_model_dir(source.student.model),
                    run.checkpoints_dir / "step_1" / "model")
    export_verl(run.path, tmp_path / "bundle")
    # model/full is the fine-tuned result, never read as a hub id "model/full".
    assert _overrides(tmp_path / "bundle")["actor_rollout_ref"]["model"]["path"] == "model/full"
    report, _ = import_verl(tmp_path / "bundle", tmp_path / "recipe.yaml")
    assert report["ok"], [f for f in report["fields"] if f["label"] in ("refused", "unsupported")]
    imported = load_recipe(tmp_path / "recipe.yaml")
    assert imported.student.lora is None and imported.train.grad_accum == 2
    _assert_equivalent(imported, source, tmp_path / "bundle")


def test_prepared_teacher_imports_as_its_cached_directory(prepared_run, tmp_path):
    run, prepared = prepared_run
    export_verl(run, tmp_path / "bundle")
    import_verl(tmp_path / "bundle", tmp_path / "recipe.yaml")
    assert load_recipe(tmp_path / "recipe.yaml").teacher.model.path == str(prepared)
    # Other weights under the same name are not the teacher the run trained against.
    (prepared / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(ConfigError, match=f"cached {prepared.name} holds other weights"):
        import_verl(tmp_path / "bundle", tmp_path / "again.yaml")
    shutil.rmtree(prepared)
    with pytest.raises(ConfigError, match="not in this machine's cache"):
        import_verl(tmp_path / "bundle", tmp_path / "again.yaml")
    assert not (tmp_path / "again.yaml").exists()


def _copy(bundle: Path, tmp_path: Path) -> Path:
    out = tmp_path / "b"
    shutil.copytree(bundle, out)
    return out


def _edit(path: Path, old: str, new: str) -> None:
    """Replace ``old`` (which must be there) with ``new`` in ``path``."""
    text = path.read_text()
    assert old in text, f"{old!r} is not in {path}"
    path.write_text(text.replace(old, new))


def _edited_copy(bundle: Path, tmp_path: Path, file: str, old: str,
                 new: str) -> tuple[Path, Path]:
    """A copy of ``bundle`` with ``old`` replaced by ``new`` in its ``file`` (a
    ``BUNDLE_FILES`` key); returns the copy and the edited file."""
    copy = _copy(bundle, tmp_path)
    path = copy / profile.BUNDLE_FILES[file]
    _edit(path, old, new)
    return copy, path


def test_edited_overrides_import_field_by_field(toy_bundle, tmp_path):
    bundle, path = _edited_copy(toy_bundle, tmp_path, "overrides", "lr: 0.001", "lr: 0.0005")
    import_verl(bundle, tmp_path / "recipe.yaml")
    assert load_recipe(tmp_path / "recipe.yaml").train.lr == 0.0005
    _edit(path, "n_gpus_per_node: 1", "n_gpus_per_node: 8")
    with pytest.raises(ConfigError, match="trainer.n_gpus_per_node: profile .* fixes 1 .got 8"):
        import_verl(bundle, tmp_path / "again.yaml")


def test_tampered_provenance_is_refused(toy_bundle, tmp_path):
    bundle, manifest = _edited_copy(toy_bundle, tmp_path, "manifest", '"calculator"', '"jsonnav"')
    with pytest.raises(ConfigError, match="provenance/manifest.json: sha256 differs"):
        import_verl(bundle, tmp_path / "recipe.yaml")
    data = json.loads(manifest.read_text())
    data["profile"] = "some-other-profile"
    manifest.write_text(json.dumps(data))
    write_sums(bundle)
    with pytest.raises(ConfigError, match="some-other-profile"):
        import_verl(bundle, tmp_path / "recipe.yaml")


def test_generic_import_of_a_bundle_file_copied_elsewhere_is_still_refused(toy_bundle, tmp_path):
    # Outside its bundle the overrides file has no provenance: the generic rules apply.
    shutil.copy(toy_bundle / profile.BUNDLE_FILES["overrides"], tmp_path / "verl.yaml")
    with pytest.raises(ConfigError, match="BASE_MODEL_DIR"):
        import_verl(tmp_path / "verl.yaml", tmp_path / "out" / "recipe.yaml")


def test_cli_imports_a_bundle(toy_bundle, tmp_path):
    from typer.testing import CliRunner

    from miniverl.cli.app import app

    out = tmp_path / "recipe.yaml"
    result = CliRunner().invoke(app, ["import-verl", str(toy_bundle), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "refused" not in result.output and out.is_file()


# ---------------------------------------------------------------------- the example

EXAMPLE_REVISIONS = ("c1899de289a04d12100db370d81485cdf75e47ca",
                     "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e")


def test_example_verl_config_imports(tmp_path):
    # examples/verl/README.md: the command there writes a valid recipe, nothing refused.
    readme = (EXAMPLE.parent / "README.md").read_text()
    assert f"--revision {EXAMPLE_REVISIONS[0]}" in readme
    assert f"--teacher-revision {EXAMPLE_REVISIONS[1]}" in readme
    report, _ = import_verl(EXAMPLE, tmp_path / "recipe.yaml", revision=EXAMPLE_REVISIONS[0],
                            teacher_revision=EXAMPLE_REVISIONS[1])
    assert report["ok"] and report["counts"]["refused"] == report["counts"]["unsupported"] == 0
    recipe = load_recipe(tmp_path / "recipe.yaml")
    assert recipe.student.model.hub_id == "Qwen/Qwen3-0.6B"
    assert recipe.teacher.model.hub_id == "Qwen/Qwen3-1.7B"
    assert recipe.student.lora.r == 16 and recipe.loss.top_k == 32
    assert recipe.run.mode == "opd"
    # Every field in the example is one the importer understands.
    config = yaml.safe_load(EXAMPLE.read_text())
    assert {f["field"] for f in report["fields"]} >= set(profile.flatten(config))


def test_batch_sizes_that_disagree_are_unsupported(toy_bundle, tmp_path):
    bundle, _ = _edited_copy(toy_bundle, tmp_path, "overrides", "train_batch_size: 4",
                             "train_batch_size: 8")
    with pytest.raises(ConfigError, match="data.train_batch_size: must equal ppo_mini_batch_size"):
        import_verl(bundle, tmp_path / "recipe.yaml")


def test_cli_refuses_a_tampered_bundle_in_one_line(toy_bundle, tmp_path, capsys):
    from miniverl.cli.app import run

    bundle = _copy(toy_bundle, tmp_path)
    (bundle / profile.BUNDLE_FILES["base_model"]).write_text("{}")
    code = run(["import-verl", str(bundle), "--out", str(tmp_path / "recipe.yaml")])
    err = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "recipe.yaml").exists()
    assert err.count("\n") == 1 and "model/base_model.json: sha256 differs" in err
