"""The objective package: chunked equals unchunked, micro-batches add up to one batch,
all-masked gives 0 with a valid gradient, no chunk ever holds every position's logits
(CPU, float64), and the table has one objective for every loss the recipe allows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_losses import DT, _logits, _topk_targets

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import LossConfig
from miniverl.student.train.objectives import (
    OBJECTIVES,
    CrossEntropy,
    TeacherTargets,
    bucketed_topk_tail_divergence_P,
    exact_divergence_P,
    objective_for,
    request_kind,
)

torch.set_num_threads(1)


def loss_section(**values):
    """A ``loss`` section with ``values``, unvalidated, so a value the recipe refuses
    reaches the table (whose refusal these tests check too)."""
    return LossConfig.model_construct(**values)


def distillation_loss(hidden_P_H, lm_head, targets, config, *, num_global_positions=None):
    """The recipe's objective over the positions (the pick a run makes once, then its loss)."""
    return objective_for(config).loss(hidden_P_H, lm_head, targets,
                                      num_global_positions=num_global_positions)


def sft_loss(hidden_P_H, lm_head, target_ids_P, *, chunk_size=1024, num_global_positions=None):
    """The SFT objective (the next token is the target) over the positions."""
    return CrossEntropy(LossConfig(chunk_size=chunk_size)).loss(
        hidden_P_H, lm_head, TeacherTargets(sampled_ids_P=target_ids_P),
        num_global_positions=num_global_positions)


# -- chunked driver and dispatcher ---------------------------------------------------------------------


def _head(h=6, v=11, seed=50):
    torch.manual_seed(seed)
    return torch.nn.Linear(h, v, bias=False).to(DT)


def _grads(head, hidden):
    return [hidden.grad.clone(), head.weight.grad.clone()]


@pytest.mark.parametrize("objective", ["exact_full_vocab", "bucketed_topk_tail"])
@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd"])
def test_chunked_equals_unchunked_in_value_and_gradient(objective, divergence):
    p, v = 13, 11
    head = _head(v=v)
    hidden = torch.randn(p, 6, dtype=DT, generator=torch.Generator().manual_seed(1))
    tl = _logits(p, v, 51)
    ids, top, tail = _topk_targets(tl, 4)
    targets = TeacherTargets(
        sampled_ids_P=torch.zeros(p, dtype=torch.long),
        topk_ids_P_K=ids,
        topk_logprobs_P_K=top,
        tail_logmass_P=tail,
        logprobs_P_V=F.log_softmax(tl, -1),
    )
    results = []
    for chunk in (p, 4, 1):
        head.zero_grad()
        h = hidden.clone().requires_grad_(True)
        cfg = loss_section(objective=objective, divergence=divergence, chunk_size=chunk)
        loss, metrics = distillation_loss(h, head, targets, cfg)
        loss.backward()
        results.append((loss.detach(), _grads(head, h), metrics["divergence"]))
    ref_loss, ref_grads, ref_div = results[0]
    for loss, grads, div in results[1:]:
        assert torch.allclose(loss, ref_loss, atol=1e-12)
        assert math.isclose(div, ref_div, abs_tol=1e-12)
        for g, rg in zip(grads, ref_grads, strict=True):
            assert torch.allclose(g, rg, atol=1e-12)
    # The unchunked reference is the plain mean of the per-position divergence.
    with torch.no_grad():
        logits = head(hidden)
        if objective == "exact_full_vocab":
            ref = exact_divergence_P(logits, F.log_softmax(tl, -1), divergence=divergence)
        else:
            ref = bucketed_topk_tail_divergence_P(
                logits, ids, top, tail, divergence=divergence, tail_epsilon=1e-6
            )
    assert torch.allclose(ref_loss, ref.mean(), atol=1e-12)


def test_global_normalisation_makes_micro_batches_add_up():
    # Two micro-batches normalised by the global count give the full batch's gradient.
    p, v = 10, 11
    head = _head(v=v)
    hidden = torch.randn(p, 6, dtype=DT)
    y = torch.randint(0, v, (p,))
    head.zero_grad()
    full, _ = sft_loss(hidden, head, y, chunk_size=3)
    full.backward()
    full_grad = head.weight.grad.clone()
    head.zero_grad()
    total = 0.0
    for part in (slice(0, 3), slice(3, 10)):
        loss, _ = sft_loss(hidden[part], head, y[part], chunk_size=3, num_global_positions=p)
        loss.backward()
        total += loss.item()
    assert math.isclose(total, full.item(), rel_tol=1e-12)
    assert torch.allclose(head.weight.grad, full_grad, atol=1e-12)


@pytest.mark.parametrize("estimator", ["full", "sampled_token"])
def test_all_masked_gives_zero_with_a_valid_gradient(estimator):
    # A micro-batch with no selected positions must still backward() cleanly.
    head = _head()
    hidden = torch.zeros(0, 6, dtype=DT, requires_grad=True)
    targets = TeacherTargets(
        sampled_ids_P=torch.zeros(0, dtype=torch.long),
        target_logprobs_P=torch.zeros(0, dtype=DT),
        topk_ids_P_K=torch.zeros(0, 4, dtype=torch.long),
        topk_logprobs_P_K=torch.zeros(0, 4, dtype=DT),
        tail_logmass_P=torch.zeros(0, dtype=DT),
    )
    cfg = loss_section(estimator=estimator, divergence="reverse_kl")
    loss, metrics = distillation_loss(hidden, head, targets, cfg, num_global_positions=0)
    loss.backward()
    assert loss.item() == 0.0 and metrics["divergence"] == 0.0
    assert head.weight.grad is not None and torch.equal(
        head.weight.grad, torch.zeros_like(head.weight)
    )


def test_dispatcher_sampled_token_and_errors():
    head = _head()
    hidden = torch.randn(5, 6, dtype=DT)
    sampled = torch.tensor([1, 2, 3, 4, 5])
    targets = TeacherTargets(sampled_ids_P=sampled, target_logprobs_P=torch.full((5,), -2.0))
    loss, metrics = distillation_loss(
        hidden, head, targets, loss_section(estimator="sampled_token", divergence="reverse_kl")
    )
    logp = F.log_softmax(head(hidden), -1).gather(-1, sampled[:, None]).squeeze(-1)
    assert math.isclose(metrics["divergence"], (logp + 2.0).mean().item(), rel_tol=1e-9)
    assert torch.isfinite(loss)
    with pytest.raises(ConfigError, match="reverse_kl"):
        distillation_loss(hidden, head, targets, loss_section(estimator="sampled_token"))
    with pytest.raises(ConfigError, match="kind 'exact'"):
        distillation_loss(hidden, head, targets, loss_section(objective="exact_full_vocab"))
    with pytest.raises(ConfigError, match="loss.objective"):
        distillation_loss(hidden, head, targets, loss_section(objective="nope"))


def test_targets_from_wire_arrays():
    import numpy as np

    arrays = {
        "ids": np.array([[1, 2]], dtype=np.int32),
        "logprobs": np.log(np.array([[0.5, 0.25]], dtype=np.float32)),
        "tail_logmass": np.log(np.array([0.25], dtype=np.float32)),
        "target_logprobs": np.array([-1.0], dtype=np.float32),
    }
    targets = TeacherTargets.from_arrays(arrays, np.array([2]), kind="topk")
    assert targets.topk_ids_P_K.tolist() == [[1, 2]] and targets.logprobs_P_V is None



def test_chunks_never_hold_all_positions_logits():
    # Memory property: neither forward nor backward materialises [P, V] logits at once,
    # and autograd keeps no per-chunk logits alive between forward and backward.
    p, v, chunk = 12, 11, 4
    head = _head(v=v)
    seen_rows = []

    def recording_head(h):
        out = head(h)
        seen_rows.append(out.shape[0])
        return out

    saved_shapes = []

    def pack(t):
        saved_shapes.append(tuple(t.shape))
        return t

    hidden = torch.randn(p, 6, dtype=DT, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = sft_loss(
            hidden, recording_head, torch.zeros(p, dtype=torch.long), chunk_size=chunk
        )
    loss.backward()
    assert seen_rows and max(seen_rows) <= chunk
    assert len(seen_rows) == 2 * math.ceil(p / chunk)  # forward + recomputation in backward
    assert not any(len(s) == 2 and s[-1] == v for s in saved_shapes)


# -- the table ------------------------------------------------------------------------------------


def _allowed_losses():
    """Every (estimator, objective, divergence) the recipe schema accepts."""
    from typing import get_args

    from miniverl.common.recipe_sections import LossConfig

    values = {name: get_args(LossConfig.model_fields[name].annotation)
              for name in ("estimator", "objective", "divergence")}
    return [(e, o, d) for e in values["estimator"] for o in values["objective"]
            for d in values["divergence"] if e == "full" or d == "reverse_kl"]


def test_every_loss_the_recipe_allows_has_exactly_one_row():
    # A recipe value the schema accepts must pick an objective, and the table must hold
    # no row a recipe cannot reach.
    allowed = _allowed_losses()
    assert sorted(OBJECTIVES) == sorted(allowed)
    for estimator, objective, divergence in allowed:
        cfg = loss_section(estimator=estimator, objective=objective, divergence=divergence)
        assert objective_for(cfg) == OBJECTIVES[(estimator, objective, divergence)](cfg)


@pytest.mark.parametrize("key", sorted(OBJECTIVES))
def test_each_objective_reads_what_its_target_kind_carries(key):
    # The fields an objective reads are exactly those the requested kind fills (plus the
    # sampled token), so a recipe never asks the teacher for targets its loss cannot use.
    estimator, objective, divergence = key
    cfg = loss_section(estimator=estimator, objective=objective, divergence=divergence)
    kind = request_kind(cfg)
    arrays = {"ids": np.zeros((2, 3), np.int32), "logprobs": np.zeros((2, 3), np.float32),
              "tail_logmass": np.zeros(2, np.float32),
              "target_logprobs": np.zeros(2, np.float32)}
    if kind == "exact":
        arrays = {"logprobs": np.zeros((2, 5), np.float32),
                  "target_logprobs": np.zeros(2, np.float32)}
    targets = TeacherTargets.from_arrays(arrays, np.array([1, 2]), kind=kind)
    picked = OBJECTIVES[key](cfg)
    picked.check(targets)  # every field it reads is there
    assert {name for name in picked.reads if getattr(targets, name) is not None} == set(
        picked.reads)
    assert kind == ("exact" if objective == "exact_full_vocab" else "topk") == picked.kind


def test_a_missing_field_names_it_and_the_kind_that_carries_it():
    head = _head()
    hidden = torch.randn(3, 6, dtype=DT)
    targets = TeacherTargets(sampled_ids_P=torch.tensor([1, 2, 3]))
    with pytest.raises(ConfigError, match=r"needs teacher ids \[P, K\].*'topk' for bucketed"):
        distillation_loss(hidden, head, targets, loss_section())
    with pytest.raises(ConfigError, match="target_logprobs"):
        distillation_loss(hidden, head, targets,
                          loss_section(estimator="sampled_token", divergence="reverse_kl"))
    with pytest.raises(ConfigError, match="loss.divergence='nope'"):
        distillation_loss(hidden, head, targets, loss_section(divergence="nope"))
    with pytest.raises(ConfigError, match="loss.estimator='nope'"):
        distillation_loss(hidden, head, targets, loss_section(estimator="nope"))


def test_sft_trains_at_temperature_one_and_reads_only_the_next_token():
    # SFT's target is the data: loss.temperature tempers distillation targets only.
    p, v = 6, 11
    head = _head(v=v)
    hidden = torch.randn(p, 6, dtype=DT)
    y = torch.randint(0, v, (p,))
    sft = CrossEntropy(LossConfig(temperature=2.0, chunk_size=4))
    assert sft.reads == ("sampled_ids_P",)
    loss, metrics = sft.loss(hidden, head, TeacherTargets(sampled_ids_P=y))
    ref = F.cross_entropy(head(hidden), y)
    assert torch.allclose(loss, ref, atol=1e-12)
    assert math.isclose(metrics["divergence"], ref.item(), rel_tol=1e-12)
