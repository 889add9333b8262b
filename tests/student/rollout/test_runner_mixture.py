"""The rollout runner with a mixture: each task is played in its own environment, with
that environment's params and system prompt, and its trajectory is tagged with its
name; a mixture of one environment plays exactly what the single-environment runner
plays."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from miniverl.common.errors import ConfigError  # noqa: E402
from miniverl.common.recipe_sections import MixtureEnvironmentConfig as Env  # noqa: E402
from miniverl.common.recipe_sections import RolloutConfig  # noqa: E402
from miniverl.common.toy import build_toy_model, build_toy_tokenizer  # noqa: E402
from miniverl.student.environments import get_environment, make_tasks  # noqa: E402
from miniverl.student.environments.mixture import mixture_tasks  # noqa: E402
from miniverl.student.rollout.runner import RolloutRunner  # noqa: E402
from tests.toy_kit import ONE_LAYER  # noqa: E402

torch.set_num_threads(1)
CFG = RolloutConfig(max_turns=2, max_new_tokens_per_turn=8, max_total_tokens=900, batch_size=3)


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_toy_model(ONE_LAYER, tok)


def test_each_task_plays_in_its_own_environment_and_carries_its_name(model, tok):
    mixture = mixture_tasks([Env(name="calculator", train_tasks=2, params={"units": False}),
                             Env(name="jsonnav", train_tasks=2)], "train")
    runner = RolloutRunner(model, tok, env_name="calculator", rollout=CFG, tokenizer_fp="fp",
                           mixture=mixture)
    # Interleaved, so one batch holds both environments.
    tasks = [t for pair in zip(mixture.tasks["calculator"], mixture.tasks["jsonnav"],
                               strict=True) for t in pair]
    trajs = runner.run(tasks, policy_version=3, seeds=list(range(4)))
    assert [t.environment for t in trajs] == ["calculator", "jsonnav"] * 2
    for traj, task in zip(trajs, tasks, strict=True):
        assert traj.task_id == task.id and traj.id.startswith(f"{traj.environment}/{task.id}/")
        system = get_environment(traj.environment, **mixture.params[traj.environment])
        assert traj.messages[0]["content"] == system.system_prompt()


def test_a_mixture_of_one_environment_plays_what_one_environment_plays(model, tok):
    env = Env(name="calculator", train_tasks=3, difficulty="mixed")
    tasks = make_tasks("calculator", "train", 3, "mixed", 0)
    plain = RolloutRunner(model, tok, env_name="calculator", rollout=CFG, tokenizer_fp="fp")
    mixed = RolloutRunner(model, tok, env_name="calculator", rollout=CFG, tokenizer_fp="fp",
                          mixture=mixture_tasks([env], "train"))
    a = plain.run(tasks, policy_version=0, seeds=[5, 6, 7])
    b = mixed.run(tasks, policy_version=0, seeds=[5, 6, 7])
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]


def test_a_task_of_no_environment_of_the_mixture_is_refused(model, tok):
    mixture = mixture_tasks([Env(name="jsonnav", train_tasks=1)], "train")
    runner = RolloutRunner(model, tok, env_name="jsonnav", rollout=CFG, tokenizer_fp="fp",
                           mixture=mixture)
    stray = make_tasks("calculator", "train", 1, "easy", 0)
    with pytest.raises(ConfigError, match="belongs to no environment of this run's mixture"):
        runner.run(stray, policy_version=0)
