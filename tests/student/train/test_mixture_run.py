"""A toy run on a mixture of two environments (calculator and jsonnav, mode rl): both
environments' episodes are trained on and tagged in trajectories.jsonl, and every eval
event, eval summary file, the report's summary and ``miniverl status`` show each
environment's success beside the mixture's; the manifest records each environment's
split seed."""

from __future__ import annotations

import json

import pytest

from miniverl.common.recipe import Recipe
from miniverl.common.rundir import RunDir
from miniverl.common.trajectory import read_trajectories
from tests.toy_kit import events, recipe_dict

MIX = [{"name": "calculator", "weight": 1, "difficulty": "easy", "train_tasks": 8,
        "eval_tasks": 2, "test_tasks": 2},
       {"name": "jsonnav", "weight": 1, "difficulty": "easy", "train_tasks": 8,
        "eval_tasks": 2, "test_tasks": 2}]


@pytest.mark.slow
def test_a_mixture_run_trains_and_evaluates_each_environment(tmp_path):
    from miniverl.cli.run_status import finished_lines, finished_summary
    from miniverl.student.report.load import load_run
    from miniverl.student.report.summary import summary_rows
    from miniverl.student.train.trainer import Trainer

    data = recipe_dict("rl", tmp_path, teacher=None, cycles=2, eval_every=2,
                       sections={"rollout": {"group_size": 2}})
    del data["environment"]
    data["environments"] = MIX
    recipe = Recipe.model_validate(data)
    with Trainer(recipe, show_progress=False, write_report=False) as trainer:
        result = trainer.train()
    assert result.status == "completed" and result.final_version == 2
    trajs = read_trajectories(result.run_dir / "trajectories.jsonl")
    # Seed 0 draws both environments within the two cycles (a pure function of the seed).
    assert {t.environment for t in trajs} == {"calculator", "jsonnav"}
    assert all(t.id.startswith(f"{t.environment}/{t.environment}-train-") for t in trajs)
    # rollout.group_size 2: each drawn task is played twice in a row.
    assert all(a.task_id == b.task_id for a, b in zip(trajs[::2], trajs[1::2], strict=True))
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    assert manifest["seeds"]["split"] == {"calculator": 0, "jsonnav": 0}
    evals = events(result.run_dir, "eval")
    assert evals, "the run made no eval"
    for event in evals:
        envs = event["by_environment"]
        assert list(envs) == ["calculator", "jsonnav"]
        assert [e["n"] for e in envs.values()] == [2, 2] and event["n"] == 4
        assert event["success"] == sum(e["success"] * e["n"] for e in envs.values()) / 4
    last = evals[-1]
    summary_file = result.run_dir / "eval" / f"eval-v{last['version']}.summary.json"
    assert json.loads(summary_file.read_text())["by_environment"] == last["by_environment"]
    rows = dict(summary_rows(load_run(result.run_dir)))
    assert rows["success by environment"].startswith("calculator ")
    assert "jsonnav " in rows["success by environment"]
    lines = finished_lines(finished_summary(RunDir.open(result.run_dir)))
    assert any(line.strip().startswith("jsonnav ") and "weight 1" in line for line in lines)
