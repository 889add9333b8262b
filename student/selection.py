"""Which positions of a trajectory the loss is computed on.

Three rules, named by the recipe's ``loss.positions``:

* ``all``: every position whose next token the model sampled (assistant text,
  tool calls and final answers);
* ``tool_call_and_final``: only positions predicting tool-call and final-answer
  tokens (the tokens that change what happens next);
* ``uniform``: a seeded uniform subset of the ``all`` positions, a fraction
  ``position_ratio`` of them (at least one when there is any), the same subset for
  the same seed and trajectory id on every machine.

Positions follow the trajectory convention: position ``p`` predicts token
``p + 1``, so position 0 is never returned. This module is torch-free; it does
not pack sequences or compute losses.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import SpanType, Trajectory

POSITION_RULES = ("all", "tool_call_and_final", "uniform")
TOOL_CALL_AND_FINAL = (SpanType.ASSISTANT_TOOL_CALL, SpanType.ASSISTANT_FINAL)


def _stable_seed(seed: int, trajectory_id: str) -> int:
    # hash() of a str is salted per process; sha256 keeps the subset reproducible.
    digest = hashlib.sha256(f"{seed}:{trajectory_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def select_positions(
    traj: Trajectory, rule: str = "all", *, ratio: float = 1.0, seed: int = 0
) -> np.ndarray:
    """``int64[P]`` sorted positions of ``traj`` to train on under ``rule``."""
    if rule == "all":
        return traj.target_positions()
    if rule == "tool_call_and_final":
        return traj.target_positions(TOOL_CALL_AND_FINAL)
    if rule == "uniform":
        if not 0.0 < ratio <= 1.0:
            raise ConfigError(
                f"loss.position_ratio={ratio} must be in (0, 1] for positions: uniform; "
                f"fix the recipe"
            )
        positions_P = traj.target_positions()
        n = len(positions_P)
        if n == 0 or ratio == 1.0:
            return positions_P
        keep = max(1, min(n, math.ceil(ratio * n - 1e-9)))
        rng = np.random.default_rng(_stable_seed(seed, traj.id))
        chosen = rng.choice(n, size=keep, replace=False)
        return positions_P[np.sort(chosen)]
    raise ConfigError(
        f"loss.positions={rule!r} is not one of {', '.join(POSITION_RULES)}; fix the recipe"
    )


def select_positions_for(traj: Trajectory, loss_config: Any, *, seed: int = 0) -> np.ndarray:
    """:func:`select_positions` with the rule and ratio read from the recipe's ``loss``."""
    return select_positions(
        traj,
        getattr(loss_config, "positions", "all"),
        ratio=float(getattr(loss_config, "position_ratio", 1.0)),
        seed=seed,
    )
