"""The student policy: load it from a recipe, wrap it for training, run its forward.

``load_policy`` resolves the recipe's ``student.model`` to a local HF directory (toy or
real, same path), loads tokenizer and weights, checks the tokenizer against the recipe's
loss settings, and wraps the model with a PEFT LoRA adapter when ``student.lora`` is set
(otherwise every weight trains: the full fine-tune used for toy models).
``hidden_at_positions`` runs the decoder over a padded batch and returns only the hidden
states at the positions the loss selected; the LM head is applied later, chunk by chunk,
by :mod:`miniverl.student.losses`, so ``[T, V]`` logits never exist for a whole batch.

This module does not sample, score or step an optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from miniverl.common.modeling import load_causal_lm, load_tokenizer, resolve_model_dir
from miniverl.common.recipe import Recipe, check_vocab
from miniverl.common.shared_prefix import decoder_hidden
from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.common.trajectory import Trajectory


@dataclass
class Policy:
    model: Any
    tokenizer: Any
    tokenizer_fp: str
    model_dir: Path
    device: torch.device
    vocab_size: int
    lora: bool
    quantization: str = "none"

    @property
    def lm_head(self):
        return self.model.get_output_embeddings()

    @property
    def decoder(self):
        return self.model.get_decoder()

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
        from miniverl.student.quant import guard_4bit

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


def pad_batch(
    trajs: list[Trajectory], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids_B_T`` and ``attention_mask_B_T``."""
    width = max(len(t.tokens) for t in trajs)
    ids_B_T = torch.full((len(trajs), width), pad_id, dtype=torch.long)
    mask_B_T = torch.zeros((len(trajs), width), dtype=torch.long)
    for b, traj in enumerate(trajs):
        ids_B_T[b, : len(traj.tokens)] = torch.tensor(traj.tokens, dtype=torch.long)
        mask_B_T[b, : len(traj.tokens)] = 1
    return ids_B_T.to(device), mask_B_T.to(device)


def hidden_at_positions(
    policy: Policy, trajs: list[Trajectory], positions: list[np.ndarray], autocast: Any = None
) -> torch.Tensor:
    """``hidden_P_H``: the decoder's final (normed) hidden states at the selected positions.

    Rows are ordered trajectory by trajectory, positions in the given order, which is the
    order of the teacher's reply rows for the same request.
    """
    pad_id = policy.tokenizer.pad_token_id
    pad_id = int(pad_id if pad_id is not None else policy.tokenizer.eos_token_id)
    ids_B_T, mask_B_T = pad_batch(trajs, pad_id, policy.device)
    ctx = autocast if autocast is not None else torch.autocast("cpu", enabled=False)
    with ctx:
        # The system block every row shares is computed once (common/shared_prefix.py).
        hidden_B_T_H = decoder_hidden(
            policy.decoder, ids_B_T, mask_B_T, [len(t.tokens) for t in trajs]
        )
    rows_B = torch.cat(
        [torch.full((len(p),), b, dtype=torch.long) for b, p in enumerate(positions)]
    ).to(policy.device)
    cols_P = torch.from_numpy(np.concatenate(positions).astype(np.int64)).to(policy.device)
    return hidden_B_T_H[rows_B, cols_P]


def next_tokens(trajs: list[Trajectory], positions: list[np.ndarray]) -> np.ndarray:
    """The token each selected position predicts (``tokens[p + 1]``), concatenated."""
    return np.concatenate(
        [np.asarray(t.tokens, dtype=np.int64)[p + 1] for t, p in zip(trajs, positions, strict=True)]
    )
