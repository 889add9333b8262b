"""The loss variants in the trainer (toy models in process, CPU, deterministic): a
strict OPD run with the sampled-token estimator's ratio and clamp, per-sequence
aggregation and a task reward trains on the sampling log-probs its episodes recorded
(so on-policy its ratio is 1 up to float32 rounding), and its update does not depend
on how the step is split into micro-batches, because the baselines read the whole step
(the toy's episodes all have the same length, so the per-sequence weights are 1 here;
test_aggregation_and_reward.py has unequal ones)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from miniverl.common.trajectory import read_trajectories
from miniverl.student.train.policy import load_policy
from miniverl.student.train.trainer import Trainer
from tests.student.train.trainer_kit import parameters
from tests.toy_kit import make_recipe

torch.set_num_threads(1)

VARIANTS = {"estimator": "sampled_token", "divergence": "reverse_kl",
            "importance_ratio_cap": 2.0, "log_ratio_clamp": 10.0, "aggregation": "sequence",
            "use_task_rewards": True, "reward_baseline": "batch",
            "distillation_loss_coef": 0.5}


def _train(recipe, client):
    with Trainer(recipe, client=client, show_progress=False, write_report=False) as trainer:
        trainer.train()
        return trainer, parameters(trainer)


def test_variants_train_on_the_recorded_sampling_logprobs(tmp_path, toy):
    recipe = make_recipe("opd", tmp_path, cycles=1, sections={"loss": VARIANTS})
    trainer, _ = _train(recipe, toy.fake_client())
    (path,) = tmp_path.glob("*/trajectories.jsonl")
    trajs = read_trajectories(path)
    assert trajs and all(t.sampling_logprobs is not None for t in trajs)
    # The recorded q(y) is the log-prob the sampling version gave each sampled token: a
    # full forward of the starting weights (version 0, loaded again) gives it back.
    model = load_policy(recipe, offline=True).model.eval()
    for traj in trajs:
        positions_P = traj.target_positions()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([traj.tokens])).logits[0]
        next_P = torch.tensor(traj.tokens)[positions_P + 1]
        forward = F.log_softmax(logits.float(), -1)[positions_P].gather(-1, next_P[:, None])
        assert np.allclose(traj.sampling_logprobs_at(positions_P), forward.squeeze(-1).numpy(),
                           atol=1e-4), traj.id
    assert trainer.state.version == 1


def _close(a: list, b: list) -> bool:
    return all(torch.allclose(x, y, rtol=0, atol=1e-5) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_micro_batches_do_not_change_the_update(tmp_path, toy):
    def run(accum, **loss):
        recipe = make_recipe("opd", tmp_path / f"{accum}{loss}", cycles=2, grad_accum=accum,
                             sections={"loss": {**VARIANTS, **loss}})
        return _train(recipe, toy.fake_client())[1]

    one, four = run(1), run(4)
    # Four micro-batches sum in another order than one: equal up to float32 rounding.
    assert _close(one, four)
    # The tolerance is far below what the reward term's weight moves.
    assert not _close(one, run(1, distillation_loss_coef=1.0))


@pytest.mark.slow
def test_a_group_baseline_finds_each_tasks_episodes_in_the_update(tmp_path, toy):
    # rollout.group_size 2: every task of a batch is played twice, so each episode has a
    # peer for its leave-one-out baseline (an episode without one would stop the run).
    recipe = make_recipe("opd", tmp_path, cycles=1, sections={
        "loss": {"use_task_rewards": True}, "rollout": {"group_size": 2}})
    trainer, _ = _train(recipe, toy.fake_client())
    assert trainer.state.version == 1
    (path,) = tmp_path.glob("*/trajectories.jsonl")
    tasks = [t.task_id for t in read_trajectories(path)]
    assert all(tasks.count(task) == 2 for task in tasks)


@pytest.mark.slow
def test_replay_weighs_its_older_tokens_by_a_ratio_away_from_one(tmp_path, toy, monkeypatch):
    # Replay trains on episodes of older versions: there the weight is not 1, and it
    # never exceeds the cap.
    from miniverl.student.train.objectives import formulas

    seen: list[torch.Tensor] = []
    real = formulas.truncated_ratio_P

    def spy(logp_P, sampling_logprobs_P, cap):
        weight_P = real(logp_P, sampling_logprobs_P, cap)
        seen.append(weight_P.detach().clone())
        return weight_P

    monkeypatch.setattr(formulas, "truncated_ratio_P", spy)
    loss = {"estimator": "sampled_token", "divergence": "reverse_kl", "importance_ratio_cap": 1.5}
    recipe = make_recipe("replay", tmp_path, cycles=3, max_lag=1, updates_per_batch=2,
                         sections={"loss": loss})
    _train(recipe, toy.fake_client())
    weights = torch.cat(seen)
    assert (weights <= 1.5).all()
    assert (weights - 1).abs().max() > 1e-3
