"""The student policy: load it from a recipe and wrap it for training.

``load_policy`` resolves the recipe's ``student.model`` to a local HF directory (toy or
real, same path), loads tokenizer and weights, checks the tokenizer against the recipe's
loss settings, and wraps the model with a PEFT LoRA adapter when ``student.lora`` is set
(otherwise every weight trains: the full fine-tune used for toy models).

This module does not run an update's forward (``updates.py``), sample, score or step
an optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from miniverl.common.errors import ConfigError
from miniverl.common.modeling import (
    autocast_dtype,
    load_causal_lm,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
    resolve_model_dir,
    use_fp32_head,
)
from miniverl.common.recipe import Recipe, check_vocab
from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.student.quant import guard_4bit


@dataclass
class Policy:
    """A loaded student: model, tokenizer and what the loop needs to know about them."""

    model: Any
    tokenizer: Any
    tokenizer_fp: str
    model_dir: Path
    device: torch.device
    vocab_size: int
    lora: bool
    quantization: str = "none"
    # The recipe's resolved student.dtype: what the model computes in (autocast's dtype on
    # CUDA, common/modeling.py autocast_dtype), whatever its first parameter's dtype is.
    compute_dtype: torch.dtype = torch.float32
    # The model's output head and decoder stack, looked up once (an update reads both).
    lm_head: Any = field(init=False, repr=False)
    decoder: Any = field(init=False, repr=False)
    # The update's and the rollouts' autocast context: CUDA, in compute_dtype; None on
    # the CPU or in float32 (common/modeling.py autocast_dtype).
    autocast: Any = field(init=False, repr=False)
    # The id that pads a batch of this tokenizer's sequences (its pad token, else EOS).
    pad_id: int = field(init=False, repr=False)
    # float16 only: scales the loss so small gradients do not flush to zero in float16,
    # and skips a step whose gradients are not finite (updates.py backward/finish_step).
    grad_scaler: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.lm_head = self.model.get_output_embeddings()
        self.decoder = self.model.get_decoder()
        device_type = torch.device(self.device).type
        dtype = autocast_dtype(self.compute_dtype, device_type)
        self.autocast = None if dtype is None else torch.autocast(device_type, dtype=dtype)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        self.grad_scaler = (torch.amp.GradScaler(device_type)
                            if self.compute_dtype == torch.float16 else None)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


def load_policy(recipe: Recipe, *, offline: bool = False) -> Policy:
    """Load the student named by ``recipe.student``, ready to train."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress view per run: ours
    cfg = recipe.student
    model_dir = resolve_model_dir(cfg.model, offline=offline)
    tokenizer = load_tokenizer(model_dir)
    vocab_size = len(tokenizer)
    check_vocab(recipe, vocab_size)
    compute_dtype = student_compute_dtype(cfg)
    check_trainable_dtype(compute_dtype, cfg.dtype, lora=cfg.lora is not None)
    model = load_causal_lm(
        model_dir,
        dtype=cfg.dtype,
        device=cfg.device,
        quantization=cfg.quantization,
        revision=cfg.model.revision,
        allow_cpu_quantization=cfg.allow_cpu_quantization,
    )
    lora = cfg.lora is not None
    if cfg.lora is not None:
        from peft import LoraConfig, get_peft_model

        if cfg.quantization != "none":
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model = get_peft_model(
            model,
            LoraConfig(
                r=cfg.lora.r,
                # peft annotates an int; a float alpha scales by alpha / r as well.
                lora_alpha=cfg.lora.alpha,  # type: ignore[arg-type]
                lora_dropout=cfg.lora.dropout,
                target_modules=list(cfg.lora.target_modules),
                task_type="CAUSAL_LM",
            ),
        )
    else:
        for param in model.parameters():
            param.requires_grad_(True)
    if cfg.quantization == "nf4":
        # Rollouts are no-grad passes; on some CPUs they repack 4-bit weights into an
        # inference-only layout that silently stops LoRA gradients (see student/quant.py).
        guard_4bit(model)
    if recipe.fp32_head:
        use_fp32_head(model)
    if recipe.train.gradient_checkpointing:
        # Non-reentrant: it needs no input that requires grad (a LoRA model's embedding is
        # frozen) and keeps PEFT's adapters' gradients; a 4-bit model is prepared the same
        # way (its use_gradient_checkpointing above stays False, so this is the one switch).
        # Only forwards that record gradients recompute: rollouts keep their KV cache.
        enable_checkpointing(model)
    model.train()
    device = next(model.parameters()).device
    return Policy(
        model=model,
        tokenizer=tokenizer,
        tokenizer_fp=fingerprint_tokenizer(tokenizer),
        model_dir=Path(model_dir),
        device=device,
        vocab_size=vocab_size,
        lora=lora,
        quantization=cfg.quantization,
        compute_dtype=compute_dtype,
    )


def student_compute_dtype(cfg: Any) -> torch.dtype:
    """The dtype the student computes in: its ``dtype`` resolved on its ``device``
    (``auto``: bfloat16 on CUDA with bfloat16, float16 on older CUDA, float32 on CPU),
    whatever the quantization (a 4-bit student's layers compute in it too). A literal
    ``bfloat16`` on a CUDA card without it is refused here, in one line, where torch's
    autocast would raise at the first update."""
    device = resolve_device(cfg.device)
    resolved = resolve_dtype(cfg.dtype, device)
    if resolved == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"student.dtype bfloat16: this card ({device}) has no bfloat16; set "
            "student.dtype: auto (float16 with a gradient scaler, LoRA) or float32"
        )
    return resolved


def check_trainable_dtype(resolved: torch.dtype, wanted: str, *, lora: bool) -> None:
    """Refuse a full fine-tune in float16 once ``dtype: auto`` is resolved (on a CUDA card
    without bfloat16 ``auto`` is float16, which the recipe's check of the literal
    ``float16`` cannot see): AdamW's eps (1e-8) is 0 in float16 and the first step turns
    weights NaN (docs/gpu.md, "Precision")."""
    if resolved == torch.float16 and not lora:
        shown = "dtype auto (float16 on this card, which has no bfloat16)" if wanted == "auto" \
            else "dtype float16"
        raise ConfigError(
            f"student.{shown} with a full fine-tune (lora: null) turns the weights NaN at "
            "the first AdamW step (its eps 1e-8 is 0 in float16); set student.dtype: "
            "float32, or train LoRA adapters (student.lora)"
        )


def enable_checkpointing(model: Any) -> None:
    """Non-reentrant activation checkpointing in forwards that record gradients only.

    transformers 5 calls it ``activation_checkpointing_enable`` and skips it in no-grad
    forwards. The lowest version this project supports (4.56) has only
    ``gradient_checkpointing_enable``, whose layers drop the KV cache in every forward of a
    model in train mode; there a hook on each decoder turns its layers' checkpointing on
    only while gradients are recorded, so rollouts keep their cache on both.
    """
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        return
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for module in model.modules():
        if isinstance(getattr(module, "layers", None), torch.nn.ModuleList):
            module.register_forward_pre_hook(_checkpoint_when_grad)


def _checkpoint_when_grad(decoder: Any, _args: Any) -> None:
    # The decoder's own flag turns use_cache off; its layers' flags drop the cache passed in.
    for module in (decoder, *decoder.layers):
        if hasattr(module, "gradient_checkpointing"):
            module.gradient_checkpointing = torch.is_grad_enabled()
