"""The teacher's episodes kept in a shared ``cache.dir`` (student/teacher_episodes.py).

A benchmark's seeds and learning rates of one arm train on the same teacher episodes;
the cache lets one cell play them and the others read them. A user trusts two things:
an episode read back is token for token the one the teacher would play there (so no
cell trains on anything else than it would have), and a cell that reads it is charged
what it cost to play, so the equal-wall-clock budget still counts the teacher's
generation for every arm that uses it.
"""

from __future__ import annotations

import json

import pytest
import torch

import miniverl.student.teacher_play as teacher_play
from miniverl.common.modeling import load_tokenizer
from miniverl.common.recipe import Recipe
from miniverl.common.teacher_routes import environment_view
from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.student.environments import make_tasks
from miniverl.student.teacher_episodes import FOLDER, EpisodeCache
from miniverl.student.train.trainer import Trainer
from tests.toy_kit import TEACHER, events, make_recipe, recipe_dict, toy_dir

torch.set_num_threads(1)
SECTION = {"model": {"toy": dict(TEACHER)}, "dtype": "float32", "device": "cpu"}


def _recipe(tmp_path, shared, **sections):
    cache = {"dir": str(shared)} if shared else {}
    return make_recipe("sft", tmp_path / "runs", cycles=1, fixed_set="teacher",
                       sections={"teacher": SECTION, "cache": cache, **sections})


def _play(recipe, tasks, seeds):
    tok = load_tokenizer(toy_dir(TEACHER))
    return teacher_play.play_as_teacher(recipe, tasks, seeds, tok, fingerprint_tokenizer(tok))


@pytest.mark.slow  # four toy teacher plays: about 7 s
def test_a_cached_episode_is_the_one_the_teacher_plays_and_its_reader_is_charged(
        tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    recipe = _recipe(tmp_path, shared)
    tasks = make_tasks("calculator", "train", 4, "easy", 0)
    first = _play(recipe, tasks[:3], [10, 11, 12])
    assert first.from_cache == 0 and first.charged_s == 0.0 and first.time_load_s > 0
    (folder,) = (shared / FOLDER).iterdir()
    costs = json.loads((folder / "costs.json").read_text())
    assert set(costs) == {t.id for t in first.trajectories}
    assert sum(costs.values()) == pytest.approx(first.time_load_s + first.time_play_s, abs=1e-4)
    # Two of three cached: only the third is played; the order is the tasks' order.
    second = _play(recipe, tasks[1:], [11, 12, 13])
    assert second.from_cache == 2
    assert second.charged_s == pytest.approx(costs[second.trajectories[0].id]
                                             + costs[second.trajectories[1].id])
    direct = _play(_recipe(tmp_path, None), tasks[1:], [11, 12, 13])
    assert [t.tokens for t in second.trajectories] == [t.tokens for t in direct.trajectories]
    assert [t.id for t in second.trajectories] == [t.id for t in direct.trajectories]
    # Everything cached: the weights are never loaded, and the reader pays the full cost.
    def refuse(*a, **k):
        raise AssertionError("the teacher's weights were loaded for cached episodes")

    monkeypatch.setattr(teacher_play, "load_teacher_weights", refuse)
    third = _play(recipe, tasks[:2], [10, 11])
    assert (third.from_cache, third.time_load_s, third.time_play_s) == (2, 0.0, 0.0)
    assert [t.tokens for t in third.trajectories] == [t.tokens for t in first.trajectories[:2]]
    assert third.charged_s == pytest.approx(costs[third.trajectories[0].id]
                                            + costs[third.trajectories[1].id])


def test_other_sampling_settings_or_no_shared_dir_find_nothing(tmp_path):
    shared = tmp_path / "shared"
    recipe = _recipe(tmp_path, shared)
    tasks = make_tasks("calculator", "train", 1, "easy", 0)
    _play(recipe, tasks, [5])
    hotter = _recipe(tmp_path, shared, rollout={"temperature": 0.7},
                     loss={"temperature": 0.7})
    assert _play(hotter, tasks, [5]).from_cache == 0
    assert len(list((shared / FOLDER).iterdir())) == 2  # one key per setting
    model_dir = toy_dir(TEACHER)
    assert EpisodeCache.for_recipe(_recipe(tmp_path, None), model_dir, "fp") is None
    off = _recipe(tmp_path, shared, cache={"dir": str(shared), "enabled": False})
    assert EpisodeCache.for_recipe(off, model_dir, "fp") is None


@pytest.mark.slow  # two SeqKD toy runs: about 10 s
def test_two_seqkd_runs_sharing_a_cache_train_on_one_set_and_both_pay_for_it(tmp_path):
    shared = tmp_path / "shared"
    opts = dict(show_progress=False, write_report=False, checkpoints=False)
    recipes = [_recipe(tmp_path, shared, environment={"train_tasks": 4},
                       train={"lr": lr}) for lr in (1e-3, 3e-4)]
    played = []
    for i, recipe in enumerate(recipes):
        with Trainer(recipe, run_id=f"r{i}", **opts) as trainer:
            played.append(events(trainer.train().run_dir, "teacher_set_played")[0])
    first, second = played
    assert first["from_cache"] == 0 and first["time_charged_s"] == 0.0
    assert second["from_cache"] == second["episodes"] == first["episodes"]
    assert second["time_load_s"] == 0.0
    assert second["time_charged_s"] == pytest.approx(first["time_load_s"] + first["time_play_s"],
                                                     abs=1e-3)


@pytest.mark.slow  # three toy teacher plays and one merge: about 5 s
def test_an_adapter_route_plays_with_its_adapter_merged_and_caches_apart(tmp_path):
    # SeqKD from specialists that are adapters of one base (teacher.adapters, an
    # environment's adapter:): each route's episodes are the ones the base with that
    # adapter merged would play, never the bare base's, and the shared cache keeps them
    # under the adapter's own key.
    from peft import PeftModel

    from miniverl.common.modeling import load_causal_lm
    from tests.teacher_server.test_adapters import make_lora

    base = toy_dir(TEACHER)
    calc = make_lora(base, tmp_path / "calc", seed=3, targets=["q_proj", "v_proj", "up_proj"])
    merged = tmp_path / "merged"
    model = PeftModel.from_pretrained(load_causal_lm(base, dtype="float32", device="cpu"), calc)
    model.merge_and_unload().save_pretrained(merged)
    load_tokenizer(base).save_pretrained(merged)
    shared = tmp_path / "shared"
    data = recipe_dict("sft", tmp_path / "runs", cycles=1, fixed_set="teacher")
    del data["environment"]
    data.update(teacher={**SECTION, "model": {"path": str(base)}, "adapters": {"calc": calc}},
                cache={"dir": str(shared)},
                environments=[{"name": "calculator", "adapter": "calc", "train_tasks": 4,
                               "eval_tasks": 2, "test_tasks": 2}])
    routed = Recipe.model_validate(data)
    with_adapter = environment_view(routed, "calculator", routed.teacher)
    tasks = make_tasks("calculator", "train", 3, "easy", 0)
    seeds = [7, 8, 9]
    tok = load_tokenizer(base)
    played = teacher_play.play_as_teacher(with_adapter, tasks, seeds, tok,
                                          fingerprint_tokenizer(tok), adapter="calc")
    as_merged = _play(_recipe(tmp_path, None, teacher={**SECTION, "model": {"path": str(merged)}}),
                      tasks, seeds)
    bare = _play(_recipe(tmp_path, shared, teacher={**SECTION, "model": {"path": str(base)}}),
                 tasks, seeds)
    assert [t.tokens for t in played.trajectories] == [t.tokens for t in as_merged.trajectories]
    assert [t.tokens for t in played.trajectories] != [t.tokens for t in bare.trajectories]
    assert bare.from_cache == 0  # the bare base's key is not the adapter's
    assert len(list((shared / FOLDER).iterdir())) == 2
