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

from miniverl.common.modeling import load_causal_lm, load_tokenizer, resolve_model_dir
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
    # The model's output head and decoder stack, looked up once (an update reads both).
    lm_head: Any = field(init=False, repr=False)
    decoder: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.lm_head = self.model.get_output_embeddings()
        self.decoder = self.model.get_decoder()

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
    model = load_causal_lm(
        model_dir,
        dtype=cfg.dtype,
        device=cfg.device,
        quantization=cfg.quantization,
        revision=cfg.model.revision,
        allow_cpu_quantization=cfg.allow_cpu_quantization,
    )
    lora = cfg.lora is not None
    if lora:
        from peft import LoraConfig, get_peft_model

        if cfg.quantization != "none":
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model = get_peft_model(
            model,
            LoraConfig(
                r=cfg.lora.r,
                lora_alpha=cfg.lora.alpha,
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
    )
