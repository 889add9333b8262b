"""export-verl of a mixture and of several teachers: one bundle of every environment, one
teacher entry per route, each thing verl cannot carry named in one line, doctor passing,
and export -> import-verl -> export giving the same files. The checks by verl's own code
are in test_verl_real.py (marker ``verl``)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml

from miniverl.bridge import profile
from miniverl.bridge.bundle import export_verl
from miniverl.bridge.doctor import doctor
from miniverl.bridge.importer import import_verl
from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe, diff_recipes, load_recipe
from tests.bridge.conftest import RECIPE, make_run, mixture_recipe

CALC_HUB, NAV_HUB = "org/calc-adapter@" + "a" * 40, "org/nav-adapter@" + "b" * 40


def _flat(bundle: Path) -> dict:
    return profile.flatten(yaml.safe_load((bundle / "recipe/verl-overrides.yaml").read_text()))


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "provenance/manifest.json").read_text())


def _sums(bundle: Path) -> dict[str, str]:
    return {line.split("  ")[1]: line.split("  ")[0]
            for line in (bundle / "SHA256SUMS").read_text().splitlines()}


@pytest.fixture(scope="module")
def two_bundle(two_teacher_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("two") / "bundle"
    export_verl(two_teacher_run, out, verl_version="0.9.1", teacher_gpus=["nav=2"])
    return out


def test_a_mixture_bundle_holds_every_environment(mixture_run, tmp_path):
    import pyarrow.parquet as pq

    manifest = export_verl(mixture_run, tmp_path / "b", verl_version="0.9.1")
    bundle = tmp_path / "b"
    rows = pq.read_table(bundle / "data/train.parquet").to_pylist()
    assert [r["data_source"] for r in rows] == ["miniverl/calculator"] * 6 + ["miniverl/jsonnav"] * 6
    # Each row shows verl's tool agent its own environment's tools, in that order.
    assert {tuple(r["extra_info"]["tool_selection"]) for r in rows} == {
        ("calculator", "convert"), ("get", "keys", "find")}
    tools = yaml.safe_load((bundle / "recipe/tool_config.yaml").read_text())["tools"]
    assert [t["tool_schema"]["function"]["name"] for t in tools] == [
        "calculator", "convert", "get", "keys", "find"]
    envs = {e["name"]: e for e in manifest["environments"]}
    assert envs["jsonnav"]["rows"] == {"train": 6, "val": 3}
    assert envs["calculator"]["tasks_sha256"]["train"].startswith("sha256:")
    assert manifest["weights"]["shares"]["calculator"] == {"miniverl": 0.666667, "verl": 0.5}
    # One teacher: verl's own teacher_model entry, with a pool verl accepts (1 GPU default).
    flat = _flat(bundle)
    assert flat["distillation.teacher_models.teacher_model.model_path"] == "TEACHER_MODEL_DIR"
    assert (flat["distillation.nnodes"], flat["distillation.n_gpus_per_node"]) == (1, 1)
    assert doctor(bundle)["ok"]


def test_each_thing_that_cannot_move_is_one_line_in_output_readme_and_provenance(
        mixture_run, tmp_path):
    from typer.testing import CliRunner

    from miniverl.cli.app import app

    result = CliRunner().invoke(app, ["export-verl", "--run", str(mixture_run), "--out",
                                      str(tmp_path / "b"), "--verl-version", "0.8.0"])
    assert result.exit_code == 0, result.output
    said = [line[len("does not move: "):] for line in result.output.splitlines()
            if line.startswith("does not move: ")]
    source = json.loads((tmp_path / "b/provenance/source_run.json").read_text())
    assert said == source["not_moved"] and "not_moved" not in _manifest(tmp_path / "b")
    assert any(line.startswith("environments' weights: verl draws train.parquet's rows "
                               "uniformly") and "calculator 50% of verl's episodes, 67% of "
               "miniverl's" in line for line in said)
    assert any("no tail bucket" in line for line in said)
    readme = (tmp_path / "b/README.md").read_text()
    assert all(f"- {line}" in readme for line in said)
    assert "| miniverl/calculator | 6 / 3 | 67% | 50% | teacher |" in readme


def test_several_teachers_one_entry_per_route(two_bundle):
    flat, manifest = _flat(two_bundle), _manifest(two_bundle)
    assert flat["distillation.teacher_key"] == "data_source"
    for entry, key, var, gpus in (("calc", "miniverl/calculator", "TEACHER_CALC_MODEL_DIR", 1),
                                  ("nav", "miniverl/jsonnav", "TEACHER_NAV_MODEL_DIR", 2)):
        prefix = f"distillation.teacher_models.{entry}"
        assert (flat[f"{prefix}.key"], flat[f"{prefix}.model_path"]) == (key, var)
        assert flat[f"{prefix}.num_replicas"] == gpus
        assert flat[f"{prefix}.inference.tensor_model_parallel_size"] == 1
        assert flat[f"{prefix}.inference.load_format"] == "auto"  # real weights, not dummy
    # verl's check: the teachers' replicas sum to the pool.
    assert (flat["distillation.nnodes"], flat["distillation.n_gpus_per_node"]) == (1, 3)
    assert "distillation.teacher_models.teacher_model.model_path" not in flat
    # Each entry's blocks are its own: no YAML alias between entries.
    assert "&id" not in (two_bundle / "recipe/verl-overrides.yaml").read_text()
    base = json.loads((two_bundle / "model/base_model.json").read_text())
    assert base["teachers"]["nav"]["toy"]["seed"] == 2 and "teacher" not in base
    launch = (two_bundle / "recipe/launch.template.sh").read_text()
    assert 'distillation.teacher_models.nav.model_path="$TEACHER_NAV_MODEL_DIR"' in launch
    assert "TEACHER_MODEL_DIR" not in launch and "set TEACHER_CALC_MODEL_DIR" in launch
    assert manifest["teachers"]["routes"]["calc"]["environments"] == ["calculator"]
    result = doctor(two_bundle)
    assert result["ok"], [c for c in result["checks"] if c["status"] == "fail"]
    assert "teacher model weights absent (TEACHER_NAV_MODEL_DIR)" in result["launch_blockers"]


def test_an_edited_entry_fails_doctor(two_bundle, tmp_path):
    from miniverl.common.hashing import write_sums

    bundle = tmp_path / "b"
    shutil.copytree(two_bundle, bundle)
    path = bundle / "recipe/verl-overrides.yaml"
    path.write_text(path.read_text().replace("key: miniverl/jsonnav", "key: miniverl/sqlite"))
    write_sums(bundle)
    detail = {c["name"]: c for c in doctor(bundle)["checks"]}["overrides"]
    assert detail["status"] == "fail" and "distillation.teacher_models.nav must have key" in (
        detail["detail"])


def test_a_route_of_two_environments_and_an_adapter_route_are_named(toy_run, tmp_path):
    # teacher.adapters: one process, two adapters; the sql adapter scores two environments.
    data = mixture_recipe(False, [
        {"name": "calculator", "train_tasks": 2, "eval_tasks": 1, "adapter": "calc"},
        {"name": "jsonnav", "train_tasks": 2, "eval_tasks": 1, "adapter": "nav"},
        {"name": "sqlite", "train_tasks": 2, "eval_tasks": 1, "adapter": "nav"}])
    data["teacher"] = {**data["teacher"], "adapters": {"calc": CALC_HUB, "nav": NAV_HUB}}
    run = make_run(toy_run, tmp_path / "runs", data, "adapter-run")
    manifest = export_verl(run, tmp_path / "b", verl_version="0.9.1")
    lines = manifest["not_moved"]
    assert ("route teacher/nav: scores jsonnav, sqlite, and verl matches one data_source per "
            "teacher entry, so it becomes 2 entries (teacher_nav__jsonnav, teacher_nav__sqlite), "
            "each its own teacher replica(s)") in lines
    assert ("route teacher/calc: verl's teacher entry loads one model (no adapter field), so "
            "its model_path is the base with adapter calc merged (TEACHER_TEACHER_CALC_MODEL_DIR; "
            "model/base_model.json names both)") in lines
    base = json.loads((tmp_path / "b/model/base_model.json").read_text())
    assert base["teachers"]["teacher/calc"]["adapter"] == {
        "name": "calc", "source": "hub", "hub_id": CALC_HUB}
    flat = _flat(tmp_path / "b")
    assert flat["distillation.teacher_models.teacher_nav__sqlite.key"] == "miniverl/sqlite"
    assert doctor(tmp_path / "b")["ok"]
    # And back: the hub adapters come back as the teacher's adapters, each environment's.
    import_verl(tmp_path / "b", tmp_path / "recipe.yaml")
    recipe = load_recipe(tmp_path / "recipe.yaml")
    assert recipe.teacher.adapters == {"calc": CALC_HUB, "nav": NAV_HUB}
    assert [(e.name, e.adapter) for e in recipe.environments] == [
        ("calculator", "calc"), ("jsonnav", "nav"), ("sqlite", "nav")]


def test_a_local_adapter_route_does_not_import(toy_run, tmp_path):
    adapter = tmp_path / "my-adapter"
    adapter.mkdir()
    data = mixture_recipe(False, [
        {"name": "calculator", "train_tasks": 2, "eval_tasks": 1, "adapter": "calc"},
        {"name": "jsonnav", "train_tasks": 2, "eval_tasks": 1, "adapter": "nav"}])
    data["teacher"] = {**data["teacher"], "adapters": {"calc": str(adapter),
                                                       "nav": str(adapter)}}
    run = make_run(toy_run, tmp_path / "runs", data, "local-adapter-run")
    export_verl(run, tmp_path / "b", verl_version="0.9.1")
    with pytest.raises(ConfigError, match=r"route teacher/calc was exported as its base merged "
                       r"with adapter 'calc', which the bundle does not publish"):
        import_verl(tmp_path / "b", tmp_path / "recipe.yaml")


# Each teacher setting verl has no field for, and its line's reason.
TEACHER_SETTINGS = [
    ("min_success", 0.5, "verl has no qualification gate"),
    ("min_recovery", 0.25, "verl has no qualification gate"),
    ("mode", "privileged_context",
     "verl's teacher scores the student's own tokens, never a privileged view"),
    ("scorer", "my_scorer", "verl's teacher is the causal LM itself"),
]


@pytest.mark.parametrize(("field", "value", "why"), TEACHER_SETTINGS,
                         ids=[s[0] for s in TEACHER_SETTINGS])
def test_a_teacher_setting_verl_lacks_is_named(toy_run, tmp_path, field, value, why):
    # A route's setting, in a run of several teachers; one teacher's, in a run of one
    # environment (each one line of the export's output).
    data = mixture_recipe(True)
    data["teachers"]["nav"] = {**data["teachers"]["nav"], field: value}
    run = make_run(toy_run, tmp_path / "runs", data, "gated-run")
    lines = export_verl(run, tmp_path / "b", verl_version="0.9.1")["not_moved"]
    assert f"route nav: teachers.nav.{field} {value!r} does not move ({why})" in lines
    one = {**RECIPE, "teacher": {**RECIPE["teacher"], field: value}}
    run = make_run(toy_run, tmp_path / "runs", one, "gated-one")
    lines = export_verl(run, tmp_path / "c")["not_moved"]
    assert f"teacher.{field} {value!r} does not move ({why})" in lines


def test_refusals_are_one_line(two_teacher_run, toy_run, tmp_path):
    for gpus, said in ((["x=2"], r"'x' is not a teacher route of this run; pass one of calc, nav"),
                       (["0"], "must be a positive integer")):
        with pytest.raises(ConfigError, match=said) as info:
            export_verl(two_teacher_run, tmp_path / "b", teacher_gpus=gpus)
        assert "\n" not in str(info.value)
    data = mixture_recipe(True)
    data["teachers"]["nav"] = {**data["teachers"]["nav"], "tokenizer": "other"}
    data["loss"] = {"top_k": 8, "cross_vocab": "hybrid"}
    run = make_run(toy_run, tmp_path / "runs", data, "xvocab-run")
    with pytest.raises(ConfigError, match="route nav has tokenizer: other"):
        export_verl(run, tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_a_single_environment_bundle_takes_teacher_gpus(toy_run, tmp_path):
    # Unset, one environment's bundle has the default pool (1 GPU on 1 node: verl's trainer
    # refuses its own default of 0 nodes); given, the pool it names.
    flat = _flat_of(toy_run, tmp_path / "a", None)
    assert (flat["distillation.nnodes"], flat["distillation.n_gpus_per_node"]) == (1, 1)
    # Its lines come back to the command, its manifest and README stay as they were.
    manifest = _manifest(tmp_path / "a")
    assert "not_moved" not in manifest and "environments" not in manifest
    assert "not_moved" not in json.loads((tmp_path / "a/provenance/source_run.json").read_text())
    assert "What does not move" not in (tmp_path / "a/README.md").read_text()
    lines = export_verl(toy_run, tmp_path / "c")["not_moved"]
    assert lines == ["loss.objective bucketed_topk_tail: verl's distillation loss reads the "
                     "teacher's top-8 log-probs and has no tail bucket"]
    flat = _flat_of(toy_run, tmp_path / "b", ["2"])
    assert (flat["distillation.nnodes"], flat["distillation.n_gpus_per_node"]) == (1, 2)


def _flat_of(run, out, gpus):
    export_verl(run, out, teacher_gpus=gpus)
    return _flat(out)


# The three kinds of bundle: one environment and one teacher, a mixture with one
# teacher, a mixture routed to two teachers.
KINDS = {"one environment": lambda: copy.deepcopy(RECIPE),
         "a mixture": lambda: mixture_recipe(False),
         "several teachers": lambda: mixture_recipe(True)}


@pytest.fixture
def one_clock(monkeypatch):
    """Every run made in the test is created and finishes at the same instant: a second
    run of the same recipe and weights then differs from the first in nothing it could
    not repeat (its timestamps)."""
    from miniverl.common import manifest, rundir

    for module in (manifest, rundir):
        monkeypatch.setattr(module, "utc_now_ms", lambda: "2026-01-31T12:00:00.000Z")


@pytest.mark.parametrize("version", sorted(profile.VERL_TARGETS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_export_import_export_gives_the_same_bundle(toy_run, tmp_path, one_clock, kind,
                                                    version):
    source = KINDS[kind]()
    first = tmp_path / "first"
    export_verl(make_run(toy_run, tmp_path / "runs", source, "source-run"), first,
                verl_version=version)
    report, _ = import_verl(first, tmp_path / "imported" / "recipe.yaml")
    assert report["ok"] and not report["counts"]["refused"]
    # The recipe comes back whole: what verl carries from the overrides, the rest (device,
    # dtypes, test tasks) from the source run's recipe in the bundle's provenance.
    imported = load_recipe(tmp_path / "imported" / "recipe.yaml")
    assert diff_recipes(imported, Recipe.model_validate(source)) == []
    assert {"student.device", "student.dtype"} <= {f["target"] for f in report["fields"]}
    # The imported recipe trained again (same weights, same run id), exported again:
    # every file of the bundle has the same checksum.
    again = yaml.safe_load((tmp_path / "imported" / "recipe.yaml").read_text())
    second = tmp_path / "second"
    export_verl(make_run(toy_run, tmp_path / "runs2", again, "source-run"), second,
                verl_version=version)
    files = {str(f.relative_to(first)) for f in first.rglob("*") if f.is_file()}
    assert set(_sums(first)) == files - {"SHA256SUMS"}
    # 15 files besides the tokenizer's, whose count is transformers' (4.56 also writes
    # special_tokens_map.json).
    assert len([f for f in files if not f.startswith("model/tokenizer/")]) == 15, sorted(files)
    assert _sums(second) == _sums(first)


# Runs that did not train by OPD: the bundle's verl config distils on-policy, and the
# recipe that comes back is the run's own, its mode and its offline set included.
MODES = {"sft": {}, "replay": {"max_lag": 2}, "offline_kd teacher set": {"fixed_set": "teacher"},
         "offline_kd trajectories": {"trajectories": "TRAJ"}}


@pytest.mark.parametrize("case", sorted(MODES))
def test_a_run_of_another_mode_comes_back_as_itself(toy_run, tmp_path, one_clock, case):
    trajs = tmp_path / "sets" / "trajectories.jsonl"
    trajs.parent.mkdir()
    trajs.write_text("")
    source = copy.deepcopy(RECIPE)
    source["run"]["mode"] = case.split()[0]
    source["train"].update({k: str(trajs) if v == "TRAJ" else v for k, v in MODES[case].items()})
    first = tmp_path / "first"
    lines = export_verl(make_run(toy_run, tmp_path / "runs", source, "source-run"),
                        first)["not_moved"]
    assert lines[0].startswith(f"run.mode {source['run']['mode']}: the bundle's verl config "
                               "distils on the student's own rollouts")
    given = trajs if "trajectories" in case else None
    out = tmp_path / "imported" / "recipe.yaml"
    if given is not None:
        # The bundle holds no offline set: without the file, one line naming the flag
        # (the oracle traces offline_kd would fall back to are other data).
        assert any(line.startswith("train.trajectories: ") for line in lines)
        with pytest.raises(ConfigError) as err:
            import_verl(first, out)
        assert str(err.value).count("\n") == 1 and "pass it with --trajectories FILE" in str(
            err.value)
        assert not out.exists()
        with pytest.raises(ConfigError, match="is not a file"):
            import_verl(first, out, trajectories=tmp_path / "missing.jsonl")
    else:
        with pytest.raises(ConfigError, match="the source run read no trajectories file"):
            import_verl(first, out, trajectories=trajs)
    report, _ = import_verl(first, out, trajectories=given)
    assert report["ok"]
    imported = load_recipe(out)
    assert imported.run.mode == source["run"]["mode"]
    assert diff_recipes(imported, Recipe.model_validate(source)) == []
    # Trained again and exported again: every file the same.
    second = tmp_path / "second"
    export_verl(make_run(toy_run, tmp_path / "runs2", yaml.safe_load(out.read_text()),
                         "source-run"), second)
    assert _sums(second) == _sums(first)


def test_an_edited_route_key_is_refused_on_import(two_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(two_bundle, bundle)
    path = bundle / "recipe/verl-overrides.yaml"
    path.write_text(path.read_text().replace("key: miniverl/jsonnav", "key: miniverl/sqlite"))
    with pytest.raises(ConfigError, match=r"(?s)1 problem.*route nav was exported keyed by "
                       r"'miniverl/jsonnav'; a teacher keyed by 'miniverl/sqlite' is a route "
                       "miniverl cannot express"):
        import_verl(bundle, tmp_path / "recipe.yaml")
    assert not (tmp_path / "recipe.yaml").exists()


def test_two_schemas_of_one_tool_name_are_refused():
    from miniverl.bridge.mixture_bundle import tool_union
    from miniverl.bridge.parquet import EnvFacts

    spec = {"type": "function", "function": {"name": "get", "description": "x",
                                             "parameters": {"type": "object"}}}
    other = {**spec, "function": {**spec["function"], "description": "y"}}
    same = [EnvFacts("a", {}, "", [spec]), EnvFacts("b", {}, "", [spec])]
    assert tool_union(same) == [spec]  # one schema, named once
    with pytest.raises(ConfigError, match="environments a and b both define tool 'get' with "
                       "different schemas"):
        tool_union([same[0], EnvFacts("b", {}, "", [other])])


def test_one_teacher_of_another_tokenizer_is_refused(toy_run, tmp_path):
    from tests.bridge.conftest import RECIPE

    data = {**RECIPE, "teacher": {**RECIPE["teacher"], "tokenizer": "other"},
            "loss": {"top_k": 8, "cross_vocab": "hybrid"}}
    run = make_run(toy_run, tmp_path / "runs", data, "xvocab-one")
    with pytest.raises(ConfigError, match="teacher.tokenizer is other"):
        export_verl(run, tmp_path / "b")


def _prepared_run(toy_run, root: Path, data: dict, preps: dict[str, Path]) -> Path:
    """A run of ``data`` whose routes trained against the teachers ``preps`` prepared
    (recorded as `up` records them)."""
    from miniverl.common.manifest import record_teacher
    from miniverl.common.rundir import RunDir
    from miniverl.student.teacher_prep import prepared_dir

    run_dir = make_run(toy_run, root, data, "prepared-two")
    for name, prep in preps.items():
        path = prepared_dir(None, prep)
        identity = {"name": path.name, "model": str(path), "revision": None,
                    "adapter_sha256": None}
        record_teacher(RunDir.open(run_dir), 0, identity, "connect", route=name)
    return run_dir


@pytest.mark.parametrize("prepare", ["relative", "absolute", None])
def test_prepared_teachers_come_back_the_same(toy_run, tmp_path, one_clock, prepare):
    # Each route trained against a prepared teacher; the bundle names both. A recipe that
    # prepared them (teachers.<name>.prepare) comes back as it was: each teacher's model
    # and its prepare: (the prep recipe that made the cached directory, relative to the
    # imported recipe, or absolute as the run's was), and exports to the same files. Where the recipe did not say
    # prepare:, each teacher comes back as its cached directory, which exports as the
    # same prepared teacher, from the same model (the recipe itself differs).
    import os

    from miniverl.student.teacher_prep import prepared_dir
    from tests.bridge.conftest import TEACHERS, prepared_teacher_dir

    data, preps = mixture_recipe(True), {}
    for name, spec in TEACHERS.items():
        preps[name] = tmp_path / f"prep_{name}.yaml"
        preps[name].write_text(yaml.safe_dump({
            "schema_version": 1, "run": {"name": "p", "mode": "sft"},
            "student": {"model": spec["model"], "lora": None},
            "environment": {"name": "calculator"}}))
        path = prepared_teacher_dir(prepared_dir(None, preps[name]).name, spec["model"]["toy"])
        record = json.loads((path / "miniverl_prepared.json").read_text())
        (path / "miniverl_prepared.json").write_text(json.dumps(
            {**record, "prep_recipe": str(preps[name])}))
        if prepare is not None:
            data["teachers"][name]["prepare"] = (
                preps[name].name if prepare == "relative" else str(preps[name]))
    first = tmp_path / "first"
    export_verl(_prepared_run(toy_run, tmp_path / "runs", data, preps), first,
                verl_version="0.9.1")
    base = json.loads((first / "model/base_model.json").read_text())
    assert base["teachers"]["nav"]["source"] == "prepared"
    assert base["teachers"]["nav"]["prepared_from"]["toy"]["seed"] == 2
    # Beside the prep recipes, as the source recipe was (an absolute prepare: anywhere).
    recipe = tmp_path / ("imp/recipe.yaml" if prepare == "absolute" else "recipe.yaml")
    import_verl(first, recipe)
    again = yaml.safe_load(recipe.read_text())
    second = tmp_path / "second"
    export_verl(_prepared_run(toy_run, tmp_path / "runs2", again, preps), second,
                verl_version="0.9.1")
    a, b = _sums(first), _sums(second)
    if prepare is not None:
        assert again["teachers"]["nav"]["prepare"] == data["teachers"]["nav"]["prepare"]
        assert list(again["teachers"]["nav"]["model"]) == ["toy"]
        assert again["teachers"]["nav"]["model"]["toy"]["seed"] == 2
        assert a == b
    else:
        assert os.path.basename(again["teachers"]["nav"]["model"]["path"]).startswith(
            "prepared-")
        assert sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k)) == [
            "README.md", "provenance/source_run.json"]


def test_loss_settings_verl_lacks_are_named(toy_run, tmp_path):
    data = mixture_recipe(False)
    data["loss"] = {"top_k": 8, "divergence": "reverse_kl", "positions": "uniform",
                    "position_ratio": 0.5, "temperature": 2.0}
    data["rollout"] = {**data["rollout"], "temperature": 2.0}
    run = make_run(toy_run, tmp_path / "runs", data, "loss-run")
    lines = export_verl(run, tmp_path / "b", verl_version="0.9.1")["not_moved"]
    assert [line.split(":")[0] for line in lines[1:]] == [
        "loss.objective bucketed_topk_tail", "loss.estimator full", "loss.positions uniform",
        "loss.temperature 2"]
    assert _flat(tmp_path / "b")["distillation.distillation_loss.loss_mode"] == "k3"


def test_loss_settings_verl_lacks_round_trip_too(toy_run, tmp_path, one_clock):
    # Its bundle says the full reverse-KL estimator, the positions and the temperature do
    # not move (verl trains k3 on every token at 1.0); the recipe comes back with the run's
    # own (the bundle's provenance), and exports to the same files again.
    data = mixture_recipe(True)
    data["loss"] = {"top_k": 8, "divergence": "reverse_kl", "positions": "uniform",
                    "position_ratio": 0.5, "temperature": 2.0}
    data["rollout"] = {**data["rollout"], "temperature": 2.0}
    first = tmp_path / "first"
    lines = export_verl(make_run(toy_run, tmp_path / "runs", data, "rkl"), first)["not_moved"]
    assert any(line.startswith("loss.estimator full") for line in lines)
    report, _ = import_verl(first, tmp_path / "imp" / "recipe.yaml")
    again = yaml.safe_load((tmp_path / "imp" / "recipe.yaml").read_text())
    assert (again["loss"]["estimator"], again["loss"]["positions"],
            again["loss"]["temperature"]) == ("full", "uniform", 2.0)
    assert "loss.estimator" in {f["target"] for f in report["fields"]}
    second = tmp_path / "second"
    export_verl(make_run(toy_run, tmp_path / "runs2", again, "rkl"), second)
    assert _sums(first) == _sums(second)


def test_an_edited_loss_mode_imports_as_verl_trains_it(toy_run, tmp_path):
    # The overrides say another loss than the run's: the recipe trains what they say.
    data = mixture_recipe(True)
    data["loss"] = {"top_k": 8, "divergence": "reverse_kl"}
    bundle = tmp_path / "b"
    export_verl(make_run(toy_run, tmp_path / "runs", data, "rkl"), bundle)
    path = bundle / "recipe/verl-overrides.yaml"
    path.write_text(path.read_text().replace("loss_mode: k3", "loss_mode: forward_kl_topk"))
    import_verl(bundle, tmp_path / "recipe.yaml")
    loss = load_recipe(tmp_path / "recipe.yaml").loss
    assert (loss.divergence, loss.estimator) == ("forward_kl", "full")
    path.write_text(path.read_text().replace("loss_mode: forward_kl_topk", "loss_mode: k1"))
    import_verl(bundle, tmp_path / "again.yaml")
    loss = load_recipe(tmp_path / "again.yaml").loss
    assert (loss.divergence, loss.estimator) == ("reverse_kl", "sampled_token")
