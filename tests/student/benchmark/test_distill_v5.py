"""Version 5 of the distillation benchmark (benchmarks/distill/v5.yaml, docs/distillbench.md):
the preregistered config runs every arm it names, with the batch, prompts and caps it says.
Its smoke form (benchmarks/smoke/distill_v5.yaml) runs end to end in test_distill_bench.py,
where the documented commands already run it on a fresh clone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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
