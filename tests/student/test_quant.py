"""4-bit (nf4) students on CPU: LoRA keeps training after no-grad passes; swap is refused.

bitsandbytes >= 0.50 runs nf4 on CPU. On CPUs with AVX512-BF16 an eval pass repacks
4-bit weights into an inference-only layout that stops gradients (student/quant.py);
these tests hold on any CPU: they check the repacking path is off, that a layer packed
anyway is unpacked before a training forward, and that a missing gradient is an error.
"""

from __future__ import annotations

import pytest
import torch

from miniverl.common.recipe import Recipe
from miniverl.student.environments import make_tasks
from miniverl.student.quant import LoraGradientError, check_trainable_grads, packed_layers
from miniverl.student.rollout.oracle import oracle_trajectory
from miniverl.student.train.policy import load_policy
from miniverl.student.train.updates import hidden_at_positions
from tests.extras import require
from tests.toy_kit import WIDE, seeded

bnb = require("bitsandbytes")

TOY = seeded(WIDE, 0)


def _recipe(tmp_path, **teacher) -> Recipe:
    return Recipe.model_validate({
        "schema_version": 1,
        "run": {"name": "nf4", "mode": "opd", "output_dir": str(tmp_path / "runs")},
        "student": {
            "model": {"toy": TOY}, "dtype": "float32", "device": "cpu",
            "quantization": "nf4", "allow_cpu_quantization": True,
            "lora": {"r": 4, "alpha": 8, "dropout": 0.0,
                     "target_modules": ["q_proj", "v_proj", "up_proj", "down_proj"]},
        },
        "teacher": {"model": {"toy": TOY}, "dtype": "float32", "device": "cpu", **teacher},
        "environment": {"name": "calculator", "difficulty": "easy", "train_tasks": 4,
                        "eval_tasks": 2, "test_tasks": 2},
        "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 8, "batch_size": 2},
        "train": {"cycles": 1, "rollouts_per_cycle": 2, "lr": 1e-2},
    })


def _lora_params(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _train_loss(policy, traj) -> torch.Tensor:
    pos = traj.target_positions()
    hidden = hidden_at_positions(policy, [traj], [pos])
    return policy.lm_head(hidden).float().logsumexp(-1).sum()


def _policy_and_traj(tmp_path):
    policy = load_policy(_recipe(tmp_path))
    task = make_tasks("calculator", "train", 1, "easy", 0)[0]
    traj = oracle_trajectory("calculator", task, policy.tokenizer, policy.tokenizer_fp)
    # LoRA B starts at zero, so A's first gradient is exactly zero; one step makes every
    # adapter parameter's gradient non-zero, which is what the checks below rely on.
    params = _lora_params(policy.model)
    _train_loss(policy, traj).backward()
    with torch.no_grad():
        for p in params.values():
            p -= 1e-2 * p.grad.sign()
            p.grad = None
    return policy, traj


def _assert_all_grads_nonzero(policy, traj) -> None:
    policy.model.train()
    _train_loss(policy, traj).backward()
    check_trainable_grads(policy.model)
    zero = [n for n, p in _lora_params(policy.model).items() if float(p.grad.abs().sum()) == 0]
    assert zero == []


def test_student_is_4bit_with_the_cpu_repacking_path_off(tmp_path):
    policy = load_policy(_recipe(tmp_path))
    layers = [m for m in policy.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and all(not m.support_avx512bf16_for_cpu for m in layers)
    assert policy.quantization == "nf4" and policy.lora


def test_lora_gradients_are_nonzero_after_an_eval_pass_and_generation(tmp_path):
    # The property a user relies on: rollouts and evals between updates never freeze
    # part of the adapter.
    policy, traj = _policy_and_traj(tmp_path)
    model = policy.model
    ids = torch.tensor([traj.tokens[:40]])
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
        model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    assert packed_layers(model) == []
    _assert_all_grads_nonzero(policy, traj)


def test_a_layer_packed_for_inference_is_unpacked_before_training(tmp_path):
    # Simulate the trap on any CPU: pack every 4-bit weight the way bitsandbytes does
    # on AVX512-BF16 CPUs; the guard must restore the trainable layout, same outputs.
    from bitsandbytes.functional import _convert_weight_packed_for_cpu

    policy, traj = _policy_and_traj(tmp_path)
    model = policy.model
    model.eval()
    with torch.no_grad():
        before = _train_loss(policy, traj)
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            w = module.weight
            w.data, w.quant_state = _convert_weight_packed_for_cpu(w.data, w.quant_state)
    assert packed_layers(model)
    _assert_all_grads_nonzero(policy, traj)
    assert packed_layers(model) == []
    with torch.no_grad():
        after = _train_loss(policy, traj)
    torch.testing.assert_close(after, before, rtol=1e-3, atol=1e-3)


def test_a_missing_lora_gradient_is_an_error_not_a_silent_step(tmp_path):
    policy, traj = _policy_and_traj(tmp_path)
    name, param = next(iter(_lora_params(policy.model).items()))
    _train_loss(policy, traj).backward()
    param.grad = None
    with pytest.raises(LoraGradientError, match="no gradient"):
        check_trainable_grads(policy.model)


def test_swap_memory_with_a_quantized_student_is_allowed(tmp_path):
    # swap parks the TEACHER's weights; the student's never move, so a 4-bit student
    # swaps like any other (it was refused with words saying the student's weights move).
    from miniverl.student.train.teacher.connect import memory_strategy

    recipe = _recipe(tmp_path, memory="swap")
    assert memory_strategy(recipe, torch.device("cpu"))[0] == "swap"


def test_trainer_runs_strict_opd_with_an_nf4_student(tmp_path):
    # End to end: eval pass, rollouts (no-grad), then an update with every adapter
    # gradient present (the trainer raises LoraGradientError otherwise).
    import json

    from miniverl.common.modeling import load_causal_lm
    from miniverl.common.recipe_models import ToySpec
    from miniverl.common.toy import toy_model_dir
    from miniverl.student.train.trainer import Trainer
    from miniverl.testing.fake_teacher import FakeTeacherClient

    recipe = _recipe(tmp_path)
    probe = load_policy(recipe)
    teacher = load_causal_lm(toy_model_dir(ToySpec(**TOY)), dtype="float32", device="cpu")
    client = FakeTeacherClient(teacher, probe.tokenizer_fp, probe.vocab_size)
    with Trainer(recipe, client=client, show_progress=False, write_report=False,
                 checkpoints=False) as trainer:
        result = trainer.train()
        assert packed_layers(trainer.state.policy.model) == []
    assert result.status == "completed" and result.final_version == 1
    [row] = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["on_policy"] is True and row["grad_norm"] > 0
