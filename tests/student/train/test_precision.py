"""Precision on CUDA, proven on the CPU (docs/gpu.md, "Precision").

- the update's and rollouts' autocast dtype is the recipe's resolved ``student.dtype`` for
  every dtype x quantization, on a card with and without bfloat16 (CUDA mocked): a 4-bit
  student whose first parameter is float32 still computes in bfloat16;
- ``dtype: auto`` is resolved before the full-fine-tune float16 refusal;
- ``loss.fp32_head`` computes the output layer in float32 (student and teacher), and
  changes nothing on a float32 model; a half-precision head keeps one float32 copy of its
  weight, in step with the trained weight, not one per call;
- ``run.deterministic`` sets ``CUBLAS_WORKSPACE_CONFIG`` (and every process the allocator
  setting) before CUDA starts, in the student's and the teacher's process.
"""

from __future__ import annotations

import copy
import itertools
import os
from types import SimpleNamespace

import pytest
import torch

from miniverl.common.errors import ConfigError
from torch.utils._python_dispatch import TorchDispatchMode

from miniverl.common.modeling import (
    DTYPES,
    FP32_WEIGHT,
    QUANTIZATIONS,
    fp32_head_forward,
    use_fp32_head,
)
from miniverl.common.recipe_models import StudentConfig
from miniverl.common.runtime import CUBLAS_WORKSPACE, CUDA_ALLOC_CONF, cuda_process_env
from miniverl.student.train.policy import Policy, check_trainable_dtype, student_compute_dtype
from tests.toy_kit import STUDENT, toy_dir, toy_spec

EXPECTED = {  # (recipe dtype, card has bf16) -> autocast dtype on CUDA (None: no autocast)
    ("float32", True): None, ("float32", False): None,
    ("bfloat16", True): torch.bfloat16, ("bfloat16", False): "refused",
    ("float16", True): torch.float16, ("float16", False): torch.float16,
    ("auto", True): torch.bfloat16, ("auto", False): torch.float16,
}


@pytest.fixture
def fake_cuda(monkeypatch):
    """A CUDA card as torch reports it; ``bf16`` says whether it has bfloat16."""
    card = SimpleNamespace(bf16=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: card.bf16)
    return card


@pytest.mark.parametrize(("dtype", "quantization", "bf16"),
                         list(itertools.product(DTYPES, QUANTIZATIONS, (True, False))))
def test_autocast_dtype_is_the_recipes_resolved_dtype(fake_cuda, dtype, quantization, bf16):
    # A 4-bit student computed attention, LoRA and the head in float32 because the
    # autocast dtype was read from its first parameter (float32 after
    # prepare_model_for_kbit_training); the recipe's dtype decides, whatever the weights.
    fake_cuda.bf16 = bf16
    cfg = StudentConfig(model={"toy": toy_spec(STUDENT).model_dump()}, dtype=dtype,
                        device="cuda", quantization=quantization)
    want = EXPECTED[(dtype, bf16)]
    if want == "refused":  # torch's autocast would raise at the first update instead
        with pytest.raises(ConfigError, match="has no bfloat16; set student.dtype"):
            student_compute_dtype(cfg)
        return
    resolved = student_compute_dtype(cfg)
    autocast = _policy("cuda", resolved).autocast
    if want is None:
        assert autocast is None
    else:
        assert autocast.device == "cuda" and autocast.fast_dtype == want


def _policy(device: str, compute_dtype: torch.dtype) -> Policy:
    """A policy whose model's parameters are all float32 (a 4-bit student's first
    parameter, its embedding, is float32 after prepare_model_for_kbit_training)."""
    model = SimpleNamespace(get_output_embeddings=lambda: None, get_decoder=lambda: None)
    return Policy(model=model, tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=0),
                  tokenizer_fp="-", model_dir=None, device=torch.device(device), vocab_size=2,
                  lora=True, compute_dtype=compute_dtype)


def test_cpu_runs_without_autocast():
    assert _policy("cpu", torch.bfloat16).autocast is None


def test_auto_resolved_to_float16_is_refused_for_a_full_fine_tune(fake_cuda):
    # dtype: auto is float16 on a card without bfloat16; the recipe's check of the literal
    # "float16" let it through to NaN weights at the first AdamW step.
    fake_cuda.bf16 = False
    cfg = StudentConfig(model={"toy": toy_spec(STUDENT).model_dump()}, dtype="auto",
                        device="cuda", lora=None)
    resolved = student_compute_dtype(cfg)
    assert resolved == torch.float16
    with pytest.raises(ConfigError, match=r"dtype auto \(float16 on this card.*student.dtype"):
        check_trainable_dtype(resolved, "auto", lora=False)
    check_trainable_dtype(resolved, "auto", lora=True)  # LoRA adapters train in float32
    fake_cuda.bf16 = True
    check_trainable_dtype(student_compute_dtype(cfg), "auto", lora=False)


def _head_model(dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(toy_dir(STUDENT)), dtype=dtype)


def test_fp32_head_computes_the_logits_in_float32():
    torch.manual_seed(0)
    model = _head_model(torch.bfloat16)
    head = model.get_output_embeddings()
    hidden = torch.randn(5, head.weight.shape[1]).to(torch.bfloat16)
    bf16_logits = head(hidden)
    keys = list(model.state_dict())
    use_fp32_head(model)
    # Under an active autocast too (CPU autocast stands in for CUDA's).
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model.get_output_embeddings()(hidden)
    exact = hidden.double() @ head.weight.double().T
    assert logits.dtype == torch.float32
    assert torch.allclose(logits.double(), exact, atol=1e-5)
    assert (bf16_logits.double() - exact).abs().max() > (logits.double() - exact).abs().max()
    assert list(model.state_dict()) == keys  # checkpoints keep their keys
    # The whole model's forward (the rollout's logits_to_keep path) goes through it.
    out = model(input_ids=torch.tensor([[1, 2, 3]]), logits_to_keep=1)
    assert out.logits.dtype == torch.float32
    twin = copy.deepcopy(model)  # a copy's head is its own
    assert twin.get_output_embeddings().forward.__self__ is twin.get_output_embeddings()


class _NewTensors(TorchDispatchMode):
    """Counts the tensors of ``numel`` elements the ops under it make in new memory."""

    def __init__(self, numel: int, old: set[int]):
        super().__init__()
        self.numel, self.old, self.made = numel, old, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() == self.numel \
                    and t.untyped_storage().data_ptr() not in self.old:
                self.made += 1
        return out


def test_fp32_head_keeps_one_float32_copy_in_step_with_the_trained_weight():
    # The copy was made on every call (595 MiB at Qwen's vocabulary); now once, refreshed
    # only when an optimizer step changes the weight, with the same logits and gradients.
    torch.manual_seed(0)
    model = _head_model(torch.bfloat16)
    head = model.get_output_embeddings()
    head.weight.requires_grad_(True)
    hidden = torch.randn(5, head.weight.shape[1]).to(torch.bfloat16)

    def per_call(h):  # what every call computed before: the weight widened each time
        return torch.nn.functional.linear(h.float(), head.weight.float())

    keys = list(model.state_dict())
    use_fp32_head(model)
    results = []
    for fn in (head, per_call):
        h = hidden.clone().requires_grad_(True)
        out = fn(h)
        out.square().mean().backward()
        results.append((out.detach(), h.grad, head.weight.grad))
        head.weight.grad = None
    for kept, fresh in zip(*results, strict=True):
        assert torch.equal(kept, fresh)
    assert results[0][2].dtype == torch.bfloat16
    assert list(model.state_dict()) == keys  # the copy is not in checkpoints
    old = {head.weight.untyped_storage().data_ptr(),
           getattr(head, FP32_WEIGHT).untyped_storage().data_ptr()}
    with _NewTensors(head.weight.numel(), old) as counting:
        head(hidden)
    assert counting.made == 0  # no weight-sized tensor was made: no per-call copy
    torch.optim.AdamW([head.weight], lr=0.1).step()
    with torch.no_grad():
        assert torch.equal(head(hidden), per_call(hidden))  # in step with the trained weight


def test_fp32_head_changes_nothing_on_a_float32_model():
    # Behaviour hashes run in float32 on the CPU: the head must be bit-identical there.
    torch.manual_seed(0)
    model = _head_model(torch.float32)
    hidden = torch.randn(7, model.get_output_embeddings().weight.shape[1])
    before = model.get_output_embeddings()(hidden)
    use_fp32_head(model)
    assert torch.equal(model.get_output_embeddings()(hidden), before)


def test_fp32_head_is_on_for_distillation_and_reaches_the_teacher(tmp_path):
    from miniverl.teacher_server.loader import TeacherSpec, load_teacher
    from tests.toy_kit import make_recipe

    opd = make_recipe("opd", tmp_path)
    assert opd.fp32_head and not make_recipe("sft", tmp_path).fp32_head
    off = opd.model_copy(update={"loss": opd.loss.model_copy(update={"fp32_head": False})})
    assert not off.fp32_head
    loaded = load_teacher(TeacherSpec(model=str(toy_dir(STUDENT)), device="cpu"))
    assert loaded.model.get_output_embeddings().forward.__func__ is fp32_head_forward
    plain = load_teacher(TeacherSpec(model=str(toy_dir(STUDENT)), device="cpu",
                                     fp32_head=False))
    assert getattr(plain.model.get_output_embeddings().forward, "__func__", None) \
        is not fp32_head_forward


def test_cuda_env_is_set_where_unset(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert cuda_process_env(deterministic=False) == {"PYTORCH_CUDA_ALLOC_CONF": CUDA_ALLOC_CONF}
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert cuda_process_env(deterministic=True) == {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE}
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own stays
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    assert cuda_process_env(deterministic=True) == {}
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_teacher_process_sets_cuda_env_from_its_recipe(tmp_path, monkeypatch):
    # The teacher reads its recipe's run.deterministic before anything touches CUDA.
    from miniverl.teacher_server.__main__ import build_parser, serve
    from tests.toy_kit import recipe_dict, write_recipe

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    data = recipe_dict("opd", tmp_path / "runs")
    data["run"]["deterministic"] = True
    recipe = write_recipe(tmp_path / "r.yaml", data)
    # A teacher name the recipe lacks stops serve() right after the environment is set.
    args = build_parser().parse_args(["--recipe", str(recipe), "--recipe-teacher", "nope"])
    with pytest.raises(ConfigError):
        serve(args)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == CUDA_ALLOC_CONF


def test_student_sets_cublas_before_deterministic_algorithms(monkeypatch, tmp_path):
    # run.deterministic raised at the first cuBLAS matmul on CUDA: the workspace variable
    # must be in the environment when use_deterministic_algorithms is turned on.
    import miniverl.student.train.state as state_mod

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen = {}

    def fake_deterministic(flag):
        seen["cublas"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        raise RuntimeError("stop here")

    monkeypatch.setattr(state_mod.torch, "use_deterministic_algorithms", fake_deterministic)
    from tests.toy_kit import make_recipe

    recipe = make_recipe("sft", tmp_path)
    assert recipe.run.deterministic
    with pytest.raises(RuntimeError, match="stop here"):
        state_mod.prepare_process(recipe, None, offline=True)
    assert seen["cublas"] == CUBLAS_WORKSPACE


def test_float16_training_scales_the_loss_and_skips_a_non_finite_step():
    # fp16 had no gradient scaler: small gradients flushed to zero and one inf step
    # turned the adapters NaN. Now the loss is scaled and such a step is skipped.
    from miniverl.student.train.updates import backward, finish_step

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    policy = _policy("cpu", torch.float16)
    assert policy.grad_scaler is not None and _policy("cpu", torch.bfloat16).grad_scaler is None
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    before = layer.weight.detach().clone()
    loss = layer(torch.ones(1, 4)).sum()
    backward(policy, loss)
    scale = policy.grad_scaler.get_scale()
    assert torch.allclose(layer.bias.grad, torch.full((4,), scale))  # scaled by backward
    finish_step(policy, optimizer, scheduler, max_grad_norm=1e9)
    assert not torch.equal(layer.weight, before)  # a finite step is taken, unscaled
    stepped = layer.weight.detach().clone()
    backward(policy, layer(torch.full((1, 4), float("inf"))).sum())
    finish_step(policy, optimizer, scheduler, max_grad_norm=1e9)
    assert torch.equal(layer.weight, stepped) and torch.isfinite(layer.weight).all()
    assert policy.grad_scaler.get_scale() < scale  # the scale backs off
