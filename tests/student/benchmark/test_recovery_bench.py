"""The recovery benchmark (benchmarks/recovery/, benchmarks/recovery_bench.py).

The preregistered config must ask the question it says it asks: five arms from one cold
student on the same budget, the frozen-state arm as the baseline, a gated teacher, at
least 128 held-out tasks with a fault; the benchmark's cells carry the fault metrics.
The whole pipeline's end-to-end check (two arms, one seed, two updates) is in
test_smoke.py, on the run its documented commands make on a fresh clone.
"""

from __future__ import annotations

import json
from pathlib import Path

from miniverl.common.recipe import Recipe, load_recipe
from miniverl.student.benchmark.config import cell_recipe, load_benchmark_config
from miniverl.student.benchmark.results import cell_result_from_run
from miniverl.student.environments import make_tasks
from tests.student.report.report_runs import make_run

ROOT = Path(__file__).parents[3]
CONFIG = ROOT / "benchmarks" / "recovery" / "config.yaml"


def test_the_preregistered_config_asks_its_question(tmp_path):
    config, base = load_benchmark_config(CONFIG)
    assert config.seeds == [1, 2, 3, 4, 5] and config.budget.kind == "updates"
    assert config.baseline == "frozen_kd" and config.metric == "recovery_after"
    cells = {a.name: Recipe.model_validate(cell_recipe(config, base, a, 1, tmp_path))
             for a in config.arms}
    assert {n: (r.run.mode, r.train.fixed_set) for n, r in cells.items()} == {
        "sft": ("sft", None), "oracle_kd": ("offline_kd", "oracle"),
        "frozen_kd": ("offline_kd", "student"), "opd": ("opd", None), "replay": ("replay", None)}
    assert cells["replay"].train.max_lag == 2 and cells["opd"].train.pipelining
    for recipe in cells.values():  # same budget, schedule, optimizer, eval for every arm
        assert recipe.train.cycles == config.budget.updates
        assert (recipe.train.lr, recipe.train.rollouts_per_cycle, recipe.environment) == (
            cells["opd"].train.lr, cells["opd"].train.rollouts_per_cycle,
            cells["opd"].environment)
    recipe = cells["opd"]
    # Each fixed set holds as many episodes as OPD samples: one pass over the train tasks.
    assert recipe.environment.train_tasks == config.budget.updates * recipe.train.rollouts_per_cycle
    env = recipe.environment
    tasks = make_tasks(env.name, "eval", env.eval_tasks, env.difficulty, env.split_seed,
                       params=env.params)
    assert sum(1 for t in tasks if t.data["fault"]) >= 128
    assert recipe.teacher.min_success and recipe.teacher.min_recovery
    cold = load_recipe(CONFIG.parent / config.student_prepare)
    teacher = load_recipe(CONFIG.parent / recipe.teacher.prepare)
    assert cold.student.model == recipe.student.model
    assert teacher.student.model == recipe.teacher.model
    # The teacher qualifies on the benchmark's environment; the cold student never saw a fault.
    sig = ("name", "params", "difficulty", "split_seed")
    assert [getattr(teacher.environment, k) for k in sig] == [getattr(env, k) for k in sig]
    assert cold.environment.params["faults"] == 0 and env.params["faults"] > 0


def test_the_second_run_changes_the_budget_and_nothing_else(tmp_path):
    # budget_256.yaml asks the first run's question at twice its budget: the same base
    # recipe, start points, seeds, metric and baseline, four of its five arms unchanged.
    first, base = load_benchmark_config(CONFIG)
    second, base2 = load_benchmark_config(CONFIG.parent / "budget_256.yaml")
    assert second.budget.updates == 2 * first.budget.updates == 256
    assert base2 == base and second.student_prepare == first.student_prepare
    assert (second.seeds, second.metric, second.baseline) == (
        first.seeds, first.metric, first.baseline)
    arms = {a.name: a for a in first.arms}
    assert [a.name for a in second.arms] == ["sft", "oracle_kd", "frozen_kd", "opd"]
    assert all(a == arms[a.name] for a in second.arms)
    assert second.output_dir != first.output_dir  # the first run's results stay as they are
    for arm in second.arms:
        recipe = Recipe.model_validate(cell_recipe(second, base2, arm, 1, tmp_path))
        assert recipe.train.cycles == 256 and recipe.environment.train_tasks == 2048


def test_a_cell_reads_the_fault_breakdown_of_its_evals(tmp_path):
    run = make_run(tmp_path / "run")
    for old in (run / "eval").iterdir():
        old.unlink()
    for version, rate in ((0, 0.1), (12, 0.6)):
        summary = {"split": "eval", "policy_version": version, "success": 0.5, "n": 4,
                   "faults": {"faulted": {"success": rate, "n": 2},
                              "fault_free": {"success": 0.9, "n": 2},
                              "recovery": {"rate": rate / 2, "n_error_episodes": 2,
                                           "n_recovered": 1}}}
        (run / "eval" / f"eval-v{version}.summary.json").write_text(json.dumps(summary))
    cell = cell_result_from_run(run)
    assert (cell.faulted_success_before, cell.faulted_success_after) == (0.1, 0.6)
    assert (cell.recovery_before, cell.recovery_after) == (0.05, 0.3)
    assert cell.fault_free_success_after == 0.9
