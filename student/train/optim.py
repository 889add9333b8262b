"""Optimizer and learning-rate schedule for the student, built from ``recipe.train``.

AdamW from torch, or 8-bit AdamW from bitsandbytes when the recipe asks for
``adamw8bit``; a linear warmup followed by a constant, linear or cosine decay over the
run's total number of optimizer steps. This module does not compute losses.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from miniverl.common.errors import MissingExtraError
from miniverl.common.recipe import Recipe

# torch is imported where it is used: the `up` supervisor reads total_optimizer_steps
# and should not spend seconds of CPU importing torch beside its two children.
if TYPE_CHECKING:
    import torch


def planned_cycles(recipe: Recipe) -> int:
    """Cycles the run makes: ``train.cycles``, or, in sft mode with ``sft_epochs`` set,
    enough cycles of ``rollouts_per_cycle`` oracle traces to pass over the training
    tasks that have one (``train.oracle_tasks``) ``sft_epochs`` times."""
    train = recipe.train
    if recipe.run.mode == "sft" and train.sft_epochs is not None:
        tasks = recipe.environment.train_tasks
        if train.oracle_tasks is not None and train.fixed_set != "teacher":
            tasks = train.oracle_tasks
        return math.ceil(train.sft_epochs * tasks / train.rollouts_per_cycle)
    return train.cycles


def total_optimizer_steps(recipe: Recipe) -> int:
    """SFT warm-up steps plus ``updates_per_batch`` steps per cycle."""
    train = recipe.train
    return train.sft_warmup_steps + planned_cycles(recipe) * train.updates_per_batch


def build_optimizer(recipe: Recipe, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    import torch

    train = recipe.train
    if train.optimizer == "adamw8bit":
        try:
            import bitsandbytes as bnb
        except ImportError as exc:
            raise MissingExtraError("bitsandbytes", "cuda") from exc
        return bnb.optim.AdamW8bit(params, lr=train.lr, weight_decay=train.weight_decay)
    return torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay)


def lr_factor(step: int, *, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_at(step: int, recipe: Recipe, warmup_end: int | None = None) -> float:
    """The learning rate of optimizer step ``step`` (0-based).

    One schedule over the whole run, or, when ``train.sft_warmup_lr`` is set, one per
    phase: the SFT warm-up at its own peak, then distillation at ``train.lr``, each with
    ``warmup_steps`` of linear ramp and the schedule over its own length. A converged
    SFT model takes a distillation step at the warm-up's rate as a shock (see
    docs/toy-learning.md); the second ramp starts distillation gently. ``warmup_end`` is
    the step the SFT warm-up actually ended at (``train.sft_warmup_until_loss`` can end
    it before ``sft_warmup_steps``); a decaying schedule is planned over the maximum.
    """
    train = recipe.train
    split = train.sft_warmup_steps if warmup_end is None else warmup_end
    if train.sft_warmup_lr is None:
        return train.lr * lr_factor(
            step, warmup=train.warmup_steps, total=total_optimizer_steps(recipe),
            schedule=train.schedule,
        )
    if step < split:
        return train.sft_warmup_lr * lr_factor(
            step, warmup=train.warmup_steps, total=train.sft_warmup_steps,
            schedule=train.schedule,
        )
    return train.lr * lr_factor(
        step - split, warmup=train.warmup_steps,
        total=planned_cycles(recipe) * train.updates_per_batch, schedule=train.schedule,
    )


def build_scheduler(recipe: Recipe, optimizer: torch.optim.Optimizer, warmup_end=None):
    """LambdaLR over :func:`lr_at`; ``warmup_end()`` returns the step the warm-up ended
    at once it has (None before)."""
    import torch

    peak = recipe.train.lr  # the optimizer's base lr; LambdaLR multiplies it
    end = warmup_end or (lambda: None)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_at(step, recipe, end()) / peak
    )
