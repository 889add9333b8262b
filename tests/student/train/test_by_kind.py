"""A run whose routed teachers do not share a tokenizer (docs/several-teachers.md,
"Teachers with another tokenizer"): its kind is ``mixed``, and each episode is trained
on by the objective of its own targets' kind, the one a run of that teacher alone picks.
The step's loss and gradient are those of every episode's own objective over its own
positions, summed and divided by the step's positions."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe
from miniverl.common.recipe_sections import LossConfig
from miniverl.student.train.objectives.by_kind import ByKind, kind_parts
from miniverl.student.train.objectives.table import objective_for_kind, run_kind
from miniverl.student.train.teacher.link import Scored
from tests.toy_kit import recipe_dict

V, H = 11, 6
LOSS = LossConfig(estimator="sampled_token", divergence="reverse_kl", chunk_size=3)


def _episode(i: int, kind: str, n: int, rng: np.random.Generator) -> Scored:
    tokens = rng.integers(0, V, size=n + 2)
    positions = np.arange(1, n + 1, dtype=np.int32)
    target = rng.normal(-2.0, 0.5, size=n).astype(np.float32)
    if kind == "topk":
        ids = rng.integers(0, V, size=(n, 2)).astype(np.int32)
        arrays = {"ids": ids, "logprobs": np.full((n, 2), -1.0, np.float32),
                  "tail_logmass": np.full(n, -1.0, np.float32), "target_logprobs": target}
    else:  # xvocab: groups of one and two positions
        first = np.array([1 if j % 3 != 1 else 0 for j in range(n)], dtype=np.int32)
        first[0] = 1
        arrays = {"target_logprobs": target, "group_first": first}
    return Scored(NS(id=f"t{i}", tokens=tokens), positions, arrays, 0, {}, kind)


def _batch():
    rng = np.random.default_rng(0)
    return [_episode(0, "topk", 3, rng), _episode(1, "xvocab", 5, rng),
            _episode(2, "topk", 2, rng), _episode(3, "xvocab", 4, rng)]


def test_kind_parts_hold_each_kinds_episodes_and_rows():
    parts = kind_parts(_batch())
    assert [(k, rows.tolist(), eps) for k, rows, eps in parts] == [
        ("topk", [0, 1, 2, 8, 9], [0, 2]), ("xvocab", [3, 4, 5, 6, 7, 10, 11, 12, 13], [1, 3])]
    with pytest.raises(ConfigError, match="carry no kind"):
        kind_parts([Scored(NS(id="x", tokens=[0, 1]), np.zeros(1, np.int32), {}, 0, {})])


def test_a_mixed_step_is_each_episode_by_its_own_objective():
    objective = objective_for_kind(LOSS, "mixed")
    assert isinstance(objective, ByKind) and set(objective.objectives) == {"topk", "xvocab"}
    alone = {"topk": objective_for_kind(LOSS, "topk"), "xvocab": objective_for_kind(LOSS, "xvocab")}
    assert "xvocab group sampled_token" in objective.name
    torch.manual_seed(0)
    head = torch.nn.Linear(H, V)
    scored = _batch()
    total = sum(len(s.positions_P) for s in scored) + 7  # the step holds another micro-batch
    hidden = torch.randn(total - 7, H, requires_grad=True)

    assert objective.kind == "mixed"
    loss, metrics = objective.batch_loss(hidden, head, scored, None, num_global_positions=total)
    loss.backward()
    grad, head_grad = hidden.grad.clone(), head.weight.grad.clone()

    # Each episode alone, by its own kind's objective over its own rows of the hidden
    # states, divided by the same step's positions.
    hidden.grad, head.weight.grad = None, None
    offsets = np.cumsum([0, *(len(s.positions_P) for s in scored)])
    ref, div_sum = 0.0, 0.0
    for s, lo, hi in zip(scored, offsets[:-1], offsets[1:], strict=True):
        part, m = alone[s.kind].batch_loss(hidden[lo:hi], head, [s], None,
                                           num_global_positions=total)
        ref, div_sum = ref + part, div_sum + m["divergence_sum"]
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-6)
    assert torch.allclose(grad, hidden.grad, atol=1e-6)
    assert torch.allclose(head_grad, head.weight.grad, atol=1e-6)
    assert metrics["positions"] == 14 and metrics["divergence_sum"] == pytest.approx(div_sum)
    # Targets that carry no kind are refused by name, not read as one kind.
    plain = Scored(scored[0].traj, scored[0].positions_P, scored[0].arrays, 0, {})
    with pytest.raises(ConfigError, match="carry no kind"):
        objective.batch_loss(hidden[:3], head, [plain], None)


def test_an_empty_mixed_micro_batch_still_backwards():
    head = torch.nn.Linear(H, V)
    hidden = torch.zeros(0, H, requires_grad=True)
    loss, metrics = objective_for_kind(LOSS, "mixed").batch_loss(hidden, head, [], None)
    loss.backward()
    assert float(loss.detach()) == 0.0 and metrics["positions"] == 0.0
    assert head.weight.grad is not None


def _routed(tmp_path, calc: str | None, nav: str | None, **loss):
    data = recipe_dict("opd", tmp_path)
    teacher = data.pop("teacher")
    del data["environment"]
    data["teachers"] = {"calc": {**teacher, "tokenizer": calc}, "nav": {**teacher, "tokenizer": nav}}
    data["environments"] = [{"name": "calculator", "teacher": "calc"},
                            {"name": "jsonnav", "teacher": "nav"}]
    data["loss"] = {**data.get("loss", {}), **loss}
    return Recipe.model_validate(data)


def test_the_run_kind_is_its_teachers_one_kind_or_mixed(tmp_path):
    sampled = {"estimator": "sampled_token", "divergence": "reverse_kl"}
    assert run_kind(_routed(tmp_path, None, None)) == "topk"
    assert run_kind(_routed(tmp_path, "other", "other", **sampled)) == "xvocab"
    assert run_kind(_routed(tmp_path, None, "other", **sampled)) == "mixed"
    full = _routed(tmp_path, "same", "other", cross_vocab="uld")
    assert run_kind(full) == "mixed"
    picked = objective_for_kind(full.loss, "mixed")
    assert picked.objectives["xvocab"].name == "xvocab group uld"
    assert picked.objectives["topk"].name == "bucketed_topk_tail forward_kl"


def test_a_mixed_run_keeps_no_targets_cache(tmp_path):
    # xvocab targets are not cached yet (docs/cross-tokenizer.md), so a run whose routes
    # give both kinds keeps none either, while one of token-id targets does.
    from miniverl.common.rundir import RunDir
    from miniverl.student.train.cached_targets import open_cache

    recipe = _routed(tmp_path, None, None)
    policy = NS(tokenizer_fp="sha256:" + "a" * 64, vocab_size=V)
    run = RunDir.create(tmp_path / "runs", recipe, run_id="mixed-cache")
    assert open_cache(recipe, run, policy, "mixed") is None
    assert open_cache(recipe, run, policy, "xvocab") is None
    assert open_cache(recipe, run, policy, "topk") is not None
