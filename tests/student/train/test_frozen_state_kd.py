"""offline_kd on frozen student states (``train.fixed_set: student``).

What the recovery benchmark's frozen-state arm relies on: the starting policy samples,
once and before the first update, exactly the episodes strict OPD would sample over the
run (same tasks, same episode seeds: cycle 0 is token for token OPD's cycle 0); the
teacher scores each once, for the version that sampled it; update ``c`` trains on cycle
``c``'s episodes; the sampling and scoring are recorded with their time; a resumed run
reads its set back instead of sampling one with the trained policy.
"""

from __future__ import annotations

import pytest
import torch

from miniverl.common.trajectory import read_trajectories
from miniverl.student.train.trainer import Trainer
from tests.student.train.trainer_kit import (
    LossRecorder,
    parameters,
    same_parameters,
    stop_at_step,
)
from tests.toy_kit import events, make_recipe, metrics

torch.set_num_threads(1)
CYCLES, ROLLOUTS = 3, 4


@pytest.mark.slow
def test_the_frozen_set_is_opds_schedule_sampled_once_by_the_starting_policy(tmp_path, toy):
    opts = dict(show_progress=False, write_report=False)
    with Trainer(make_recipe("opd", tmp_path / "opd", cycles=CYCLES), client=toy.fake_client(),
                 **opts) as trainer:
        opd = trainer.train()
    opd_trajs = read_trajectories(opd.run_dir / "trajectories.jsonl")

    fake = toy.fake_client()
    recipe = make_recipe("offline_kd", tmp_path / "frozen", cycles=CYCLES, fixed_set="student")
    with pytest.MonkeyPatch.context() as mp:
        trainer = Trainer(recipe, client=fake, **opts)
        recorder = LossRecorder(trainer).install(mp)
        with trainer:
            result = trainer.train()
    assert result.status == "completed" and result.final_version == CYCLES
    frozen = read_trajectories(result.run_dir / "trajectories.jsonl")
    # One SCORE per episode, all sampled by version 0, before any update.
    assert fake.counters["sent"] == len(frozen) == CYCLES * ROLLOUTS
    assert {t.policy_version for t in frozen} == {0}
    assert all(t.source == "rollout" for t in frozen)
    for c, call in enumerate(recorder.calls):
        opd_cycle = [t for t in opd_trajs if t.policy_version == c]
        got = [s[0] for s in call["scored"]]
        # Update c trains on OPD's cycle-c tasks and seeds, with targets for version 0.
        assert [(t.task_id, t.seed) for t in got] == [(t.task_id, t.seed) for t in opd_cycle]
        assert {s[3] for s in call["scored"]} == {0} and call["version"] == c
    # Both runs sample cycle 0 with version 0 and the same seeds: the same episodes.
    assert [t.tokens for t in frozen[:ROLLOUTS]] == [
        t.tokens for t in opd_trajs if t.policy_version == 0]
    scored = events(result.run_dir, "offline_targets_scored")
    assert len(scored) == 1 and scored[0]["source"] == "student"
    assert scored[0]["trajectories"] == CYCLES * ROLLOUTS and scored[0]["positions"] > 0
    assert scored[0]["time_sample_s"] > 0 and scored[0]["time_teacher_wait_s"] >= 0
    assert all(r["on_policy"] is False for r in metrics(result.run_dir))


@pytest.mark.slow
def test_a_resumed_frozen_state_run_reads_its_set_back(tmp_path, toy, monkeypatch):
    opts = dict(show_progress=False, write_report=False)
    recipe = make_recipe("offline_kd", tmp_path, cycles=CYCLES, fixed_set="student")
    with Trainer(recipe, client=toy.fake_client(), run_id="whole", **opts) as trainer:
        trainer.train()
        expected = parameters(trainer)

    first = Trainer(recipe, client=toy.fake_client(), run_id="split", **opts)
    stop_at_step(monkeypatch, first, 1)
    with first:
        assert first.train().final_version == 1
    fake = toy.fake_client()
    with Trainer(recipe, client=fake, run_id="split", resume=True, **opts) as second:
        resumed = second.train()
        got = parameters(second)
    assert (resumed.status, resumed.final_version) == ("completed", CYCLES)
    # Nothing sampled or scored again: the set and its targets came from the run.
    assert fake.counters["sent"] == 0
    assert len(read_trajectories(resumed.run_dir / "trajectories.jsonl")) == CYCLES * ROLLOUTS
    assert same_parameters(expected, got)
