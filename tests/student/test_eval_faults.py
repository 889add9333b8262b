"""Eval on an environment with faults: success on faulted and fault-free tasks, recovery rate.

The recovery benchmark's metrics come from this breakdown; an environment without
faults keeps its summary exactly as before (no ``faults`` key).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from miniverl.common.recipe import Recipe  # noqa: E402
from miniverl.common.toy import build_toy_model, build_toy_tokenizer  # noqa: E402
from miniverl.student.environments import make_tasks  # noqa: E402
from miniverl.student.eval import evaluate, summarize  # noqa: E402
from miniverl.student.rollout.oracle import oracle_trajectories  # noqa: E402
from tests.toy_kit import FOUR_HEAD  # noqa: E402

torch.set_num_threads(1)
PARAMS = {"units": False, "faults": 0.5}


def test_the_oracle_recovers_from_every_fault():
    tok = build_toy_tokenizer()
    tasks = make_tasks("calculator", "eval", 12, "easy", 0, params=PARAMS)
    trajs = oracle_trajectories("calculator", tasks, tok, "fp", PARAMS)
    faults = summarize(trajs, "eval", 0, tasks).to_dict()["faults"]
    n_faulted = sum(1 for t in tasks if t.data["fault"])
    assert 0 < n_faulted < 12
    assert faults["faulted"] == {"success": 1.0, "n": n_faulted}
    assert faults["fault_free"] == {"success": 1.0, "n": 12 - n_faulted}
    assert faults["recovery"] == {"rate": 1.0, "n_error_episodes": n_faulted,
                                  "n_recovered": n_faulted, "retry_rate": 1.0,
                                  "n_retried": n_faulted}
    # Without faults (or without the tasks) the summary has no fault breakdown.
    plain = make_tasks("calculator", "eval", 4, "easy", 0, params={"units": False})
    plain_trajs = oracle_trajectories("calculator", plain, tok, "fp", {"units": False})
    assert "faults" not in summarize(plain_trajs, "eval", 0, plain).to_dict()
    assert "faults" not in summarize(trajs, "eval", 0).to_dict()


def test_evaluate_writes_the_breakdown(tmp_path):
    tok = build_toy_tokenizer()
    model = build_toy_model(FOUR_HEAD, tok)
    recipe = Recipe.model_validate({
        "run": {"name": "t", "mode": "sft"},
        "student": {"model": {"toy": FOUR_HEAD}, "lora": None},
        "environment": {"name": "calculator", "params": PARAMS, "eval_tasks": 6},
        "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 8, "max_total_tokens": 512},
    })
    summary = evaluate(model, tok, recipe, policy_version=0, out_dir=tmp_path)
    saved = json.loads((tmp_path / "eval-v0.summary.json").read_text())
    assert saved["faults"] == summary.faults
    assert saved["faults"]["faulted"]["n"] + saved["faults"]["fault_free"]["n"] == 6
