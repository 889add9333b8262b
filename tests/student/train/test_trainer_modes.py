"""Every trainer mode end to end on toy models against an in-process fake teacher.

Each test pins what a user relies on when they pick a mode: sft never asks a teacher;
offline_kd asks the teacher once per fixed trajectory however many cycles run, and
says it is off-policy; strict opd tags every SCORE with the current version and
takes exactly one optimizer step per cycle; replay never trains on a target more
than ``max_lag`` versions old; ``sft_warmup_steps`` run before the first
distillation cycle.
"""

from __future__ import annotations

import json

import pytest
import torch

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import read_trajectories
from miniverl.student.train import loop
from miniverl.student.train.trainer import Trainer
from tests.student.train.trainer_kit import (
    LossRecorder,
    parameters,
    same_parameters,
    stop_at_step,
)
from tests.toy_kit import events, make_recipe, metrics

torch.set_num_threads(1)

ROLLOUTS = 4


def train(recipe, client=None, **kw):
    kw.setdefault("show_progress", False)
    kw.setdefault("write_report", False)
    with Trainer(recipe, client=client, **kw) as trainer:
        result = trainer.train()
    return trainer, result


def manifest(run_dir):
    return json.loads((run_dir / "manifest.json").read_text())


def test_sft_trains_on_oracle_traces_without_a_teacher(tmp_path):
    trainer, result = train(make_recipe("sft", tmp_path, cycles=3))
    assert result.status == "completed"
    assert (result.final_version, result.steps) == (3, 3)
    rows = metrics(result.run_dir)
    assert [r["version"] for r in rows] == [1, 2, 3]
    assert all(r["mode"] == "sft" and r["on_policy"] is False and r["teacher"] is None
               for r in rows)
    # Cross-entropy on assistant tokens only: every row saw positions and a finite loss.
    assert all(r["positions"] > 0 and r["loss"] == r["loss"] for r in rows)
    assert result.eval is not None and result.eval_before is not None
    assert manifest(result.run_dir)["on_policy"] is False
    assert (result.run_dir / "checkpoints").is_dir() and any(
        (result.run_dir / "checkpoints").iterdir())
    assert json.loads((result.run_dir / "status.json").read_text())["status"] == "completed"


def test_sft_epochs_sets_the_number_of_cycles(tmp_path):
    # 8 train tasks, 4 per cycle, 2 epochs -> 4 cycles whatever train.cycles says.
    _, result = train(make_recipe("sft", tmp_path, cycles=1, sft_epochs=2))
    assert result.final_version == 4


@pytest.mark.slow
def test_offline_kd_scores_each_oracle_trajectory_once(tmp_path, toy):
    fake = toy.fake_client()
    recorder = None
    recipe = make_recipe("offline_kd", tmp_path, cycles=4)
    with pytest.MonkeyPatch.context() as mp:
        trainer = Trainer(recipe, client=fake, show_progress=False, write_report=False)
        recorder = LossRecorder(trainer).install(mp)
        with trainer:
            result = trainer.train()
    n_fixed = recipe.environment.train_tasks
    # Four cycles, one SCORE per fixed trajectory: the targets are reused, not re-asked.
    assert fake.counters["sent"] == n_fixed
    assert result.final_version == 4 and len(recorder.calls) == 4
    # Versions advance while the targets stay those scored once, tagged version 0.
    assert {s[3] for call in recorder.calls for s in call["scored"]} == {0}
    assert [c["version"] for c in recorder.calls] == [0, 1, 2, 3]
    rows = metrics(result.run_dir)
    assert all(r["mode"] == "offline_kd" and r["on_policy"] is False for r in rows)
    assert manifest(result.run_dir)["on_policy"] is False
    scored = events(result.run_dir, "offline_targets_scored")
    assert len(scored) == 1 and scored[0]["trajectories"] == n_fixed
    # The fixed set is recorded with the run.
    assert len(read_trajectories(result.run_dir / "trajectories.jsonl")) == n_fixed


@pytest.mark.slow
def test_offline_kd_from_a_previous_runs_trajectories(tmp_path, toy):
    _, first = train(make_recipe("opd", tmp_path / "first", cycles=2), toy.fake_client())
    source = first.run_dir / "trajectories.jsonl"
    previous = read_trajectories(source)
    assert len(previous) == 2 * ROLLOUTS

    fake = toy.fake_client()
    recipe = make_recipe("offline_kd", tmp_path / "second", cycles=3,
                         trajectories=str(source))
    with pytest.MonkeyPatch.context() as mp:
        trainer = Trainer(recipe, client=fake, show_progress=False, write_report=False)
        recorder = LossRecorder(trainer).install(mp)
        with trainer:
            result = trainer.train()
    assert result.status == "completed" and result.final_version == 3
    assert fake.counters["sent"] == len(previous)
    trained_ids = {s[0].id for call in recorder.calls for s in call["scored"]}
    assert trained_ids <= {t.id for t in previous}
    # The targets that reached the loss are the teacher's for exactly those tokens.
    traj, positions, arrays, _, _ = recorder.calls[-1]["scored"][0]
    ref = toy.reference(traj, positions, k=recipe.loss.top_k)
    for name in ("ids", "logprobs", "tail_logmass", "target_logprobs"):
        assert (arrays[name] == ref[name]).all(), name
    assert all(r["on_policy"] is False for r in metrics(result.run_dir))


@pytest.mark.slow
def test_strict_opd_one_step_per_cycle_on_fresh_rollouts(tmp_path, toy):
    fake = toy.fake_client()
    cycles = 3
    recipe = make_recipe("opd", tmp_path, cycles=cycles)
    with pytest.MonkeyPatch.context() as mp:
        trainer = Trainer(recipe, client=fake, show_progress=False, write_report=False)
        recorder = LossRecorder(trainer).install(mp)
        with trainer:
            result = trainer.train()
    # Every SCORE was tagged with the version that sampled it, cycle by cycle.
    assert fake.scored_versions == [v for v in range(cycles) for _ in range(ROLLOUTS)]
    # Exactly one optimizer step per cycle; the version is the number of steps.
    assert [c["version"] for c in recorder.calls] == list(range(cycles))
    assert [c["cycle"] for c in recorder.calls] == list(range(cycles))
    assert result.final_version == result.steps == cycles
    for call in recorder.calls:
        # Fresh rollouts of the current version, scored for it, nothing else.
        assert len(call["scored"]) == ROLLOUTS
        for traj, positions, arrays, version, _ in call["scored"]:
            assert traj.policy_version == version == call["version"]
            ref = toy.reference(traj, positions, k=recipe.loss.top_k)
            assert (arrays["logprobs"] == ref["logprobs"]).all()
    rows = metrics(result.run_dir)
    assert [(r["step"], r["version"]) for r in rows] == [(v, v) for v in range(1, cycles + 1)]
    assert all(r["on_policy"] is True and r["stale_dropped"] == 0 for r in rows)
    assert all(r["teacher"]["name"] == "toy-teacher" for r in rows)
    assert all(r["time_rollout_s"] > 0 and r["time_update_s"] > 0 for r in rows)
    done = manifest(result.run_dir)
    assert done["on_policy"] is True and done["steps"] == {"on_policy": cycles, "off_policy": 0}
    # The teacher range is closed when the run ends: it scored versions 0..cycles-1.
    assert [(t["from_version"], t["to_version"]) for t in done["teachers"]] == [(0, cycles - 1)]
    assert done["final_version"] == cycles
    # Each cycle's rollouts are on disk, labelled with the version that sampled them.
    on_disk = read_trajectories(result.run_dir / "trajectories.jsonl")
    assert [t.policy_version for t in on_disk] == fake.scored_versions


@pytest.mark.parametrize(("max_lag", "updates"), [(1, 1), (2, 2)])
@pytest.mark.slow
def test_replay_never_trains_on_targets_older_than_max_lag(tmp_path, toy, max_lag, updates):
    fake = toy.fake_client()
    recipe = make_recipe("replay", tmp_path, cycles=4, max_lag=max_lag,
                         updates_per_batch=updates)
    with pytest.MonkeyPatch.context() as mp:
        trainer = Trainer(recipe, client=fake, show_progress=False, write_report=False)
        recorder = LossRecorder(trainer).install(mp)
        with trainer:
            result = trainer.train()
    lags = [call["version"] - s[3] for call in recorder.calls for s in call["scored"]]
    assert max(lags) <= max_lag
    assert max(lags) >= 1  # it did replay older rollouts (the test would be empty otherwise)
    assert result.final_version == 4 * updates
    rows = metrics(result.run_dir)
    assert all(r["mode"] == "replay" and r["on_policy"] is False for r in rows)
    assert manifest(result.run_dir)["on_policy"] is False


@pytest.mark.slow
def test_sft_warmup_runs_before_the_first_opd_cycle(tmp_path, toy):
    fake = toy.fake_client()
    warmup, cycles = 2, 2
    _, result = train(make_recipe("opd", tmp_path, cycles=cycles, sft_warmup_steps=warmup), fake)
    rows = metrics(result.run_dir)
    assert [r["phase"] for r in rows] == ["sft_warmup"] * warmup + ["train"] * cycles
    assert all(r["on_policy"] is False for r in rows[:warmup])
    assert all(r["on_policy"] is True for r in rows[warmup:])
    # The teacher first hears from the student after the warm-up, at its version.
    assert fake.scored_versions[0] == warmup
    assert result.final_version == warmup + cycles
    # The manifest says what the metrics say: the warm-up's steps were off-policy, so
    # the run as a whole was not on-policy although its mode is strict OPD.
    done = manifest(result.run_dir)
    assert done["steps"] == {"on_policy": cycles, "off_policy": warmup}
    assert done["on_policy"] is False and done["final_version"] == warmup + cycles
    assert [(t["from_version"], t["to_version"]) for t in done["teachers"]] == [
        (warmup, warmup + cycles - 1)]


@pytest.mark.slow
def test_warmup_cpu_threads_hold_while_the_answered_teacher_idles(tmp_path, toy, monkeypatch):
    # The teacher has answered HELLO before the first warm-up step (an in-process client
    # answers at once): every warm-up step runs on the wider thread count, every
    # distillation cycle on cpu_threads again, and the switch is recorded.
    seen = []
    real_warmup, real_cycle = loop.warmup_step, loop.OpdMode.cycle
    monkeypatch.setattr(loop, "warmup_step", lambda state, oracle: (
        seen.append(("warmup_step", torch.get_num_threads())), real_warmup(state, oracle))[1])
    monkeypatch.setattr(loop.OpdMode, "cycle", lambda self, state: (
        seen.append(("opd_cycle", torch.get_num_threads())), real_cycle(self, state))[1])
    monkeypatch.setattr(loop.os, "cpu_count", lambda: 3)
    recipe = make_recipe("opd", tmp_path, cycles=2, sft_warmup_steps=2,
                         sections={"runtime": {"warmup_cpu_threads": 8}})
    _, result = train(recipe, toy.fake_client())
    assert seen == [("warmup_step", 3)] * 2 + [("opd_cycle", 1)] * 2
    assert [(e["threads"], e["step"]) for e in events(result.run_dir, "warmup_threads")] == [
        (3, 0)]
    assert torch.get_num_threads() == 1


@pytest.mark.slow
def test_sft_warmup_lr_gives_each_phase_its_own_schedule(tmp_path, toy):
    # Warm-up at its own peak, then distillation ramps up again from its first step: a
    # converged SFT model must not take its first on-policy step at the warm-up's rate.
    recipe = make_recipe("opd", tmp_path, cycles=3, sft_warmup_steps=3, warmup_steps=2,
                         lr=1e-4, sft_warmup_lr=4e-3)
    _, result = train(recipe, toy.fake_client())
    lrs = [(r["phase"], r["lr"]) for r in metrics(result.run_dir)]
    want = [("sft_warmup", 2e-3), ("sft_warmup", 4e-3), ("sft_warmup", 4e-3),
            ("train", 5e-5), ("train", 1e-4), ("train", 1e-4)]
    assert [p for p, _ in lrs] == [p for p, _ in want]
    assert [lr for _, lr in lrs] == pytest.approx([lr for _, lr in want])


@pytest.mark.slow
def test_sft_warmup_until_loss_ends_the_warm_up_early_and_resumes_exactly(tmp_path, toy,
                                                                          monkeypatch):
    # A loss bound every step meets ends the warm-up after its first 10-loss window; the
    # distillation phase then starts its own ramp there, and a run stopped in it and
    # resumed reaches the uninterrupted run's parameters.
    kw = dict(cycles=3, sft_warmup_steps=40, sft_warmup_until_loss=100.0, warmup_steps=2,
              lr=1e-4, sft_warmup_lr=4e-3)
    opts = dict(show_progress=False, write_report=False)
    recipe = make_recipe("opd", tmp_path, **kw)
    with Trainer(recipe, client=toy.fake_client(), run_id="whole", **opts) as trainer:
        whole = trainer.train()
        expected = parameters(trainer)
    rows = metrics(whole.run_dir)
    assert [r["phase"] for r in rows] == ["sft_warmup"] * 10 + ["train"] * 3
    assert [r["lr"] for r in rows[10:]] == pytest.approx([5e-5, 1e-4, 1e-4])
    done = events(whole.run_dir, "sft_warmup_done")
    assert [(e["step"], e["reason"], e["planned_steps"]) for e in done] == [(10, "loss", 40)]
    assert whole.final_version == 13

    first = Trainer(recipe, client=toy.fake_client(), run_id="split", **opts)
    stop_at_step(monkeypatch, first, 11)  # in the distillation phase
    with first:
        assert first.train().final_version == 11
    with Trainer(recipe, client=toy.fake_client(), run_id="split", resume=True,
                 **opts) as second:
        resumed = second.train()
        got = parameters(second)
    assert (resumed.status, resumed.final_version) == ("completed", 13)
    assert same_parameters(expected, got)
    again = events(resumed.run_dir, "sft_warmup_done")  # the run's: recorded once
    assert [(e["step"], e["reason"]) for e in again] == [(10, "loss")]


@pytest.mark.slow
def test_sft_warmup_until_loss_never_met_runs_every_warm_up_step(tmp_path, toy):
    recipe = make_recipe("opd", tmp_path, cycles=1, sft_warmup_steps=12,
                         sft_warmup_until_loss=1e-9)
    _, result = train(recipe, toy.fake_client())
    assert [r["phase"] for r in metrics(result.run_dir)] == ["sft_warmup"] * 12 + ["train"]
    done = events(result.run_dir, "sft_warmup_done")
    assert [(e["step"], e["reason"]) for e in done] == [(12, "steps")]


def test_sft_warmup_lr_without_warmup_steps_is_refused(tmp_path):
    with pytest.raises(ValueError, match="sft_warmup_lr 0.004 applies only to SFT warm-up"):
        make_recipe("opd", tmp_path, cycles=3, sft_warmup_lr=4e-3)


def test_teacher_modes_need_a_teacher(tmp_path):
    with pytest.raises(ConfigError, match="needs a teacher"):
        Trainer(make_recipe("opd", tmp_path))


def test_teacher_reload_mid_update_rebinds_and_rescores(tmp_path, toy):
    # One update never mixes teacher generations: after a reload the whole update is
    # scored again by the new generation, and the change is recorded in the run.
    fake = toy.fake_client()
    recipe = make_recipe("opd", tmp_path, cycles=2)
    with pytest.MonkeyPatch.context() as mp:
        trainer = Trainer(recipe, client=fake, show_progress=False, write_report=False)
        recorder = LossRecorder(trainer).install(mp)
        real_collect = None

        def reload_in_cycle_one(*args, **kw):
            if trainer.state.cycle == 1:
                fake.reload_before_next_wait = True
            return real_collect(*args, **kw)

        real_connect = loop.connect

        def connect(state, *handshake):
            nonlocal real_collect
            real_connect(state, *handshake)
            real_collect = state.teacher.link.collect
            mp.setattr(state.teacher.link, "collect", reload_in_cycle_one)

        mp.setattr(loop, "connect", connect)
        with trainer:
            result = trainer.train()
    assert result.status == "completed"
    gens = [{s[4]["gen"] for s in call["scored"]} for call in recorder.calls]
    assert gens == [{0}, {1}]
    changed = events(result.run_dir, "teacher_changed")
    assert len(changed) == 1 and changed[0]["how"] == "reload" and changed[0]["version"] == 1
