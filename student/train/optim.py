"""How many cycles and optimizer steps a recipe plans, and the student's optimizer.

:func:`planned_cycles` and :func:`total_optimizer_steps` are arithmetic on the recipe
(torch-free: the ``up`` supervisor reads them); :func:`build_optimizer` is AdamW from
torch, or 8-bit AdamW from bitsandbytes when the recipe asks for ``adamw8bit``. The
learning-rate schedule is stepped with the optimizer (``updates.py``,
:class:`~miniverl.student.train.updates.Schedule`). This module does not compute losses.
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
