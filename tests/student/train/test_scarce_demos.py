"""Scarce demonstrations (``train.oracle_tasks``) and offline KD scored as it is drawn
(``train.score_fixed_set: drawn``).

The distillation benchmark (docs/distillbench.md) gives the student arms oracle traces
of the first D training tasks only, while the teacher-using arms see every prompt; and
it compares arms at equal wall-clock, so an offline arm must pay only for the episodes
it trains on. A user relies on both doing exactly that: sft's batches and offline KD's
oracle set hold the first D tasks' traces and no other, fresh episodes still come from
every task, and a drawn-as-used set trains on the same batches with the same targets
as one scored whole, asks the teacher only for what it draws, and asks nothing for what
a shared cache already holds.
"""

from __future__ import annotations

import pytest
import torch
import yaml

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import loads_recipe, recipe_digest
from miniverl.student.environments import make_tasks
from miniverl.student.train.state import fixed_draw
from miniverl.student.train.trainer import Trainer
from tests.student.train.trainer_kit import LossRecorder, parameters, same_parameters
from tests.toy_kit import events, make_recipe, metrics, recipe_dict

torch.set_num_threads(1)
OPTS = dict(show_progress=False, write_report=False, checkpoints=False)
TASKS = [t.id for t in make_tasks("calculator", "train", 8, "easy", 0)]


def _run(recipe, client):
    trainer = Trainer(recipe, client=client, **OPTS)
    with pytest.MonkeyPatch.context() as mp, trainer:
        recorder = LossRecorder(trainer).install(mp)
        result = trainer.train()
        weights = parameters(trainer)
    assert result.status == "completed"
    return result, recorder.calls, weights


@pytest.mark.slow
def test_sft_trains_on_the_oracle_traces_of_the_first_oracle_tasks_only(tmp_path, monkeypatch):
    import miniverl.student.train.modes.sft as sft_module

    seen = []
    real = sft_module.sft_step

    def recording(policy, optimizer, scheduler, trajs, **kw):
        seen.append([t.task_id for t in trajs])
        return real(policy, optimizer, scheduler, trajs, **kw)

    monkeypatch.setattr(sft_module, "sft_step", recording)
    recipe = make_recipe("sft", tmp_path, cycles=3, oracle_tasks=2, sft_warmup_steps=1)
    with Trainer(recipe, **OPTS) as trainer:
        assert trainer.train().status == "completed"
    assert len(seen) == 4  # the warm-up step and three cycles
    assert {t for batch in seen for t in batch} == set(TASKS[:2])
    # sft_epochs counts passes over the tasks that have a trace.
    from miniverl.student.train.optim import planned_cycles

    epochs = make_recipe("sft", tmp_path, sft_epochs=2, oracle_tasks=2)
    assert planned_cycles(epochs) == 1  # 2 epochs x 2 traces / 4 per cycle


@pytest.mark.slow
def test_gkd_draws_its_fixed_part_from_the_scarce_demos_and_its_fresh_part_from_every_task(
        tmp_path, toy):
    recipe = make_recipe("offline_kd", tmp_path, cycles=3, fixed_set="oracle", oracle_tasks=3,
                         on_policy_fraction=0.5)
    _, calls, _ = _run(recipe, toy.fake_client())
    fixed = [s[0].task_id for call in calls for s in call["scored"] if s[0].source == "oracle"]
    fresh = [s[0].task_id for call in calls for s in call["scored"] if s[0].source == "rollout"]
    assert set(fixed) <= set(TASKS[:3]) and len(fixed) == 6
    assert not set(fresh) <= set(TASKS[:3])  # 6 fresh episodes of cycles 0-2 leave the three


@pytest.mark.slow
def test_a_set_scored_as_drawn_trains_as_one_scored_whole_and_pays_for_its_draws(tmp_path, toy):
    whole = make_recipe("offline_kd", tmp_path / "whole", cycles=2, fixed_set="oracle")
    drawn = make_recipe("offline_kd", tmp_path / "drawn", cycles=2, fixed_set="oracle",
                        score_fixed_set="drawn",
                        sections={"cache": {"dir": str(tmp_path / "shared")}})
    fake_whole, fake_drawn = toy.fake_client(), toy.fake_client()
    _, calls_whole, weights_whole = _run(whole, fake_whole)
    result, calls_drawn, weights_drawn = _run(drawn, fake_drawn)
    # The same batches with the same targets, hence the same weights.
    for a, b in zip(calls_whole, calls_drawn, strict=True):
        assert [s[0].id for s in a["scored"]] == [s[0].id for s in b["scored"]]
        for x, y in zip(a["scored"], b["scored"], strict=True):
            assert x[3] == y[3] == 0 and all((x[2][k] == y[2][k]).all() for k in x[2])
    assert same_parameters(weights_whole, weights_drawn)
    # The whole set is asked for up front; the drawn one only for what its updates drew.
    picked = {t for c in range(2) for t in fixed_draw(drawn, TASKS, c, 4)}
    assert fake_whole.counters["sent"] == 8 and fake_drawn.counters["sent"] == len(picked) < 8
    (event,) = events(result.run_dir, "offline_targets_scored")
    assert event["lazy"] is True and event["set_size"] == 8 and event["trajectories"] == 0
    rows = [r for r in metrics(result.run_dir) if r["phase"] == "train"]
    assert all(r["positions_scored"] > 0 and r["time_teacher_wait_s"] > 0 for r in rows[:1])
    # Another seed's run on the same set finds every draw of seed 0 in the shared cache.
    again = make_recipe("offline_kd", tmp_path / "again", cycles=2, fixed_set="oracle",
                        score_fixed_set="drawn",
                        sections={"cache": {"dir": str(tmp_path / "shared")}})
    fake_again = toy.fake_client()
    _, calls_again, _ = _run(again, fake_again)
    assert fake_again.counters["sent"] == 0 and len(calls_again) == 2


@pytest.mark.parametrize(("mode", "train", "says"), [
    ("sft", {"oracle_tasks": 9}, "oracle_tasks 9 is more than the 8 training tasks"),
    ("opd", {"score_fixed_set": "drawn"}, "score_fixed_set 'drawn'"),
    ("offline_kd", {"score_fixed_set": "drawn", "fixed_set": "student"},
     "the frozen student set is scored whole"),
])
def test_the_recipe_refuses_fields_that_cannot_apply(tmp_path, mode, train, says):
    with pytest.raises(ConfigError) as info:
        loads_recipe(yaml.safe_dump(recipe_dict(mode, tmp_path, **train)), "r.yaml")
    (line,) = str(info.value).splitlines()
    assert says in line


def test_the_new_fields_leave_the_digest_of_a_recipe_without_them_unchanged(tmp_path):
    import hashlib
    import json

    from miniverl.common.recipe import HASHED_ONLY_WHEN_SET
    from miniverl.common.recipe import recipe_dict as resolved

    base = make_recipe("offline_kd", tmp_path)
    # The digest a recipe had before the fields existed: its resolved dict without them
    # (and without the other fields hashed only when set).
    data = resolved(base)
    for dotted in HASHED_ONLY_WHEN_SET:
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(leaf) is None:
            node.pop(leaf, None)
    assert "oracle_tasks" not in data["train"] and "score_fixed_set" not in data["train"]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    assert recipe_digest(base) == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert recipe_digest(make_recipe("offline_kd", tmp_path, oracle_tasks=4)) != recipe_digest(base)
    assert recipe_digest(make_recipe("offline_kd", tmp_path, score_fixed_set="drawn")) \
        != recipe_digest(base)


def _teacher_episodes(tasks, seeds, recipe):
    """What the toy teacher's weights play on ``tasks`` with ``seeds``, all in one go."""
    from tests.student.train.test_batch_variants import _plays
    from tests.toy_kit import TEACHER

    return _plays(TEACHER, tasks, seeds, recipe)


@pytest.mark.slow
def test_seqkd_plays_only_the_tasks_its_cycles_train_on(tmp_path):
    from miniverl.common.trajectory import read_trajectories
    from miniverl.student.train.fixed_sets import TEACHER_SET_CYCLE
    from miniverl.student.train.state import episode_seed
    from tests.toy_kit import TEACHER

    teacher = {"model": {"toy": dict(TEACHER)}, "dtype": "float32", "device": "cpu"}
    recipe = make_recipe("sft", tmp_path, cycles=1, fixed_set="teacher",
                         sections={"teacher": teacher})
    with Trainer(recipe, **OPTS) as trainer:
        result = trainer.train()
    played = read_trajectories(result.run_dir / "trajectories.jsonl")
    (event,) = events(result.run_dir, "teacher_set_played")
    assert event["episodes"] == 4 == len(played)  # one cycle of 4 of the 8 tasks
    tasks = make_tasks("calculator", "train", 8, "easy", 0)
    seeds = [episode_seed(0, TEACHER_SET_CYCLE, i) for i in range(8)]
    # Each is the whole set's episode of its task: the same seed, the same tokens.
    whole = {t.task_id: t for t in _teacher_episodes(tasks, seeds, recipe)}
    assert all(t.tokens == whole[t.task_id].tokens for t in played)


@pytest.mark.slow
def test_kd_on_a_teacher_set_scored_as_drawn_plays_only_what_its_draws_hold(tmp_path, toy):
    from miniverl.common.trajectory import read_trajectories

    recipe = make_recipe("offline_kd", tmp_path, cycles=1, fixed_set="teacher",
                         score_fixed_set="drawn", rollouts_per_cycle=2)
    _, calls, _ = _run(recipe, toy.fake_client())
    drawn = fixed_draw(recipe, TASKS, 0, 2)
    assert [s[0].task_id for s in calls[0]["scored"]] == drawn
    played = read_trajectories(next(tmp_path.glob("t-offline_kd-*")) / "trajectories.jsonl")
    assert sorted(t.task_id for t in played) == sorted(drawn)
    (event,) = events(next(tmp_path.glob("t-offline_kd-*")), "offline_targets_scored")
    assert (event["set_size"], event["drawn_from"]) == (2, 8)
