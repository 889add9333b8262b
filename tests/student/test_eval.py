"""Eval: greedy success on a held-out split, per difficulty, with saved trajectories."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from miniverl.common.recipe import Recipe  # noqa: E402
from miniverl.common.toy import build_toy_model, build_toy_tokenizer  # noqa: E402
from miniverl.common.trajectory import read_trajectories  # noqa: E402
from miniverl.student.eval import evaluate  # noqa: E402
from tests.toy_kit import FOUR_HEAD  # noqa: E402

torch.set_num_threads(1)
TINY = FOUR_HEAD


def _recipe(**eval_cfg):
    return Recipe.model_validate(
        {
            "run": {"name": "t", "mode": "sft"},
            "student": {"model": {"toy": TINY}, "lora": None},
            "environment": {"name": "calculator", "difficulty": "mixed", "eval_tasks": 4},
            "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 8, "max_total_tokens": 512},
            "eval": eval_cfg,
        }
    )


def test_eval_summarises_and_saves(tmp_path):
    tok = build_toy_tokenizer()
    model = build_toy_model(TINY, tok)
    recipe = _recipe(max_tasks=3)
    summary = evaluate(model, tok, recipe, split="eval", policy_version=2, out_dir=tmp_path)
    assert summary.n == 3 and 0.0 <= summary.success <= 1.0
    assert sum(d["n"] for d in summary.by_difficulty.values()) == 3
    assert sum(summary.stop_reasons.values()) == 3
    assert all(t.split == "eval" and t.policy_version == 2 for t in summary.trajectories)
    saved = read_trajectories(tmp_path / "eval-v2.trajectories.jsonl")
    assert [t.tokens for t in saved] == [t.tokens for t in summary.trajectories]
    data = json.loads((tmp_path / "eval-v2.summary.json").read_text())
    assert data["n"] == 3 and data["split"] == "eval"
    # Greedy eval is deterministic: the same weights give the same summary.
    again = evaluate(model, tok, recipe, split="eval", policy_version=2)
    assert [t.tokens for t in again.trajectories] == [t.tokens for t in saved]
    assert again.trajectories[0].tokenizer_fp.startswith("sha256:")
