"""Mode ``rl``: RL on the task reward alone. Its objective's gradient is REINFORCE with a
leave-one-out group baseline (closed form, float64); a run asks no teacher, takes one
step per cycle on its own fresh episodes and records them; a recipe that cannot be an RL
run is refused with one line naming the field and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import LossConfig
from miniverl.common.trajectory import Span, SpanType, Trajectory, VerifierResult, read_trajectories
from miniverl.student.train.objectives import TeacherTargets
from miniverl.student.train.objectives.variants import TaskReward
from tests.toy_kit import events, make_recipe, metrics

torch.set_num_threads(1)
V = 7


def _traj(task: str, score: float, seed: int) -> Trajectory:
    tokens = [0, 1, 2, (seed + 3) % V, (seed + 4) % V]
    return Trajectory(
        id=f"t/{task}/{seed}", tokens=tokens, tokenizer_fp="fp", environment="calculator",
        task_id=task, policy_version=0,
        spans=[Span(type=SpanType.USER, start=0, end=3),
               Span(type=SpanType.ASSISTANT_FINAL, start=3, end=5)],
        verifier=VerifierResult(success=score == 1.0, score=score),
    )


def test_the_task_reward_gradient_is_reinforce_with_a_leave_one_out_baseline():
    # Two tasks, two episodes each: advantages r - (mean of the others of its task).
    trajs = [_traj("a", 1.0, 0), _traj("a", 0.0, 1), _traj("b", 0.5, 2), _traj("b", 0.5, 3)]
    positions = [np.array([2, 3]) for _ in trajs]
    task_reward = TaskReward(LossConfig(chunk_size=3))
    extra = task_reward.step_inputs(trajs, positions)
    advantage = np.concatenate([e["advantage_P"] for e in extra])
    assert advantage.tolist() == [1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0]
    ids = torch.tensor(np.concatenate([np.asarray(t.tokens)[p + 1] for t, p in
                                       zip(trajs, positions, strict=True)]))
    torch.manual_seed(0)
    head = torch.nn.Linear(4, V, bias=False).double()
    hidden = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    targets = TeacherTargets(sampled_ids_P=ids).with_inputs(extra, "cpu")
    loss, metrics_ = task_reward.loss(hidden, head, targets)
    loss.backward()
    logits = head(hidden).detach()
    closed = -(torch.from_numpy(advantage)[:, None] * (F.one_hot(ids, V) - logits.softmax(-1)))
    assert torch.allclose(hidden.grad, (closed / 8) @ head.weight.detach(), atol=1e-12)
    # The figure is the sampled tokens' surprise, -log S(y).
    surprise = -logits.log_softmax(-1).gather(-1, ids[:, None]).squeeze(-1)
    assert np.isclose(metrics_["divergence"], surprise.mean().item(), rtol=1e-12)


def test_one_reward_for_every_episode_of_a_task_moves_nothing():
    # No episode beat its siblings: every advantage is 0, so is the gradient.
    trajs = [_traj("a", 1.0, 0), _traj("a", 1.0, 1)]
    extra = TaskReward(LossConfig()).step_inputs(trajs, [np.array([2, 3])] * 2)
    assert all(np.all(e["advantage_P"] == 0.0) for e in extra)


def _rl(tmp_path, **sections):
    return make_recipe("rl", tmp_path, teacher=None, cycles=2,
                       sections={"rollout": {"group_size": 2}, **sections})


@pytest.mark.slow
def test_an_rl_run_samples_and_steps_without_a_teacher(tmp_path):
    from miniverl.student.train.trainer import Trainer

    recipe = _rl(tmp_path)
    assert not recipe.needs_teacher and recipe.on_policy
    with Trainer(recipe, show_progress=False, write_report=False) as trainer:
        result = trainer.train()
    assert result.status == "completed" and result.final_version == 2
    rows = [r for r in metrics(result.run_dir) if r["phase"] == "train"]
    assert [r["version"] for r in rows] == [1, 2]
    assert all(r["time_teacher_wait_s"] == 0.0 and r["teacher"] is None for r in rows)
    assert all(r["on_policy"] for r in rows)
    trajs = read_trajectories(result.run_dir / "trajectories.jsonl")
    # Each cycle's four episodes, two of each task, sampled by the version it trained.
    assert [t.policy_version for t in trajs] == [0] * 4 + [1] * 4
    assert trajs[0].task_id == trajs[1].task_id != trajs[2].task_id
    assert not events(result.run_dir, "teacher_connected")


@pytest.mark.parametrize(("sections", "teacher", "words"), [
    ({"rollout": {"group_size": None}}, None, "set rollout.group_size >= 2 or reward_baseline"),
    ({"loss": {"use_task_rewards": True}}, None, "remove use_task_rewards"),
    ({"loss": {"temperature": 0.5}}, None, "set both to the same value"),
    ({}, "toy", "remove the teacher section"),
])
def test_a_recipe_that_cannot_be_an_rl_run_is_refused_with_one_line(tmp_path, sections,
                                                                     teacher, words):
    from tests.toy_kit import TEACHER

    with pytest.raises((ConfigError, ValueError), match=words):
        make_recipe("rl", tmp_path, teacher=TEACHER if teacher else None,
                    sections={"rollout": {"group_size": 2}, **sections})


def test_the_batch_baseline_needs_no_groups(tmp_path):
    recipe = make_recipe("rl", tmp_path, teacher=None,
                         sections={"loss": {"reward_baseline": "batch"}})
    assert recipe.rollout.group_size is None and recipe.run.mode == "rl"
