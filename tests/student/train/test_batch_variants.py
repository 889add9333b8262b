"""The batch-side variants: GKD mixing (``train.on_policy_fraction``), SeqKD
(``train.fixed_set: teacher``) and groups (``rollout.group_size``).

A user comparing OPD with its standard variants relies on each one building exactly the
batch docs/training.md describes: the mixing split and its seeded fixed-set draw (0 =
offline KD's batch, 0.5 = half fresh, half fixed), the teacher's set played with the
teacher's weights and its time in the arm's wall clock, G episodes per task with
distinct seeds, each trained on its own positions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from miniverl.common.errors import ConfigError
from miniverl.common.modeling import load_causal_lm, load_tokenizer
from miniverl.common.recipe import loads_recipe
from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.common.trajectory import read_trajectories, select_positions_for
from miniverl.student.environments import make_tasks
from miniverl.student.rollout.runner import RolloutRunner
from miniverl.student.train.fixed_sets import TEACHER_SET_CYCLE
from miniverl.student.train.modes.offline_kd import split
from miniverl.student.train.state import episode_seed, fixed_draw
from miniverl.student.train.trainer import Trainer
from tests.student.train.trainer_kit import (
    LossRecorder,
    parameters,
    same_parameters,
    stop_at_step,
)
from tests.toy_kit import STUDENT, TEACHER, events, make_recipe, metrics, recipe_dict, toy_dir

torch.set_num_threads(1)
OPTS = dict(show_progress=False, write_report=False, checkpoints=False)


def test_the_mixing_split_and_the_fixed_draw():
    assert split(8, 0.0) == (0, 8) and split(8, 1.0) == (8, 0) and split(8, 0.5) == (4, 4)
    assert split(5, 0.5) == (3, 2) and split(4, 0.25) == (1, 3)  # half rounds up
    recipe = make_recipe("offline_kd", "runs")
    items = list(range(20))
    draw = fixed_draw(recipe, items, 3, 4)
    assert draw == fixed_draw(recipe, items, 3, 4) and draw == sorted(draw) and len(draw) == 4
    assert draw != fixed_draw(recipe, items, 4, 4)
    other = make_recipe("offline_kd", "runs", sections={"run": {"seed": 1}})
    assert draw != fixed_draw(other, items, 3, 4)
    # A whole batch is offline KD's draw as it was before mixing existed.
    rng = np.random.default_rng(episode_seed(0, 3, 77_777))
    assert fixed_draw(recipe, items, 3, 4) == sorted(rng.choice(20, size=4, replace=False))
    assert fixed_draw(recipe, items[:3], 3, 4) == items[:3]


def test_group_size_and_the_episodes_of_a_cycle():

    from miniverl.student.train.state import TrainTasks, group_size

    assert group_size(make_recipe("opd", "runs")) == 1
    assert group_size(make_recipe("opd", "runs", sections={"rollout": {"group_size": 2}})) == 2
    # dpo keeps dpo.group_size, unless rollout.group_size sizes its groups instead.
    assert group_size(make_recipe("dpo", "runs", sections={"dpo": {"group_size": 4}})) == 4
    assert group_size(make_recipe("dpo", "runs", sections={"rollout": {"group_size": 2}})) == 2
    draw = TrainTasks(list("abcdefgh"), make_recipe("opd", "runs").run.seed)
    # One environment (no mixture): the seeded permutation of epoch (cycle * n + i) // len.
    order = np.random.default_rng(0 * 7919 + 1).permutation(8)
    assert draw.of_cycle(3, 4) == ["abcdefgh"[order[i]] for i in range(4, 8)]
    # G = 1 is the batch a cycle sampled before groups: task i with seed (seed, cycle, i).
    assert draw.episodes(3, 4) == (draw.of_cycle(3, 4),
                                   [episode_seed(0, 3, i) for i in range(4)])
    tasks, seeds = draw.episodes(3, 4, group=2)
    first_two = draw.of_cycle(3, 2)
    assert tasks == [first_two[0]] * 2 + [first_two[1]] * 2
    assert seeds == [episode_seed(0, 3, i) for i in range(4)]


def _run(recipe, toy):
    """Train ``recipe`` with the toy teacher; the result and what each update trained on."""
    trainer = Trainer(recipe, client=toy.fake_client(), **OPTS)
    with pytest.MonkeyPatch.context() as mp, trainer:
        recorder = LossRecorder(trainer).install(mp)
        result = trainer.train()
    assert result.status == "completed"
    return result, recorder.calls


@pytest.mark.slow
def test_half_of_each_gkd_batch_is_fresh_and_half_from_the_fixed_set(tmp_path, toy):
    mixed, calls = _run(make_recipe("offline_kd", tmp_path / "mix", cycles=2, fixed_set="oracle",
                                    on_policy_fraction=0.5), toy)
    recipe = make_recipe("offline_kd", tmp_path / "kd", cycles=2, fixed_set="oracle")
    tasks = make_tasks("calculator", "train", 8, "easy", 0)
    for c, call in enumerate(calls):
        trajs, bound = [s[0] for s in call["scored"]], [s[3] for s in call["scored"]]
        # The first two are OPD's first two episodes of cycle c, sampled and scored by v = c.
        assert [t.source for t in trajs] == ["rollout", "rollout", "oracle", "oracle"]
        assert [t.seed for t in trajs[:2]] == [episode_seed(0, c, i) for i in range(2)]
        assert {t.policy_version for t in trajs[:2]} == {c} and bound == [c, c, 0, 0]
        # The other two are the seeded fixed-set draw of cycle c.
        oracle_ids = [t.id for t in tasks]
        picked = fixed_draw(recipe, oracle_ids, c, 2)
        assert [t.task_id for t in trajs[2:]] == picked
    rows = [r for r in metrics(mixed.run_dir) if r["phase"] == "train"]
    assert [(r["on_policy_episodes"], r["fixed_set_episodes"]) for r in rows] == [(2, 2)] * 2
    assert all(r["on_policy"] is False and r["positions"] > 0 for r in rows)
    # The teacher scored the fresh half only; the step trained on all four.
    for row, call in zip(rows, calls, strict=True):
        assert row["positions_scored"] == sum(len(s[1]) for s in call["scored"][:2])
        assert row["positions"] == sum(len(s[1]) for s in call["scored"])
    # Fraction 0 trains on offline KD's batches, episode for episode.
    # (fixed_draw of a whole batch is offline KD's draw: the test above.)
    _, zero = _run(make_recipe("offline_kd", tmp_path / "zero", cycles=2, fixed_set="oracle",
                               on_policy_fraction=0.0), toy)
    assert [[s[0].task_id for s in call["scored"]] for call in zero] == [
        fixed_draw(recipe, [t.id for t in tasks], c, 4) for c in range(2)]


def test_opd_plays_each_task_group_size_times_with_distinct_seeds(tmp_path, toy):
    recipe = make_recipe("opd", tmp_path, cycles=2, sections={"rollout": {"group_size": 2}})
    result, calls = _run(recipe, toy)
    for c, call in enumerate(calls):
        trajs = [s[0] for s in call["scored"]]
        assert [t.seed for t in trajs] == [episode_seed(0, c, i) for i in range(4)]
        assert trajs[0].task_id == trajs[1].task_id and trajs[2].task_id == trajs[3].task_id
        assert trajs[0].task_id != trajs[2].task_id and len({t.id for t in trajs}) == 4
        # Each episode trains on its own positions; the step divides by all of them.
        for s in call["scored"]:
            assert np.array_equal(s[1], select_positions_for(s[0], recipe.loss, seed=0))
    rows = [r for r in metrics(result.run_dir) if r["phase"] == "train"]
    assert [r["positions"] for r in rows] == [
        sum(len(s[1]) for s in call["scored"]) for call in calls]


def _plays(shape, tasks, seeds, recipe):
    """What the toy model of ``shape`` plays on ``tasks`` with ``seeds``."""
    model_dir = toy_dir(shape)
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype="float32", device="cpu")
    runner = RolloutRunner(model, tok, env_name="calculator", rollout=recipe.rollout,
                           tokenizer_fp=fingerprint_tokenizer(tok))
    with torch.no_grad():
        return runner.run(tasks, policy_version=0, seeds=seeds)


@pytest.mark.slow
def test_seqkd_trains_on_episodes_the_teachers_weights_play(tmp_path, monkeypatch):
    teacher = {"model": {"toy": dict(TEACHER)}, "dtype": "float32", "device": "cpu"}
    recipe = make_recipe("sft", tmp_path, cycles=2, fixed_set="teacher",
                         sections={"teacher": teacher, "environment": {"train_tasks": 4}})
    import miniverl.student.train.modes.sft as sft_module

    seen = []
    real = sft_module.sft_step

    def recording(policy, optimizer, scheduler, trajs, **kw):
        seen.append(list(trajs))
        return real(policy, optimizer, scheduler, trajs, **kw)

    monkeypatch.setattr(sft_module, "sft_step", recording)
    with Trainer(recipe, **OPTS) as trainer:
        result = trainer.train()
    played = read_trajectories(result.run_dir / "trajectories.jsonl")
    tasks = make_tasks("calculator", "train", 4, "easy", 0)
    seeds = [episode_seed(0, TEACHER_SET_CYCLE, i) for i in range(4)]
    # One episode per training task, token for token what the teacher's weights play.
    direct = _plays(TEACHER, tasks, seeds, recipe)
    assert [t.tokens for t in played] == [t.tokens for t in direct]
    assert {t.source for t in played} == {"teacher"} and len({t.id for t in played}) == 4
    # The student's weights, on the same tasks and seeds, play something else.
    student = _plays(STUDENT, tasks, seeds, recipe)
    assert [t.tokens for t in student] != [t.tokens for t in played]
    # Every update trained on teacher episodes only.
    assert len(seen) == 2 and all(t.source == "teacher" for batch in seen for t in batch)
    (event,) = events(result.run_dir, "teacher_set_played")
    assert event["episodes"] == 4 and event["recorded"] is False and event["time_play_s"] > 0
    first = [r for r in metrics(result.run_dir) if r["phase"] == "train"][0]
    assert first["wall_s"] > event["time_load_s"] + event["time_play_s"]


@pytest.mark.slow
def test_offline_kd_scores_the_teacher_set_and_counts_its_playing_time(tmp_path, toy):
    fake = toy.fake_client()
    recipe = make_recipe("offline_kd", tmp_path, cycles=1, fixed_set="teacher",
                         sections={"environment": {"train_tasks": 4}})
    with Trainer(recipe, client=fake, **OPTS) as trainer:
        result = trainer.train()
    (played,) = events(result.run_dir, "teacher_set_played")
    (scored,) = events(result.run_dir, "offline_targets_scored")
    assert scored["source"] == "teacher" and scored["trajectories"] == 4 == fake.counters["sent"]
    assert scored["time_sample_s"] >= played["time_load_s"] + played["time_play_s"]


@pytest.mark.parametrize("bad", ["prepare", "adapter"])
def test_a_teacher_this_process_cannot_load_as_it_stands_is_refused(tmp_path, bad):
    data = recipe_dict("offline_kd", tmp_path, fixed_set="teacher")
    data["teacher"][bad] = "elsewhere"
    with pytest.raises(ConfigError) as info:
        loads_recipe(yaml.safe_dump(data), "r.yaml")
    (line,) = str(info.value).splitlines()
    assert f"teacher.{bad} 'elsewhere'" in line and "teacher.model.path" in line


@pytest.mark.slow  # three toy runs with checkpoints: about 12 s
def test_a_resumed_seqkd_run_reads_its_teacher_set_back(tmp_path, monkeypatch):
    teacher = {"model": {"toy": dict(TEACHER)}, "dtype": "float32", "device": "cpu"}
    recipe = make_recipe("sft", tmp_path, cycles=2, fixed_set="teacher",
                         sections={"teacher": teacher, "environment": {"train_tasks": 4}})
    opts = dict(show_progress=False, write_report=False)
    with Trainer(recipe, run_id="whole", **opts) as trainer:
        trainer.train()
        expected = parameters(trainer)
    first = Trainer(recipe, run_id="split", **opts)
    stop_at_step(monkeypatch, first, 1)
    with first:
        assert first.train().final_version == 1
    with Trainer(recipe, run_id="split", resume=True, **opts) as second:
        resumed = second.train()
        got = parameters(second)
    assert (resumed.status, resumed.final_version) == ("completed", 2)
    # Played once: the resume read the set back instead of loading the teacher again.
    played = events(resumed.run_dir, "teacher_set_played")
    assert [e["recorded"] for e in played] == [False, True]
    assert len(read_trajectories(resumed.run_dir / "trajectories.jsonl")) == 4
    assert same_parameters(expected, got)


@pytest.mark.slow  # three toy runs with checkpoints
def test_a_resumed_gkd_run_trains_exactly_what_the_uninterrupted_one_did(tmp_path, toy,
                                                                         monkeypatch):
    recipe = make_recipe("offline_kd", tmp_path, cycles=4, fixed_set="oracle",
                         on_policy_fraction=0.5)
    opts = dict(show_progress=False, write_report=False)
    with Trainer(recipe, client=toy.fake_client(), run_id="whole", **opts) as trainer:
        trainer.train()
        expected = parameters(trainer)
    first = Trainer(recipe, client=toy.fake_client(), run_id="split", **opts)
    stop_at_step(monkeypatch, first, 2)
    with first:
        assert first.train().final_version == 2
    with Trainer(recipe, client=toy.fake_client(), run_id="split", resume=True,
                 **opts) as second:
        resumed = second.train()
        got = parameters(second)
    assert (resumed.status, resumed.final_version) == ("completed", 4)
    assert same_parameters(expected, got)


@pytest.mark.slow
def test_seqkd_applies_the_teachers_competence_gate(tmp_path, monkeypatch):
    from miniverl.common import qualification

    monkeypatch.setattr(qualification, "qualifications_dir", lambda: tmp_path / "records")
    teacher = {"model": {"toy": dict(TEACHER)}, "dtype": "float32", "device": "cpu",
               "min_success": 0.5}
    recipe = make_recipe("sft", tmp_path / "runs", cycles=1, fixed_set="teacher",
                         sections={"teacher": teacher, "environment": {"train_tasks": 4}})
    with Trainer(recipe, **OPTS) as trainer, pytest.raises(
            qualification.TeacherNotQualified, match="has no qualification record"):
        trainer.train()
    assert trainer.step == 0  # refused before the set is played
    model_dir = toy_dir(TEACHER)
    qualification.save_record({
        "kind": qualification.RECORD_KIND, "model_dir": str(model_dir),
        "model_dir_sha256": qualification.model_dir_digest(model_dir),
        "teacher": {"name": model_dir.name, "model": str(model_dir), "revision": None,
                    "adapter_sha256": None},
        "environment": qualification.environment_signature(recipe), "split": "eval",
        "n": 8, "success": 0.75, "date": "2026-01-01T00:00:00+00:00",
    })
    # Qualified, the same teacher plays.
    from miniverl.student.teacher_play import play_as_teacher

    tok = load_tokenizer(model_dir)
    (task,) = make_tasks("calculator", "train", 1, "easy", 0)
    played = play_as_teacher(recipe, [task], [0], tok, fingerprint_tokenizer(tok), gate=True)
    assert [t.source for t in played.trajectories] == ["teacher"]
