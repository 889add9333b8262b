"""Per-sequence aggregation and the task-reward term against closed forms (CPU,
float64): equal-length episodes aggregate per sequence exactly as per token, unequal
ones to the mean of their means; leave-one-out baselines; the reward term's gradient
is REINFORCE's; the composed objective chunks like any other; the step's inputs read
the whole step and name what is missing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_losses import DT, _logits

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import LossConfig
from miniverl.common.trajectory import Span, SpanType, Trajectory, VerifierResult
from miniverl.student.train.objectives import TeacherTargets, objective_for
from miniverl.student.train.objectives.objective import given_logits
from miniverl.student.train.objectives.variants import (
    aggregation_weights,
    step_inputs,
    task_advantages,
)

torch.set_num_threads(1)
V = 9


def _head(h=5, seed=60):
    torch.manual_seed(seed)
    return torch.nn.Linear(h, V, bias=False).to(DT)


def _traj(task: str, n_model: int, score: float, seed: int, logq: list[float] | None = None):
    tokens = list(range(3)) + [(seed + i) % V for i in range(n_model)]
    return Trajectory(
        id=f"t/{task}/{seed}", tokens=tokens, tokenizer_fp="fp", environment="calculator",
        task_id=task, policy_version=0,
        spans=[Span(type=SpanType.USER, start=0, end=3),
               Span(type=SpanType.ASSISTANT_FINAL, start=3, end=3 + n_model)],
        verifier=VerifierResult(success=score == 1.0, score=score), sampling_logprobs=logq,
    )


# -- aggregation ------------------------------------------------------------------------------


def test_equal_lengths_weigh_one_under_both_rules():
    assert np.array_equal(aggregation_weights([4, 4, 4], "sequence"), np.ones(3))
    assert np.array_equal(aggregation_weights([4, 1, 9], "token"), np.ones(3))


def test_sequence_weights_give_the_mean_of_each_episodes_mean():
    counts = [1, 3, 0, 6]
    loss = [np.array([2.0]), np.array([1.0, 2.0, 6.0]), np.array([]), np.arange(6.0)]
    w = aggregation_weights(counts, "sequence")
    aggregated = sum((wi * li).sum() for wi, li in zip(w, loss, strict=True)) / sum(counts)
    # The empty episode counts for nothing, not as a zero.
    assert aggregated == pytest.approx(np.mean([li.mean() for li in loss if len(li)]))


def test_per_sequence_objective_of_equal_lengths_equals_per_token():
    # Two equal-length episodes: the rule changes nothing, through the real objective.
    hidden, head = torch.randn(8, 5, dtype=DT, generator=torch.Generator().manual_seed(1)), _head()
    trajs = [_traj("a", 4, 1.0, 0), _traj("b", 4, 0.0, 1)]
    positions = [np.arange(2, 6), np.arange(2, 6)]
    ids = torch.tensor(sum((t.tokens[3:] for t in trajs), []))
    teacher = F.log_softmax(_logits(8, V, 9), -1).gather(-1, ids[:, None]).squeeze(-1)
    targets = TeacherTargets(sampled_ids_P=ids, target_logprobs_P=teacher)
    losses = {}
    for rule in ("token", "sequence"):
        s = LossConfig(estimator="sampled_token", divergence="reverse_kl", aggregation=rule,
                         chunk_size=3)
        full = targets.with_inputs(step_inputs(trajs, positions, s), "cpu")
        losses[rule] = objective_for(s).loss(hidden, head, full)[0]
    assert torch.allclose(losses["token"], losses["sequence"], atol=1e-12)


# -- task reward ---------------------------------------------------------------------------


def test_baselines_leave_the_episode_itself_out():
    r = [1.0, 0.0, 0.0, 1.0, 1.0]
    groups = ["a", "a", "a", "b", "b"]
    assert np.allclose(task_advantages(r, groups, "group"), [1.0, -0.5, -0.5, 0.0, 0.0])
    assert np.allclose(task_advantages(r, groups, "batch"),
                       [1 - 2 / 4, 0 - 3 / 4, 0 - 3 / 4, 1 - 2 / 4, 1 - 2 / 4])
    with pytest.raises(ConfigError, match="task 'c' has 1 episode.*rollout.group_size >= 2"):
        task_advantages([1.0, 0.0, 1.0], ["a", "a", "c"], None)


def test_reward_term_gradient_is_reinforce():
    # use_task_rewards with coefficient 0 leaves the reward term alone: its gradient must
    # be -(1/N) sum_s A_s sum_{t in s} grad log S(y_t) (REINFORCE over the episodes).
    logits = _logits(5, V, 11).requires_grad_(True)
    ids = torch.tensor([1, 4, 4, 0, 8])  # rows 0-1: the success, 2-4: the failure
    trajs = [_traj("a", 2, 1.0, 0), _traj("a", 3, 0.0, 1)]
    s = LossConfig(use_task_rewards=True, distillation_loss_coef=0.0, objective="exact_full_vocab")
    adv = step_inputs(trajs, [np.arange(2, 4), np.arange(2, 5)], s)
    advantage = torch.from_numpy(np.concatenate([a["advantage_P"] for a in adv]))
    assert advantage.tolist() == [1.0, 1.0, -1.0, -1.0, -1.0]
    objective = objective_for(s)
    teacher = F.log_softmax(_logits(5, V, 12), -1)
    targets = TeacherTargets(sampled_ids_P=ids, logprobs_P_V=teacher, advantage_P=advantage)
    loss_C, _ = objective.per_position(logits, given_logits, targets)
    (loss_C.sum() / 5).backward()
    soft = F.softmax(logits.detach(), -1)
    closed = -(advantage[:, None] * (F.one_hot(ids, V) - soft)) / 5
    assert torch.allclose(logits.grad, closed, atol=1e-12)


def test_reward_and_distillation_add_with_the_coefficient_and_chunk_like_any_objective():
    hidden, head = torch.randn(6, 5, dtype=DT, generator=torch.Generator().manual_seed(2)), _head()
    ids = torch.tensor([0, 1, 2, 3, 4, 5])
    teacher = F.log_softmax(_logits(6, V, 13), -1)
    adv = torch.tensor([0.5, 0.5, 0.5, -0.5, -0.5, -0.5], dtype=DT)
    base = LossConfig(objective="exact_full_vocab", divergence="reverse_kl", chunk_size=2)
    both = LossConfig(objective="exact_full_vocab", divergence="reverse_kl", chunk_size=2,
                        use_task_rewards=True, distillation_loss_coef=0.25)
    only_reward = LossConfig(objective="exact_full_vocab", divergence="reverse_kl",
                               chunk_size=6, use_task_rewards=True, distillation_loss_coef=0.0)
    targets = TeacherTargets(sampled_ids_P=ids, logprobs_P_V=teacher, advantage_P=adv)
    kl, m_kl = objective_for(base).loss(hidden, head, targets)
    total, m_total = objective_for(both).loss(hidden, head, targets)
    reward, _ = objective_for(only_reward).loss(hidden, head, targets)
    assert torch.allclose(total, 0.25 * kl + reward, atol=1e-12)
    assert m_total["divergence"] == pytest.approx(m_kl["divergence"])  # the figure stays the KL


# -- the step's inputs ------------------------------------------------------------------------


def test_step_inputs_gather_sampling_logprobs_at_the_positions():
    traj = _traj("a", 3, 1.0, 0, logq=[-0.5, -1.5, -2.5])
    s = LossConfig(estimator="sampled_token", divergence="reverse_kl", importance_ratio_cap=2.0)
    (fields,) = step_inputs([traj], [np.array([2, 4])], s)
    assert fields["sampling_logprobs_P"].tolist() == [-0.5, -2.5]  # tokens 3 and 5
    oracle = _traj("a", 3, 1.0, 0)
    with pytest.raises(ConfigError, match="recorded none.*remove importance_ratio_cap") as info:
        step_inputs([oracle], [np.array([2])], s)
    assert "\n" not in str(info.value)


def test_a_recipe_without_variants_adds_no_inputs():
    trajs = [_traj("a", 3, 1.0, 0)]
    assert step_inputs(trajs, [np.array([2, 3])], LossConfig()) == [{}]
