"""Matched-budget benchmarks with a fake cell runner: budgets, statistics, resume, export."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from miniverl.common.errors import ConfigError
from miniverl.student.benchmark.config import load_benchmark_config
from miniverl.student.benchmark.export import (
    HardwareResult,
    benchmark_result_json_schema,
    build_hardware_result,
    export_benchmark,
)
from miniverl.student.benchmark.results import BenchmarkResults, CellResult
from miniverl.student.benchmark.run import TrainerCells, run_benchmark
from miniverl.student.benchmark.stats import bootstrap_mean_interval
from tests.student.report.report_runs import make_run, toy_sft_recipe

BASE_RECIPE = {
    "run": {"name": "toy", "mode": "sft"},
    "student": {"model": {"toy": {"hidden": 32}}},
    "train": {"cycles": 3, "lr": 0.001},
}
ARM_SHIFT = {"sft": 0.0, "opd": 0.2, "opd_serial": 0.15}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch) -> None:
    # A run writes runs/benchmarks/<name> under the working directory: keep it in tmp.
    monkeypatch.chdir(tmp_path)


def write_config(tmp_path: Path, **changes) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE_RECIPE))
    config = {
        "name": "toy",
        "recipe": "base.yaml",
        "arms": [
            {"name": "sft", "mode": "sft"},
            {"name": "opd", "mode": "opd", "pipelining": True},
            {"name": "opd_serial", "mode": "opd", "pipelining": False},
        ],
        "baseline": "sft",
        "seeds": [0, 1, 2],
        "budget": {"kind": "updates", "updates": 5},
        "output_dir": str(tmp_path / "out"),
        "bootstrap": {"samples": 500, "seed": 0},
    }
    config.update(changes)
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class FakeCells:
    """Records each call; success depends on arm (via the recipe) and seed, deterministically."""

    def __init__(self, fail_after: int | None = None, broken: set[tuple[str, int]] = frozenset()):
        self.calls: list[tuple[str, int, dict]] = []
        self.fail_after = fail_after
        self.broken = broken

    def __call__(self, recipe: dict, seed: int) -> CellResult:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt  # the user pressed Ctrl-C mid-benchmark
        arm = recipe["run"]["name"].split("-")[1]
        self.calls.append((arm, seed, recipe))
        if (arm, seed) in self.broken:
            raise RuntimeError("teacher went away")
        before = 0.1 + 0.02 * seed
        return CellResult(
            updates=recipe["train"]["cycles"],
            wall_s=10.0 + seed,
            success_before=before,
            success_after=before + 0.3 + ARM_SHIFT[arm],
            final_loss=1.0 - ARM_SHIFT[arm],
            loss_curve=[2.0, 1.5, 1.0 - ARM_SHIFT[arm]],
        )


def test_every_cell_gets_the_same_budget_and_its_own_seed(tmp_path: Path) -> None:
    # Matched budget: each arm x seed runs the same number of updates; only mode/seed differ.
    fake = FakeCells()
    results, out = run_benchmark(write_config(tmp_path), run_cell=fake)
    assert len(fake.calls) == 9 and results.complete
    for arm, seed, recipe in fake.calls:
        assert recipe["train"]["cycles"] == 5 and recipe["run"]["seed"] == seed
        assert recipe["run"]["mode"] == ("sft" if arm == "sft" else "opd")
        assert recipe["student"] == BASE_RECIPE["student"]
        assert recipe["run"]["output_dir"] == str(out / "runs")
    pipelining = {arm: r["train"].get("pipelining") for arm, _, r in fake.calls}
    assert pipelining == {"sft": None, "opd": True, "opd_serial": False}
    assert all(c.budget_matched for c in results.cells)


def test_wall_time_budget_sets_max_wall_s(tmp_path: Path) -> None:
    fake = FakeCells()
    config = write_config(tmp_path, budget={"kind": "wall_time", "wall_s": 30, "max_updates": 999})
    results, _ = run_benchmark(config, run_cell=fake)
    assert {r["train"]["max_wall_s"] for _, _, r in fake.calls} == {30}
    assert {r["train"]["cycles"] for _, _, r in fake.calls} == {999}
    assert all(c.budget_matched is None for c in results.cells)


def test_an_arms_own_cycles_cap_it_under_a_wall_time_budget(tmp_path: Path) -> None:
    # A SeqKD arm's teacher plays the set of its planned cycles up front: its own
    # train.cycles keeps that set to what it can reach (at most max_updates).
    from miniverl.student.benchmark.config import cell_recipe, load_benchmark_config

    path = write_config(tmp_path, budget={"kind": "wall_time", "wall_s": 30, "max_updates": 999})
    data = yaml.safe_load(path.read_text())
    data["arms"][1]["overrides"] = {"train": {"cycles": 40}}
    data["arms"][2]["overrides"] = {"train": {"cycles": 5000}}
    path.write_text(yaml.safe_dump(data))
    config, base = load_benchmark_config(path)
    cycles = {arm.name: cell_recipe(config, base, arm, 1, tmp_path)["train"]["cycles"]
              for arm in config.arms}
    assert list(cycles.values()) == [999, 40, 999]
    data["budget"] = {"kind": "updates", "updates": 7}  # an update budget: the same for all
    path.write_text(yaml.safe_dump(data))
    config, base = load_benchmark_config(path)
    assert {cell_recipe(config, base, arm, 1, tmp_path)["train"]["cycles"]
            for arm in config.arms} == {7}


def test_results_are_schema_valid_with_paired_intervals(tmp_path: Path) -> None:
    results, out = run_benchmark(write_config(tmp_path), run_cell=FakeCells())
    on_disk = BenchmarkResults.model_validate_json((out / "results.json").read_text())
    assert on_disk.complete and len(on_disk.cells) == 9
    by_arm = {s.arm: s for s in on_disk.summary}
    # The same seed-dependent offset in every arm cancels in the paired difference.
    assert by_arm["opd"].diff_vs_baseline == pytest.approx(0.2)
    assert by_arm["opd"].diff_low == pytest.approx(0.2) and by_arm[
        "opd"
    ].diff_high == pytest.approx(0.2)
    assert by_arm["opd"].n_pairs == 3 and by_arm["sft"].diff_vs_baseline is None
    assert by_arm["sft"].mean_low < by_arm["sft"].mean < by_arm["sft"].mean_high
    summary = (out / "summary.md").read_text()
    assert "| opd | 3 | 0 |" in summary
    html = (out / "report.html").read_text()
    assert html.count("<svg") >= 4 and "http" not in html and "<script" not in html


def test_bootstrap_is_seeded_and_covers_the_mean() -> None:
    values = [0.1, 0.4, 0.35, 0.2, 0.5]
    first = bootstrap_mean_interval(values, 1000, 0.9, seed=3)
    assert first == bootstrap_mean_interval(values, 1000, 0.9, seed=3)
    mean, lo, hi = first
    assert lo <= mean <= hi and lo >= min(values) and hi <= max(values)
    assert bootstrap_mean_interval([0.7], 1000, 0.9, seed=0) == (0.7, 0.7, 0.7)


def test_resume_runs_only_the_missing_cells(tmp_path: Path) -> None:
    # An interrupted benchmark keeps what finished; --resume runs the rest, nothing twice.
    config = write_config(tmp_path)
    first = FakeCells(fail_after=4)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(config, run_cell=first)
    fresh = tmp_path / "runs" / "benchmarks" / "toy"  # the default: a folder of its own
    saved = BenchmarkResults.model_validate_json((fresh / "results.json").read_text())
    assert len(saved.cells) == 4 and not saved.complete
    with pytest.raises(ConfigError, match="--resume"):
        run_benchmark(config, run_cell=FakeCells())
    second = FakeCells()
    results, _ = run_benchmark(config, resume=True, run_cell=second)
    assert len(second.calls) == 5
    done_first = {(a, s) for a, s, _ in first.calls}
    assert done_first.isdisjoint({(a, s) for a, s, _ in second.calls})
    assert results.complete and len(results.cells) == 9


def test_failed_cells_are_recorded_and_rerun_on_resume(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    results, _ = run_benchmark(config, run_cell=FakeCells(broken={("opd", 1)}))
    assert not results.complete
    failed = [c for c in results.cells if c.result.status == "failed"]
    assert [(c.arm, c.seed) for c in failed] == [("opd", 1)]
    assert "teacher went away" in failed[0].result.error
    assert {s.arm: s.n_failed for s in results.summary}["opd"] == 1
    again = FakeCells()
    results, _ = run_benchmark(config, resume=True, run_cell=again)
    assert [(a, s) for a, s, _ in again.calls] == [("opd", 1)] and results.complete


def test_the_committed_results_are_written_only_when_asked(tmp_path: Path) -> None:
    # A plain run never writes the config's output_dir (the committed results); a file git
    # tracks there is rewritten only with update_committed.
    import subprocess

    config = write_config(tmp_path)
    committed = tmp_path / "out"
    results, out = run_benchmark(config, run_cell=FakeCells())
    assert out == Path("runs/benchmarks/toy") and not committed.exists()
    assert all(not Path(c.result.run_dir or "x").is_absolute() for c in results.cells)
    with pytest.raises(ConfigError, match="committed results folder"):
        run_benchmark(config, run_cell=FakeCells(), output_dir=committed)
    _, out = run_benchmark(config, run_cell=FakeCells(), update_committed=True)
    assert out == committed and (committed / "results.json").is_file()
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "out/results.json"], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "results.json").write_text((committed / "results.json").read_text())
    subprocess.run(["git", "-C", str(tmp_path), "add", "elsewhere/results.json"], check=True)
    with pytest.raises(ConfigError, match="committed result; pass --update-committed"):
        run_benchmark(config, run_cell=FakeCells(), output_dir=elsewhere, resume=True)
    with pytest.raises(ConfigError, match="both say where to write"):
        run_benchmark(config, run_cell=FakeCells(), output_dir=elsewhere, update_committed=True)


def test_a_cell_run_dir_is_stored_relative_to_the_results(tmp_path: Path) -> None:
    def cell(recipe: dict, seed: int) -> CellResult:
        run_dir = Path(recipe["run"]["output_dir"]).resolve() / f"cell-{seed}"
        return CellResult(updates=5, success_after=0.5, run_dir=str(run_dir))

    results, out = run_benchmark(write_config(tmp_path), run_cell=cell)
    assert {c.result.run_dir for c in results.cells} == {"runs/cell-0", "runs/cell-1", "runs/cell-2"}
    assert '"run_dir": "/' not in (out / "results.json").read_text()


def test_resume_refuses_a_changed_config(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(config, run_cell=FakeCells(fail_after=2))
    write_config(tmp_path, budget={"kind": "updates", "updates": 7})
    with pytest.raises(ConfigError, match="different config"):
        run_benchmark(config, resume=True, run_cell=FakeCells())


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"baseline": "dpo"}, "baseline 'dpo' is not an arm"),
        ({"budget": {"kind": "updates"}}, "budget.updates is unset"),
        ({"seeds": [1, 1]}, "seeds must be unique"),
        ({"arms": [{"name": "a", "mode": "opd", "extra": 1}]}, "extra"),
        ({"recipe": "missing.yaml"}, "cannot be read"),
    ],
)
def test_bad_configs_name_the_problem(tmp_path: Path, changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_benchmark_config(write_config(tmp_path, **changes))


def test_toy_benchmark_config_is_valid() -> None:
    path = Path(__file__).parents[3] / "benchmarks" / "toy_benchmark.yaml"
    config, base = load_benchmark_config(path)
    assert config.baseline in {a.name for a in config.arms}
    assert base["run"]["mode"] in {"sft", "opd", "offline_kd", "replay"}


def test_toy_benchmark_starts_warm_from_a_prepared_teacher() -> None:
    # A cold toy scored 0.000 in every arm: the shipped benchmark names a warm student
    # and a competent (prepared, qualified) teacher, both of the base recipe's model.
    from miniverl.common.recipe import Recipe, load_recipe

    path = Path(__file__).parents[3] / "benchmarks" / "toy_benchmark.yaml"
    config, base = load_benchmark_config(path)
    assert config.student_prepare is not None
    warm = load_recipe(path.parent / config.student_prepare)
    recipe = Recipe.model_validate(base)
    assert warm.run.mode == "sft" and warm.student.model == recipe.student.model
    assert recipe.teacher.prepare and recipe.teacher.min_success >= 0.9
    teacher_prep = load_recipe(path.parent / recipe.teacher.prepare)
    assert teacher_prep.student.model == recipe.teacher.model
    assert warm.environment == recipe.environment == teacher_prep.environment


def test_docs_quote_the_shipped_toy_benchmarks_measured_table() -> None:
    # docs/benchmarks.md states the measured result; it must be the one on disk, made by
    # the config as shipped (same digest), with a difference between the arms.
    import re

    from miniverl.student.benchmark.config import digest

    root = Path(__file__).parents[3]
    results = BenchmarkResults.model_validate_json(
        (root / "benchmarks/results/toy/results.json").read_text())
    config, base = load_benchmark_config(root / "benchmarks/toy_benchmark.yaml")
    assert results.complete and results.config_digest == digest(
        {"config": config.dump(), "recipe": base})
    doc = (root / "docs/benchmarks.md").read_text()
    for arm in results.summary:
        # The table as summary.md prints it (benchmarks/benchmark_report.py): arm, ok,
        # failed, mean, ..., mean wall s, mean updates.
        row = re.search(rf"^\| {arm.arm} \| \d+ \| \d+ \| ([0-9.]+) \|.*\| ([0-9.]+) \| [0-9.]+ \|$",
                        doc, re.M)
        assert row, arm.arm
        assert (row[1], row[2]) == (f"{arm.mean:.3f}", f"{arm.mean_wall_s:.1f}"), arm.arm
    means = [arm.mean for arm in results.summary]
    assert max(means) - min(means) >= 0.1  # a difference worth reading, not 0.000 everywhere


def test_prepared_models_are_made_once_and_named_in_each_cell(tmp_path: Path, monkeypatch) -> None:
    import miniverl.student.benchmark.run as run_module

    made: list[tuple[str, str]] = []

    def fake_prepare(prep, model, *, what, model_field):
        made.append((Path(prep).name, what))
        return type("Prepared", (), {"model_dir": tmp_path / f"ready-{Path(prep).stem}"})()

    monkeypatch.setattr(run_module, "prepare_model", fake_prepare)
    (tmp_path / "recipes").mkdir()
    cells = TrainerCells(None, tmp_path, recipe_dir=tmp_path / "recipes",
                         student_prepare=tmp_path / "warm.yaml")
    recipe = {"run": {"name": "x", "mode": "opd"},
              "student": {"model": {"toy": {"hidden": 32}}},
              "teacher": {"model": {"toy": {"hidden": 32}}, "prepare": "../teach.yaml",
                          "min_success": 0.9}}
    first = cells.with_prepared_models(recipe)
    second = cells.with_prepared_models(recipe)
    assert first == second and made == [("teach.yaml", "teacher.prepare"),
                                         ("warm.yaml", "student_prepare")]
    assert first["teacher"] == {"model": {"path": str(tmp_path / "ready-teach")},
                                "min_success": 0.9}
    assert first["student"]["model"] == {"path": str(tmp_path / "ready-warm")}
    assert recipe["teacher"]["prepare"] == "../teach.yaml"  # the cell's own dict is kept
    # An arm that needs no teacher does not wait for one to be prepared.
    made.clear()
    sft = TrainerCells(None, tmp_path, recipe_dir=tmp_path / "recipes",
                       student_prepare=tmp_path / "warm.yaml").with_prepared_models(
        {**recipe, "run": {"name": "x", "mode": "sft"}})
    assert made == [("warm.yaml", "student_prepare")] and "prepare" in sft["teacher"]
    # A SeqKD arm (sft on the teacher's own episodes) plays with the prepared teacher.
    made.clear()
    seqkd = TrainerCells(None, tmp_path, recipe_dir=tmp_path / "recipes").with_prepared_models(
        {**recipe, "run": {"name": "x", "mode": "sft"}, "train": {"fixed_set": "teacher"}})
    assert made == [("teach.yaml", "teacher.prepare")]
    assert seqkd["teacher"]["model"] == {"path": str(tmp_path / "ready-teach")}
    # Each teacher of teachers: is prepared by its own recipe and named in the cell.
    made.clear()
    routed = {k: v for k, v in recipe.items() if k != "teacher"}
    routed["teachers"] = {"calc": {"model": {"toy": {"hidden": 32}}, "prepare": "../teach.yaml"},
                          "nav": {"model": {"path": "ready-nav"}}}
    both = TrainerCells(None, tmp_path, recipe_dir=tmp_path / "recipes").with_prepared_models(
        routed)
    assert made == [("teach.yaml", "teachers.calc.prepare")]
    # A teacher already given by path keeps it, read from the base recipe's folder as
    # load_recipe reads a recipe file's (the teacher process reads a copy elsewhere).
    assert both["teachers"] == {"calc": {"model": {"path": str(tmp_path / "ready-teach")}},
                                "nav": {"model": {"path": str(tmp_path / "recipes/ready-nav")}}}


def _fake_prepared(monkeypatch, tmp_path: Path, evaluation: dict) -> list[str]:
    import miniverl.student.benchmark.run as run_module

    made: list[str] = []

    def fake_prepare(prep, model, *, what, model_field):
        made.append(what)
        return type("Prepared", (), {"model_dir": tmp_path / "ready-warm",
                                     "record": {"steps": 300, "eval": evaluation}})()

    monkeypatch.setattr(run_module, "prepare_model", fake_prepare)
    return made


def test_the_student_preparation_is_checked_against_its_band(tmp_path: Path, monkeypatch) -> None:
    made = _fake_prepared(monkeypatch, tmp_path, {"split": "eval", "n": 64, "success": 1.0,
                                                   "sampled": {"success": 0.43}})
    cells = TrainerCells(None, tmp_path, student_prepare=tmp_path / "warm.yaml")
    base = {"student": {"model": {"toy": {"hidden": 32}}}}
    # T=1 (the sampled eval) is what is checked, not greedy's 1.0; prepared once.
    assert cells.check_student_band(base, (0.3, 0.7)) == 0.43
    assert cells.with_prepared_models({**base, "run": {"mode": "sft"}})["student"]["model"] == {
        "path": str(tmp_path / "ready-warm")}
    assert made == ["student_prepare"]
    with pytest.raises(ConfigError, match=r"T=1 success is 0\.430 on eval \(n=64, 300 SFT steps "
                       r"of warm\.yaml\), outside student_prepare_band \[0\.5, 0\.9\]; change "
                       r"its train\.cycles"):
        cells.check_student_band(base, (0.5, 0.9))
    # Without a sampled eval the greedy success is the figure.
    _fake_prepared(monkeypatch, tmp_path, {"split": "eval", "n": 64, "success": 0.0})
    with pytest.raises(ConfigError, match=r"greedy success is 0\.000"):
        TrainerCells(None, tmp_path, student_prepare=tmp_path / "warm.yaml").check_student_band(
            base, (0.3, 0.7))


def test_a_band_outside_stops_the_benchmark_before_any_cell(tmp_path: Path, monkeypatch) -> None:
    _fake_prepared(monkeypatch, tmp_path, {"split": "eval", "n": 64, "success": 0.0,
                                           "sampled": {"success": 0.0}})
    (tmp_path / "warm.yaml").write_text("schema_version: 1\n")
    config = write_config(tmp_path, student_prepare="warm.yaml", student_prepare_band=[0.3, 0.7])
    with pytest.raises(ConfigError, match=r"T=1 success is 0\.000 .* outside student_prepare_band"):
        run_benchmark(config, output_dir=tmp_path / "fresh")
    results = tmp_path / "fresh" / "results.json"
    assert not results.exists() or not json.loads(results.read_text())["cells"]


@pytest.mark.parametrize(("band", "why"), [
    ([0.7, 0.3], "0 <= low <= high <= 1"), ([0.2, 1.5], "0 <= low <= high <= 1"),
    ([0.2, 0.5], "student_prepare is not"),
])
def test_a_bad_student_prepare_band_is_refused(tmp_path: Path, band, why) -> None:
    changes = {"student_prepare_band": band}
    if why != "student_prepare is not":
        (tmp_path / "warm.yaml").write_text("schema_version: 1\n")
        changes["student_prepare"] = "warm.yaml"
    with pytest.raises(ConfigError, match=why):
        load_benchmark_config(write_config(tmp_path, **changes))


def test_a_missing_student_prepare_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="student_prepare 'nope.yaml' does not exist"):
        load_benchmark_config(write_config(tmp_path, student_prepare="nope.yaml"))


def test_trainer_cells_train_a_real_cell(tmp_path: Path) -> None:
    # The default cell reads the trainer's TrainResult as it is (no fallbacks): a real
    # toy SFT run becomes an ok cell with its final version and updates.
    pytest.importorskip("torch")
    cells = TrainerCells(None, tmp_path)
    try:
        result = cells(toy_sft_recipe(tmp_path / "runs"), seed=0)
    finally:
        cells.close()
    assert result.status == "ok" and result.final_version == 2 and result.updates == 2
    assert result.wall_s is not None and cells.processes == {}  # sft starts no teacher
    assert Path(result.run_dir).parent == tmp_path / "runs"


# -- export-benchmark ----------------------------------------------------------------------

SECRET = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
HOME_PATH = "/home/alice/private-models/qwen-secret"


def test_export_from_run_redacts_planted_secret_and_home_path(tmp_path: Path) -> None:
    # A shared result must never carry a token or a local path, wherever they were planted.
    run = make_run(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["packages"]["hub_note"] = f"downloaded with token={SECRET}"
    manifest["packages"]["api_key"] = SECRET
    manifest["models"]["student"] = {"source": "path", "id": HOME_PATH, "revision": None}
    manifest["hardware"]["gpus"] = [{"index": 0, "name": "H200", "total_memory_bytes": 141 * 2**30}]
    (run / "manifest.json").write_text(json.dumps(manifest))
    out = export_benchmark(run, tmp_path / "share" / "result.json")
    text = out.read_text()
    assert SECRET not in text and "/home/alice" not in text and "alice" not in text
    result = HardwareResult.model_validate_json(text)
    assert result.source == "run" and result.hardware_source == "manifest"
    assert result.device.kind == "cuda" and result.device.name == "H200"
    assert result.throughput.positions_per_s == pytest.approx(225.5)
    assert result.device.memory_bytes == 141 * 2**30 and result.host.cpu_count == 2
    assert result.models["student"] == "~/private-models/qwen-secret"
    assert result.models["teacher"].startswith("toy ")
    assert result.versions["torch"] == "2.13.0" and "bitsandbytes" not in result.versions
    assert result.recipe_digest == "sha256:" + "ab" * 32 and result.steps == 12
    assert result.success_before == pytest.approx(0.05) and result.success_after == pytest.approx(
        0.45
    )


def test_export_from_benchmark_results(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    _, out = run_benchmark(config, run_cell=FakeCells())
    result = build_hardware_result(out / "results.json")
    assert result.source == "benchmark" and {a.arm for a in result.arms} == {
        "sft",
        "opd",
        "opd_serial",
    }
    assert str(tmp_path) not in result.model_dump_json()


def test_export_rejects_unknown_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither a run directory"):
        build_hardware_result(tmp_path / "nothing")


def test_schema_describes_the_exported_file() -> None:
    schema = benchmark_result_json_schema()
    assert schema["title"] == "HardwareResult"
    assert {"device", "throughput", "peak_memory_bytes", "recipe_digest"} <= set(
        schema["properties"]
    )


def test_each_distinct_teacher_gets_its_own_process_and_several_teachers_one_each(
        tmp_path: Path, monkeypatch) -> None:
    # One process per distinct teacher section, kept for every cell that names it (an
    # arm that overrides its teacher is never scored by another arm's); a recipe of
    # teachers: gets one process per teacher (--recipe-teacher NAME), passed by name.
    pytest.importorskip("torch")
    import miniverl.student.benchmark.run as run_mod
    import miniverl.student.train.trainer as trainer_mod
    from tests.toy_kit import recipe_dict

    started, trained = [], []

    class FakeProcess:
        def poll(self):
            return 0

    def fake_start(args, *, endpoint, log, timeout_s):
        started.append((args[args.index("--recipe-teacher") + 1]
                        if "--recipe-teacher" in args else None, endpoint, Path(log).name))
        return FakeProcess()

    class FakeTrainer:
        def __init__(self, recipe, *, teacher_endpoint=None, teacher_endpoints=None, **kw):
            trained.append((teacher_endpoint, teacher_endpoints))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def train(self):
            raise RuntimeError("not trained here")

    monkeypatch.setattr(run_mod, "start_teacher", fake_start)
    monkeypatch.setattr(run_mod, "stop_teacher", lambda process: None)
    monkeypatch.setattr(trainer_mod, "Trainer", FakeTrainer)
    cells = TrainerCells(None, tmp_path)
    opd = recipe_dict("opd", tmp_path / "runs")
    other = copy.deepcopy(opd)
    other["teacher"]["model"]["toy"]["seed"] = 7
    routed = copy.deepcopy(opd)
    teacher = routed.pop("teacher")
    del routed["environment"]
    nav = copy.deepcopy(teacher)
    nav["model"]["toy"]["seed"] = 11
    routed["teachers"] = {"calc": teacher, "nav": nav}
    routed["environments"] = [
        {"name": "calculator", "teacher": "calc", "train_tasks": 8, "eval_tasks": 2,
         "test_tasks": 2},
        {"name": "jsonnav", "teacher": "nav", "train_tasks": 8, "eval_tasks": 2, "test_tasks": 2}]
    for recipe in (opd, opd, other, routed):
        with pytest.raises(RuntimeError, match="not trained here"):
            cells(recipe, seed=0)
    # calc is the first recipe's very teacher: its process serves it; nav gets its own.
    assert [name for name, _, _ in started] == [None, None, "nav"]
    assert [log for _, _, log in started][0] == "teacher.stderr"  # the first keeps its names
    first, second, third = (endpoint for _, endpoint, _ in started)
    assert [t for t, _ in trained[:3]] == [first, first, second]
    assert trained[3] == (None, {"calc": first, "nav": third})
    cells.close()
    assert cells.processes == {}
