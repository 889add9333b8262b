"""DPO: closed-form loss, pairing rules, training on pairs, and the trainer's dpo mode.

The reference is an in-process fake teacher (``miniverl.testing.FakeTeacherClient``)
serving a copy of the initial student, exactly what a teacher server serving the
initial student returns.
Training tests use hand-made pairs (an oracle trace vs the same trace with a wrong
final answer), because an untrained toy rarely yields a success and a failure of the
same task; the trainer test checks that pairs are built from rollouts and that tasks
without a pair are skipped and counted.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from miniverl.common.modeling import load_causal_lm
from miniverl.common.recipe import Recipe
from miniverl.common.trajectory import VerifierResult
from miniverl.student.environments import make_tasks
from miniverl.student.rollout.oracle import oracle_trajectory
from miniverl.student.train.modes.dpo import (
    PreferencePair,
    build_pairs,
    dpo_loss,
    dpo_step,
    pair_micro_batches,
    score_reference,
    sequence_logprobs,
)
from miniverl.student.train.optim import build_optimizer
from miniverl.student.train.policy import load_policy
from miniverl.student.train.teacher.link import TeacherLink
from miniverl.student.train.updates import build_scheduler
from miniverl.testing.fake_teacher import FakeTeacherClient
from tests.toy_kit import ONE_LAYER, make_recipe, seeded, toy_dir

TOY = seeded(ONE_LAYER, 0)


def _recipe(tmp_path, **train) -> Recipe:
    """DPO against a frozen copy of the student, 16 tasks, eight episodes a batch."""
    return make_recipe("dpo", tmp_path / "runs", student=TOY, teacher=TOY, cycles=2, **train,
                       sections={"run": {"name": "dpo-test", "deterministic": False},
                                 "environment": {"train_tasks": 16},
                                 "rollout": {"max_new_tokens_per_turn": 24, "batch_size": 8},
                                 "loss": None, "runtime": None,
                                 "dpo": {"beta": 0.5, "group_size": 2}})


def _reference_client(policy) -> FakeTeacherClient:
    ref = load_causal_lm(toy_dir(TOY), dtype="float32", device="cpu")
    return FakeTeacherClient(ref, policy.tokenizer_fp, policy.vocab_size, name="reference")


def _pairs(policy, n: int) -> list[PreferencePair]:
    """Oracle traces (chosen) vs the same trace answering a wrong number (rejected)."""
    tasks = make_tasks("calculator", "train", n, "easy", 0)
    pairs = []
    for task in tasks:
        good = oracle_trajectory("calculator", task, policy.tokenizer, policy.tokenizer_fp)
        wrong = dataclasses.replace(task, answer=str(int(float(task.answer)) + 7))
        bad = oracle_trajectory("calculator", wrong, policy.tokenizer, policy.tokenizer_fp)
        failed = VerifierResult(success=False, score=0.0, reason="wrong answer")
        bad = bad.model_copy(update={"verifier": failed})
        pairs.append(PreferencePair(good, bad))
    return pairs


# -- the loss, closed form ------------------------------------------------------------------


def test_dpo_loss_is_log2_when_policy_equals_reference():
    # Users read "loss 0.693" as "no preference learned yet"; that must hold exactly.
    logp = torch.tensor([-12.0, -3.5])
    loss_B, chosen_B, rejected_B = dpo_loss(logp, logp - 1.0, logp, logp - 1.0, beta=0.1)
    assert torch.allclose(loss_B, torch.full((2,), math.log(2.0)))
    assert torch.all(chosen_B == 0) and torch.all(rejected_B == 0)


def test_dpo_loss_matches_formula_and_prefers_chosen():
    pc, pr = torch.tensor([-5.0]), torch.tensor([-9.0])
    rc, rr = torch.tensor([-6.0]), torch.tensor([-8.0])
    loss_B, chosen_B, rejected_B = dpo_loss(pc, pr, rc, rr, beta=0.5)
    expected = -torch.nn.functional.logsigmoid(torch.tensor(0.5 * ((1.0) - (-1.0))))
    assert torch.allclose(loss_B, expected.reshape(1))
    assert float(chosen_B) == pytest.approx(0.5) and float(rejected_B) == pytest.approx(-0.5)
    # Raising the chosen log-prob lowers the loss: the gradient points the right way.
    pc = pc.clone().requires_grad_(True)
    dpo_loss(pc, pr, rc, rr, beta=0.5)[0].sum().backward()
    assert float(pc.grad) < 0


# -- pairing ---------------------------------------------------------------------------------


def test_build_pairs_pairs_success_with_failure_and_counts_skipped(tmp_path):
    policy = load_policy(_recipe(tmp_path))
    [a, b] = _pairs(policy, 2)
    ok_a, bad_a = a.chosen, a.rejected
    ok_b = b.chosen
    # Task A: one success and two failures -> one pair; task B: successes only -> skipped.
    pairs, skipped, tasks = build_pairs([bad_a, ok_a, bad_a, ok_b, ok_b])
    assert (len(pairs), skipped, tasks) == (1, 1, 2)
    assert pairs[0].chosen.verifier.success and not pairs[0].rejected.verifier.success
    assert pairs[0].chosen.task_id == pairs[0].rejected.task_id


# -- training on pairs -----------------------------------------------------------------------


def test_reference_scores_equal_the_initial_policy_log_probs(tmp_path):
    # The reference served by a teacher is the initial student: its summed target
    # log-probs must equal the student's own, so the first DPO loss is log 2.
    policy = load_policy(_recipe(tmp_path))
    pairs = _pairs(policy, 2)
    link = TeacherLink(_reference_client(policy), kind="topk", k=16, temperature=1.0)
    score_reference(link, pairs, version=0)
    assert link.k == 16  # the reference request's k=1 does not leak into distillation
    trajs = [t for p in pairs for t in (p.chosen, p.rejected)]
    with torch.no_grad():
        own = sequence_logprobs(policy, trajs, [t.target_positions() for t in trajs])
    ref = np.array([r for p in pairs for r in (p.ref_chosen, p.ref_rejected)])
    np.testing.assert_allclose(own.numpy(), ref, rtol=1e-4, atol=1e-3)


def test_dpo_honours_micro_batch_tokens_with_pairs_whole_and_the_same_step(tmp_path):
    # train.micro_batch_tokens bounds a DPO forward too: whole pairs per micro-batch,
    # within the budget, and the step is the one a single forward takes.
    recipe = _recipe(tmp_path, lr=3e-3)
    policies = [load_policy(recipe) for _ in range(2)]
    pairs = _pairs(policies[0], 4)
    for i, pair in enumerate(pairs):
        pair.ref_chosen, pair.ref_rejected = -20.0 - i, -18.0 + i
    longest = [max(len(p.chosen.tokens), len(p.rejected.tokens)) for p in pairs]
    budget = 2 * 2 * max(longest)  # two pairs at most
    parts = pair_micro_batches(pairs, grad_accum=1, micro_batch_tokens=budget)
    assert len(parts) >= 2 and [i for part in parts for i in part] == list(range(len(pairs)))
    assert all(2 * len(part) * max(longest[i] for i in part) <= budget for part in parts)
    steps = []
    for policy, tokens in zip(policies, (None, budget), strict=True):
        optimizer = build_optimizer(recipe, policy.trainable_parameters())
        steps.append(dpo_step(policy, optimizer, build_scheduler(recipe, optimizer), pairs,
                              beta=0.5, micro_batch_tokens=tokens))
    assert steps[1].loss == pytest.approx(steps[0].loss, rel=1e-5)
    assert steps[1].grad_norm == pytest.approx(steps[0].grad_norm, rel=1e-4)
    for whole, split in zip(policies[0].trainable_parameters(),
                            policies[1].trainable_parameters(), strict=True):
        # AdamW's first step moves each weight by about lr (3e-3): equal up to rounding.
        torch.testing.assert_close(split, whole, rtol=0, atol=1e-4)


@pytest.mark.slow
def test_dpo_steps_lower_the_loss_and_grow_the_margin(tmp_path):
    recipe = _recipe(tmp_path, lr=3e-3)
    policy = load_policy(recipe)
    torch.manual_seed(0)
    pairs = _pairs(policy, 4)
    link = TeacherLink(_reference_client(policy), kind="topk", k=16, temperature=1.0)
    score_reference(link, pairs, version=0)
    optimizer = build_optimizer(recipe, policy.trainable_parameters())
    scheduler = build_scheduler(recipe, optimizer)
    history = [dpo_step(policy, optimizer, scheduler, pairs, beta=0.5, grad_accum=2)
               for _ in range(6)]
    assert history[0].loss == pytest.approx(math.log(2.0), abs=1e-3)
    assert history[-1].loss < history[0].loss - 0.1
    assert history[-1].margin > history[0].margin + 0.2
    assert history[-1].accuracy == 1.0 and history[-1].pairs == 4


# -- the trainer's dpo mode ------------------------------------------------------------------


def _run_trainer(tmp_path, monkeypatch, *, succeed_every: int | None):
    from miniverl.student.rollout.runner import RolloutRunner
    from miniverl.student.train.trainer import Trainer

    recipe = _recipe(tmp_path)
    real_run = RolloutRunner.run

    def run(self, tasks, **kw):
        trajs = real_run(self, tasks, **kw)
        if succeed_every is None:
            return trajs
        # An untrained toy fails everything; mark some rollouts verified so that groups
        # hold both outcomes, as they do for a partly trained policy.
        return [
            t.model_copy(update={"verifier": VerifierResult(
                success=i % succeed_every == 0, score=float(i % succeed_every == 0), reason="")})
            for i, t in enumerate(trajs)
        ]

    monkeypatch.setattr(RolloutRunner, "run", run)
    probe = load_policy(recipe)
    with Trainer(recipe, client=_reference_client(probe), show_progress=False,
                 write_report=False, checkpoints=False) as trainer:
        result = trainer.train()
    run_dir = result.run_dir

    def rows(name):
        path = run_dir / name
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return result, rows("metrics.jsonl"), rows("events.jsonl")


@pytest.mark.slow
def test_trainer_dpo_mode_builds_pairs_from_rollouts(tmp_path, monkeypatch):
    result, metrics, _ = _run_trainer(tmp_path, monkeypatch, succeed_every=2)
    assert result.status == "completed" and result.steps == 2
    for row in metrics:
        assert row["mode"] == "dpo" and row["on_policy"] is False
        assert row["dpo_pairs"] == 2 and row["dpo_tasks_without_pair"] == 0
        for key in ("dpo_loss", "dpo_margin", "dpo_accuracy", "dpo_chosen_reward",
                    "dpo_rejected_reward"):
            assert math.isfinite(row[key])
    assert metrics[0]["dpo_loss"] == pytest.approx(math.log(2.0), abs=1e-3)


@pytest.mark.slow
def test_trainer_dpo_mode_skips_tasks_without_a_pair(tmp_path, monkeypatch):
    result, metrics, events = _run_trainer(tmp_path, monkeypatch, succeed_every=None)
    assert result.status == "completed" and result.steps == 0 and metrics == []
    skipped = [e for e in events if e["event"] == "dpo_no_pairs"]
    assert len(skipped) == 2 and all(e["tasks"] == 2 for e in skipped)
