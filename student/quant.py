"""Keep a 4-bit (bitsandbytes nf4) student trainable after no-grad passes.

The trap: on CPUs with AVX512-BF16, bitsandbytes' ``Linear4bit.forward`` repacks its
weight into an inference-only layout the first time it sees an eval-mode, no-grad
input (exactly what a rollout or an eval pass is). From then on ``matmul_4bit`` takes
the packed ``gemv_4bit`` path, which is not differentiable: no gradient flows back
through the frozen base layer, so every LoRA parameter *before* it gets ``grad None``
and the optimizer silently skips it. The loss still goes down a little (the last
layers' adapters train), which is why this goes unnoticed.

What :func:`guard_4bit` does, for every ``Linear4bit`` in a model:

1. turns the repacking path off (``support_avx512bf16_for_cpu = False``), so the
   weight keeps the layout autograd works with;
2. registers a forward pre-hook that, should a weight be packed anyway (by another
   caller, or a future bitsandbytes that repacks elsewhere), converts it back with
   bitsandbytes' own inverse before any forward that records gradients.

:func:`check_trainable_grads` is the last line: after ``backward`` a trainable
parameter with ``grad None`` raises :class:`LoraGradientError` instead of an optimizer
step that trains part of the adapter. This module does not load models or step
optimizers.
"""

from __future__ import annotations

from typing import Any

import torch

from miniverl.common.errors import MiniverlError


class LoraGradientError(MiniverlError, RuntimeError):
    """Trainable parameters received no gradient (a 4-bit layer stopped backprop)."""


def _linear4bit_type():
    try:
        import bitsandbytes as bnb
    except ImportError:
        return None
    return bnb.nn.Linear4bit


def is_packed(module: Any) -> bool:
    """Whether a ``Linear4bit``'s weight is in bitsandbytes' inference-only CPU layout."""
    state = getattr(module.weight, "quant_state", None)
    return bool(getattr(state, "packing_format_for_cpu", False))


def unpack(module: Any) -> None:
    """Convert a packed ``Linear4bit`` weight back to the trainable layout, in place."""
    from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

    weight = module.weight
    weight.data, weight.quant_state = _convert_weight_packed_for_cpu_inverse(
        weight.data, weight.quant_state
    )


def _before_forward(module: Any, args: Any) -> None:
    if is_packed(module) and torch.is_grad_enabled():
        unpack(module)
        module.miniverl_unpacked = getattr(module, "miniverl_unpacked", 0) + 1


def guard_4bit(model: Any) -> int:
    """Disable CPU repacking on every 4-bit layer and unpack before grad passes; count."""
    linear4bit = _linear4bit_type()
    if linear4bit is None:
        return 0
    count = 0
    for module in model.modules():
        if isinstance(module, linear4bit):
            module.support_avx512bf16_for_cpu = False
            if not getattr(module, "miniverl_guarded", False):
                module.register_forward_pre_hook(_before_forward)
                module.miniverl_guarded = True
            count += 1
    return count


def packed_layers(model: Any) -> list[str]:
    """Names of the 4-bit layers whose weights are packed for inference right now."""
    linear4bit = _linear4bit_type()
    if linear4bit is None:
        return []
    return [name for name, m in model.named_modules() if isinstance(m, linear4bit) and is_packed(m)]


def check_trainable_grads(model: Any) -> None:
    """Raise :class:`LoraGradientError` if a trainable parameter has no gradient."""
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if missing:
        packed = packed_layers(model)
        raise LoraGradientError(
            f"{len(missing)} trainable parameters got no gradient (first: {missing[0]}); "
            + (f"4-bit layers are packed for inference ({packed[0]}, ...); " if packed else "")
            + "a quantized base layer stopped backpropagation. Load the student with "
            "miniverl.student.train.policy.load_policy (it guards 4-bit layers) or use "
            "quantization: none"
        )
