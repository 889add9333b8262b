"""Token-budgeted micro-batches and gradient checkpointing (docs/gpu.md, "The memory plan").

Users rely on: ``train.micro_batch_tokens`` packs whole trajectories, in order, under a
padded-token budget, and the step it takes equals the one-micro-batch step (the loss is
normalised over the whole step); a budget that holds everything changes nothing, bit for
bit; ``train.gradient_checkpointing`` recomputes instead of keeping activations and gives
the same update.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from miniverl.common.recipe_sections import LossConfig, TrainConfig
from miniverl.common.trajectory import Span, SpanType, Trajectory
from miniverl.student.train.policy import load_policy
from miniverl.student.train.updates import first_micro_batch, sft_step, token_micro_batches
from tests.toy_kit import make_recipe

torch.set_num_threads(1)


@given(st.lists(st.integers(1, 50), max_size=30), st.integers(1, 200))
def test_packing_keeps_order_and_the_budget(lengths, budget):
    parts = token_micro_batches(lengths, budget)
    assert [i for part in parts for i in part] == list(range(len(lengths)))
    for part in parts:
        padded = len(part) * max(lengths[i] for i in part)
        assert padded <= budget or len(part) == 1  # one long trajectory may pass it
    # Greedy: the next trajectory would not have fitted in the part before it.
    for before, after in zip(parts, parts[1:], strict=False):
        grown = list(before) + [after[0]]
        assert (len(grown) * max(lengths[i] for i in grown)) > budget


def test_first_micro_batch_follows_the_budget():
    assert first_micro_batch([10, 10, 30, 5], TrainConfig(micro_batch_tokens=40)) == range(0, 2)
    assert first_micro_batch([10, 10, 30, 5], TrainConfig(grad_accum=2)) == range(0, 2)
    assert first_micro_batch([10, 10, 30, 5], TrainConfig()) == range(0, 4)


def _trajs(vocab: int) -> list[Trajectory]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i, n in enumerate((12, 20, 9, 16, 14)):
        tokens = torch.randint(1, vocab, (n,), generator=g).tolist()
        out.append(Trajectory(
            id=f"t{i}", tokens=tokens, tokenizer_fp="fp", environment="calculator",
            task_id=f"k{i}", policy_version=0,
            spans=[Span(type=SpanType.USER, start=0, end=4),
                   Span(type=SpanType.ASSISTANT_FINAL, start=4, end=n)]))
    return out


def _step(tmp_path, *, checkpointing=None, **train):
    recipe = make_recipe("sft", tmp_path, gradient_checkpointing=checkpointing)
    torch.manual_seed(0)
    policy = load_policy(recipe, offline=True)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    trajs = _trajs(policy.vocab_size)
    for _ in range(2):
        stats = sft_step(policy, optimizer, scheduler, trajs, loss=LossConfig(chunk_size=7),
                         train=TrainConfig(**train))
    return {k: v.detach().clone() for k, v in policy.model.named_parameters()}, stats


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return _step(tmp_path_factory.mktemp("base"))


def test_a_budget_that_holds_everything_changes_nothing(tmp_path, baseline):
    params, stats = _step(tmp_path, micro_batch_tokens=5 * 20)
    assert all(torch.equal(params[k], baseline[0][k]) for k in params)
    assert stats.loss == baseline[1].loss


def test_token_micro_batches_give_the_one_batch_step(tmp_path, baseline):
    # 40 tokens: parts of 2, 1, 2 trajectories; the loss is divided by the step's positions.
    params, stats = _step(tmp_path, micro_batch_tokens=40)
    for k in params:
        torch.testing.assert_close(params[k], baseline[0][k], rtol=1e-4, atol=1e-5)
    assert stats.loss == pytest.approx(baseline[1].loss, rel=1e-5)
    assert stats.positions == baseline[1].positions


def test_gradient_checkpointing_gives_the_same_step(tmp_path, baseline):
    params, stats = _step(tmp_path, checkpointing=True, micro_batch_tokens=40)
    for k in params:
        torch.testing.assert_close(params[k], baseline[0][k], rtol=1e-4, atol=1e-5)
    assert stats.loss == pytest.approx(baseline[1].loss, rel=1e-5)


def test_gradient_checkpointing_is_on_in_training_forwards_only(tmp_path):
    recipe = make_recipe("sft", tmp_path, gradient_checkpointing=True)
    policy = load_policy(recipe, offline=True)
    layers = [m for m in policy.model.modules() if getattr(m, "gradient_checkpointing", False)]
    assert layers  # every decoder layer recomputes in backward
    # A no-grad forward (the rollouts') keeps its KV cache.
    with torch.inference_mode():
        out = policy.model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    assert out.past_key_values is not None
    copy.deepcopy(policy.model)  # the checkpointed model still copies (the early forward's)


def _saved_tensors(model) -> int:
    count = 0

    def pack(tensor):
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=torch.tensor([[1, 2, 3, 4, 5, 6]])).logits.sum().backward()
    return count


def test_gradient_checkpointing_keeps_fewer_activations_in_a_training_forward(tmp_path):
    # On every supported transformers (4.56 names it gradient_checkpointing_enable, 5.x
    # activation_checkpointing_enable): a forward that records gradients keeps only each
    # layer's input, not its activations.
    plain = load_policy(make_recipe("sft", tmp_path / "a"), offline=True).model
    checkpointed = load_policy(
        make_recipe("sft", tmp_path / "b", gradient_checkpointing=True), offline=True).model
    assert _saved_tensors(checkpointed) < _saved_tensors(plain) / 2
