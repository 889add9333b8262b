"""Mixtures of environments: each environment's tasks are its single-environment tasks,
every task id knows its environment, and a cycle's draw is a pure function of (run seed,
cycle, episode) that follows the weights and never picks a weight-0 environment."""

from __future__ import annotations

from collections import Counter

import pytest

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import MixtureEnvironmentConfig as Env
from miniverl.student.environments import make_tasks, register, unregister
from miniverl.student.environments.calculator import CalculatorEnv
from miniverl.student.environments.mixture import draw, mixture_tasks

CALC = Env(name="calculator", weight=3, train_tasks=12, eval_tasks=4, difficulty="mixed",
           params={"units": False})
JSON = Env(name="jsonnav", weight=1, train_tasks=6, eval_tasks=3, split_seed=5)


@pytest.fixture(scope="module")
def mixture():
    return mixture_tasks([CALC, JSON], "train")


def test_each_environment_makes_its_own_single_environment_tasks(mixture):
    # A mixture changes which tasks are drawn, never what a task is.
    for env in (CALC, JSON):
        assert mixture.tasks[env.name] == make_tasks(
            env.name, "train", env.train_tasks, env.difficulty, env.split_seed, params=env.params)
    assert mixture.all_tasks() == mixture.tasks["calculator"] + mixture.tasks["jsonnav"]
    assert {mixture.environment_of[t.id] for t in mixture.tasks["jsonnav"]} == {"jsonnav"}
    assert mixture.params == {"calculator": {"units": False}, "jsonnav": {}}


def test_a_held_out_split_takes_each_environments_count_and_the_cap():
    assert [len(v) for v in mixture_tasks([CALC, JSON], "eval").tasks.values()] == [4, 3]
    assert [len(v) for v in mixture_tasks([CALC, JSON], "eval", cap=2).tasks.values()] == [2, 2]


def test_the_draw_is_a_pure_function_of_seed_cycle_and_episode(mixture):
    # A resumed run draws cycle c afresh: it must get exactly the uninterrupted run's tasks.
    first = draw(mixture, 7, 4, 16)
    assert draw(mixture, 7, 4, 16) == first
    # Episode i does not depend on how many episodes the cycle has.
    assert draw(mixture, 7, 4, 5) == first[:5]
    assert draw(mixture, 7, 5, 16) != first and draw(mixture, 8, 4, 16) != first


def test_the_draw_follows_the_weights(mixture):
    names = Counter(mixture.environment_of[t.id]
                    for cycle in range(50) for t in draw(mixture, 0, cycle, 40))
    # 2000 draws at 3:1; the binomial sd of the share is ~0.01.
    assert abs(names["calculator"] / 2000 - 0.75) < 0.04
    picked = {t.id for cycle in range(50) for t in draw(mixture, 0, cycle, 40)}
    assert picked == {t.id for t in mixture.all_tasks()}  # every task comes up


def test_a_zero_weight_environment_is_never_drawn_but_still_evaluated():
    mixture = mixture_tasks([Env(name="calculator", weight=0, train_tasks=4),
                             Env(name="jsonnav", weight=1, train_tasks=4),
                             Env(name="sqlite", weight=0, train_tasks=4)], "train")
    drawn = {mixture.environment_of[t.id] for c in range(20) for t in draw(mixture, 1, c, 10)}
    assert drawn == {"jsonnav"}
    assert len(mixture.tasks["calculator"]) == 4


def test_two_environments_that_make_the_same_task_ids_are_refused():
    # A plugin registered under a second name keeps its class's `name`, so its ids.
    register("calc_twin", CalculatorEnv)
    try:
        with pytest.raises(ConfigError, match="both make task"):
            mixture_tasks([Env(name="calculator", train_tasks=3),
                           Env(name="calc_twin", train_tasks=3)], "train")
    finally:
        unregister("calc_twin")
