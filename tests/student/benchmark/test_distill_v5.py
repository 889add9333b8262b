"""Version 5 of the distillation benchmark (benchmarks/distill/v5.yaml, docs/distillbench.md):
the preregistered config runs every arm it names, with the batch, prompts and caps it says.
Its smoke form (benchmarks/smoke/distill_v5.yaml) runs end to end in test_distill_bench.py,
where the documented commands already run it on a fresh clone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import distill_bench as bench  # noqa: E402


def test_version_5_runs_every_arm_it_names_with_its_batch_and_cap(tmp_path):
    # benchmarks/distill/v5.yaml (preregistered): every arm's cell recipe is valid once the
    # benchmark names the prepared models, the control's arms have the warm student as
    # their teacher, every arm draws 64 distinct prompts per update, and each arm's own
    # cycles cap it under the wall-clock guard.
    from miniverl.common.recipe import Recipe
    from miniverl.student.benchmark.config import cell_recipe, load_benchmark_config

    raw, settings = bench.load_config(ROOT / "benchmarks/distill/v5.yaml")
    assert [a["name"] for a in raw["arms"]] == [
        "seqkd", "opd_topk_fkl", "opd_topk_rkl", "opd_rkl", "gkd", "rl", "sft_own", "opd_self"]
    assert settings.budget_s == 240 and settings.charge_set == "as_used"
    assert settings.grid_extension_factor == pytest.approx(10 ** 0.5) and len(raw["seeds"]) == 5
    warm = tmp_path / "warm"
    resolved = bench.own_teacher_arms(raw, str(warm))
    assert all("teacher_from" not in a for a in resolved["arms"])
    with pytest.raises(SystemExit, match="teacher_from 'cold'"):
        bench.own_teacher_arms({**raw, "arms": [{**raw["arms"][6], "teacher_from": "cold"}]}, "x")
    config_dir = ROOT / "benchmarks/distill"
    # The student's preparation path a run resolves (git-ignored): any sft recipe here.
    prep = bench.student_prepare_path(raw, config_dir)
    made = not prep.is_file()
    if made:
        prep.parent.mkdir(parents=True, exist_ok=True)
        prep.write_text((config_dir / "teacher.yaml").read_text())
    try:
        chosen = {a["name"]: 1e-4 for a in raw["arms"]}
        path = bench.write_phase_config(resolved, settings, "main", config_dir,
                                        tmp_path / "main", chosen)
        config, base = load_benchmark_config(path)
        grid = bench.write_phase_config(resolved, settings, "grid", config_dir, tmp_path / "grid")
        assert len(load_benchmark_config(grid)[0].arms) == 8 * 4
    finally:
        if made:
            prep.unlink()
    recipes = {}
    for arm in config.arms:
        recipe = cell_recipe(config, base, arm, 1, tmp_path / "main")
        teacher = recipe.get("teacher")
        if teacher and teacher.get("prepare"):  # the benchmark names the prepared teacher
            teacher.pop("prepare")
            teacher["model"] = {"path": str(tmp_path / "teacher")}
        recipe["student"]["model"] = {"path": str(warm)}
        recipes[arm.name] = Recipe.model_validate(recipe)
    for name in ("sft_own", "opd_self"):
        assert recipes[name].teacher.model.path == str(warm)
        assert recipes[name].teacher.min_success is None
    assert recipes["seqkd"].teacher.model.path == str(tmp_path / "teacher")
    prompts = {}
    for name, r in recipes.items():
        n, group = r.train.rollouts_per_cycle, r.rollout.group_size or 1
        fresh = n if r.train.fixed_set is None else round(n * (r.train.on_policy_fraction or 0))
        prompts[name] = fresh // group + (n - fresh)
        assert r.train.max_wall_s == 1200 and r.train.max_grad_norm == 1.0
    assert set(prompts.values()) == {64}, prompts
    caps = {name: r.train.cycles for name, r in recipes.items()}
    assert caps == {"seqkd": 40, "opd_topk_fkl": 85, "opd_topk_rkl": 85, "opd_rkl": 85,
                    "gkd": 52, "rl": 26, "sft_own": 100, "opd_self": 90}
    assert recipes["opd_topk_rkl"].loss.divergence == "reverse_kl"
    assert recipes["opd_topk_rkl"].loss.estimator == "full"
    assert recipes["opd_rkl"].loss.estimator == "sampled_token"
    assert recipes["gkd"].loss.divergence == "jsd" and recipes["rl"].teacher is None


def test_version_n_names_its_committed_config_or_says_which_exist(tmp_path):
    with pytest.raises(SystemExit) as info:
        bench.main(["--version", "9", "--output-dir", str(tmp_path)])
    (line,) = str(info.value).splitlines()
    assert "benchmarks/distill/v9.yaml" in line and "does not exist" in line
    with pytest.raises(SystemExit) as info:  # v5 is found: --reread-record finds no record
        bench.main(["--version", "5", "--output-dir", str(tmp_path), "--reread-record"])
    assert "distill_bench_v5.json" in str(info.value) and "has none" in str(info.value)


def _start(tmp_path: Path) -> tuple[dict, Path]:
    """A config in ``tmp_path`` whose distill.start commits two model folders."""
    from miniverl.common.qualification import model_dir_digest

    raw, _ = bench.load_config(ROOT / "benchmarks/distill/v5.yaml")
    start = {}
    for name, data in (("warm", b"w" * 64), ("teacher", b"t" * 64)):
        folder = tmp_path / "start" / name
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(data)
        (folder / bench.PREPARED_RECORD).write_text(json.dumps({"steps": 7, "name": name}))
        start[name] = {"path": f"start/{name}", "digest": model_dir_digest(folder)}
    text = (ROOT / "benchmarks/distill/v5.yaml").read_text()
    config = yaml.safe_load(text)
    config["recipe"] = str(ROOT / "benchmarks/distill" / config["recipe"])
    config["distill"]["start"] = start
    path = tmp_path / "v5.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config, path


def test_a_committed_start_is_read_as_committed_or_refused_in_one_line(tmp_path):
    # Version 5's start travels as weights: the records come from the committed folders
    # (no preparation), and a folder changed since its commit, or missing, is one line.
    _, path = _start(tmp_path)
    _, settings = bench.load_config(path)
    warm, teacher = bench.committed_start(settings, tmp_path)
    assert warm == {"steps": 7, "name": "warm", "model_dir": str(tmp_path / "start/warm")}
    assert teacher["model_dir"] == str(tmp_path / "start/teacher")
    (tmp_path / "start/teacher/model.safetensors").write_bytes(b"x" * 64)
    with pytest.raises(SystemExit) as exc:
        bench.committed_start(settings, tmp_path)
    (line,) = str(exc.value).splitlines()
    assert "distill.start.teacher.path start/teacher has digest sha256:" in line
    assert settings.start["teacher"].digest in line and "git checkout" in line
    (tmp_path / "start/warm/model.safetensors").unlink()
    with pytest.raises(SystemExit, match="start.warm.path start/warm .* holds no .safetensors"):
        bench.committed_start(settings, tmp_path)
    bad = yaml.safe_load(path.read_text())
    bad["distill"]["start"].pop("teacher")
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(SystemExit, match="start names \\['warm'\\]; give exactly"):
        bench.load_config(path)


def test_with_a_committed_start_every_cell_names_its_folders_and_none_prepares(tmp_path):
    # The derived configs name the committed folders relative to the base recipe's folder
    # (one digest on every clone), hold no student_prepare, keep rl teacherless and give
    # the control's arms the warm student; the cells resolve the paths from that folder.
    from miniverl.common.recipe import Recipe
    from miniverl.student.benchmark.config import cell_recipe, load_benchmark_config
    from miniverl.student.benchmark.run import TrainerCells

    raw, path = _start(tmp_path)
    raw, settings = bench.load_config(path)
    warm = bench.start_ref(raw, settings, tmp_path, "warm")
    assert not Path(warm).is_absolute()
    assert (ROOT / "benchmarks/distill" / warm).resolve() == (tmp_path / "start/warm").resolve()
    resolved = bench.own_teacher_arms(bench.start_arms(raw, settings, tmp_path), warm)
    chosen = {a["name"]: 1e-4 for a in raw["arms"]}
    derived = bench.write_phase_config(resolved, settings, "main", tmp_path, tmp_path / "main",
                                       chosen)
    assert "student_prepare" not in yaml.safe_load(derived.read_text())
    config, base = load_benchmark_config(derived)
    cells = TrainerCells(None, tmp_path, recipe_dir=ROOT / "benchmarks/distill")
    recipes = {arm.name: Recipe.model_validate(cells.with_prepared_models(
        cell_recipe(config, base, arm, 1, tmp_path / "main"))) for arm in config.arms}
    folder = {n: str((tmp_path / "start" / n).resolve()) for n in ("warm", "teacher")}
    for name, recipe in recipes.items():
        assert recipe.student.model.path == folder["warm"], name
        if name == "rl":
            assert recipe.teacher is None
        else:
            own = name in ("sft_own", "opd_self")
            assert recipe.teacher.model.path == folder["warm" if own else "teacher"], name
            assert recipe.teacher.prepare is None


def test_the_committed_start_is_the_one_preregistered_and_passes_its_gates():
    # benchmarks/distill/start_v5/ (the amendment before any cell): each folder is the
    # digest v5.yaml committed, and its preparation record passes the warm band, the
    # plateau gate and the margin gate as the pilot measured them (pilot_v5.json, N=64).
    raw, settings = bench.load_config(ROOT / "benchmarks/distill/v5.yaml")
    warm, teacher = bench.committed_start(settings, ROOT / "benchmarks/distill")
    assert bench.check_warm_start(warm, settings.warm_start, raw["student_prepare"]) == 0.578125
    gates = bench.check_gates(warm, teacher, settings, raw["student_prepare"])
    assert gates == {"plateau": 0.578125, "margin": 0.3671875}
    pilot = json.loads((ROOT / "benchmarks/results/distill_pilot_v5.json").read_text())
    (n64,) = [r for r in pilot["runs"] if r["n"] == 64]
    assert [e["t1"] for e in warm["evals"]] == [e["t1"] for e in n64["evals"]]
    assert raw["student_prepare"] == "student_v5.yaml"
