"""A toy run on a mixture of two environments (calculator and jsonnav, mode rl): both
environments' episodes are trained on and tagged in trajectories.jsonl, and every eval
event, eval summary file, the report's summary and ``miniverl status`` show each
environment's success beside the mixture's; the manifest records each environment's
split seed. A resumed mixture run draws and trains exactly what the uninterrupted one
did, and strict OPD plays a mixture too."""

from __future__ import annotations

import json

import pytest

from miniverl.common.recipe import Recipe
from miniverl.common.rundir import RunDir
from miniverl.common.trajectory import read_trajectories
from tests.student.train.trainer_kit import parameters, same_parameters, stop_at_step
from tests.toy_kit import events, recipe_dict

MIX = [{"name": "calculator", "weight": 1, "difficulty": "easy", "train_tasks": 8,
        "eval_tasks": 2, "test_tasks": 2},
       {"name": "jsonnav", "weight": 1, "difficulty": "easy", "train_tasks": 8,
        "eval_tasks": 2, "test_tasks": 2}]


def _mixture(mode, tmp_path, **train):
    data = recipe_dict(mode, tmp_path, teacher=None if mode == "rl" else recipe_dict(
        "opd", tmp_path)["teacher"]["model"]["toy"],
        sections={"rollout": {"group_size": 2}} if mode == "rl" else None, **train)
    del data["environment"]
    data["environments"] = MIX
    return Recipe.model_validate(data)


@pytest.mark.slow
def test_a_mixture_run_trains_and_evaluates_each_environment(tmp_path):
    from miniverl.cli.run_status import finished_lines, finished_summary
    from miniverl.student.report.load import load_run
    from miniverl.student.report.summary import summary_rows
    from miniverl.student.train.trainer import Trainer

    recipe = _mixture("rl", tmp_path, cycles=2, eval_every=2)
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


@pytest.mark.slow  # three toy runs with checkpoints
def test_a_resumed_mixture_run_trains_exactly_what_the_uninterrupted_one_did(tmp_path,
                                                                            monkeypatch):
    from miniverl.student.train.trainer import Trainer

    recipe = _mixture("rl", tmp_path, cycles=3)
    opts = dict(show_progress=False, write_report=False)
    with Trainer(recipe, run_id="whole", **opts) as trainer:
        whole = trainer.train()
        expected = parameters(trainer)
    first = Trainer(recipe, run_id="split", **opts)
    stop_at_step(monkeypatch, first, 1)
    with first:
        assert first.train().final_version == 1
    with Trainer(recipe, run_id="split", resume=True, **opts) as second:
        resumed = second.train()
        got = parameters(second)
    assert (resumed.status, resumed.final_version) == ("completed", 3)
    episodes = [[(t.environment, t.task_id, t.seed) for t in
                 read_trajectories(run.run_dir / "trajectories.jsonl")] for run in (whole, resumed)]
    assert episodes[0] == episodes[1]
    assert same_parameters(expected, got)


@pytest.mark.slow
def test_strict_opd_plays_a_mixture(tmp_path, toy):
    from miniverl.student.train.trainer import Trainer

    recipe = _mixture("opd", tmp_path, cycles=2, rollouts_per_cycle=8)
    with Trainer(recipe, client=toy.fake_client(), show_progress=False,
                 write_report=False, checkpoints=False) as trainer:
        result = trainer.train()
    assert result.status == "completed" and result.final_version == 2
    trajs = read_trajectories(result.run_dir / "trajectories.jsonl")
    assert {t.environment for t in trajs} == {"calculator", "jsonnav"}


@pytest.mark.slow
def test_sft_and_the_warm_up_train_on_each_environments_oracle_traces(tmp_path, toy,
                                                                      monkeypatch):
    # A generalist teacher is prepared by SFT on a mixture; a student warms up on one.
    from miniverl.student.train.modes import sft
    from miniverl.student.train.trainer import Trainer

    trained = []
    update = sft.sft_step

    def recording(policy, optimizer, scheduler, trajs, **kw):
        trained.extend(trajs)
        return update(policy, optimizer, scheduler, trajs, **kw)

    monkeypatch.setattr(sft, "sft_step", recording)
    data = recipe_dict("sft", tmp_path, cycles=3, rollouts_per_cycle=8)
    data.pop("teacher", None)
    del data["environment"]
    data["environments"] = MIX
    with Trainer(Recipe.model_validate(data), show_progress=False, write_report=False,
                 checkpoints=False) as trainer:
        result = trainer.train()
    trajs = list(trained)
    assert result.status == "completed" and {t.source for t in trajs} == {"oracle"}
    assert len(trajs) == 24 and set(events(result.run_dir, "eval")[-1]["by_environment"]) == {
        "calculator", "jsonnav"}
    assert {t.environment for t in trajs} == {"calculator", "jsonnav"}
    # Each trace was played in its own environment: it verifies there.
    assert all(t.verifier.success for t in trajs)
    assert all(t.id.startswith(f"{t.environment}/") for t in trajs)
    recipe = _mixture("opd", tmp_path, cycles=1, rollouts_per_cycle=8, sft_warmup_steps=2)
    trained.clear()
    with Trainer(recipe, client=toy.fake_client(), show_progress=False,
                 write_report=False, checkpoints=False) as trainer:
        result = trainer.train()
    assert result.steps == 3  # two warm-up steps, then one OPD update
    assert len(trained) == 16 and all(t.source == "oracle" for t in trained)
    assert {t.environment for t in trained} <= {"calculator", "jsonnav"}
    assert all(t.verifier.success for t in trained)
