"""Position selection: which tokens a loss sees, deterministically."""

from __future__ import annotations

import numpy as np
import pytest

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import LossConfig
from miniverl.common.trajectory import (
    Span,
    SpanType,
    Trajectory,
    select_positions,
    select_positions_for,
)


def _traj(traj_id="t0"):
    # system [0,3) text [3,6) tool_call [6,9) tool_result [9,12) final [12,15)
    spans = [
        Span(type=SpanType.SYSTEM, start=0, end=3),
        Span(type=SpanType.ASSISTANT_TEXT, start=3, end=6),
        Span(type=SpanType.ASSISTANT_TOOL_CALL, start=6, end=9),
        Span(type=SpanType.TOOL_RESULT, start=9, end=12),
        Span(type=SpanType.ASSISTANT_FINAL, start=12, end=15),
    ]
    return Trajectory(
        id=traj_id,
        tokens=list(range(15)),
        spans=spans,
        policy_version=0,
        tokenizer_fp="sha256:x",
        environment="calculator",
        task_id="task",
    )


def test_all_selects_every_model_token_predictor():
    # Position p predicts token p + 1: context tokens are never targets.
    assert select_positions(_traj(), "all").tolist() == [2, 3, 4, 5, 6, 7, 11, 12, 13]


def test_tool_call_and_final_only():
    assert select_positions(_traj(), "tool_call_and_final").tolist() == [5, 6, 7, 11, 12, 13]


def test_uniform_is_a_seeded_deterministic_subset():
    traj = _traj()
    all_p = select_positions(traj, "all")
    a = select_positions(traj, "uniform", ratio=0.5, seed=3)
    b = select_positions(traj, "uniform", ratio=0.5, seed=3)
    assert np.array_equal(a, b)
    assert len(a) == 5 and set(a.tolist()) <= set(all_p.tolist())
    assert np.all(np.diff(a) > 0)
    others = {tuple(select_positions(traj, "uniform", ratio=0.5, seed=s)) for s in range(10)}
    assert len(others) > 1  # the seed matters
    assert len(select_positions(traj, "uniform", ratio=0.01)) == 1
    assert np.array_equal(select_positions(traj, "uniform", ratio=1.0), all_p)


def test_reads_the_recipe_fields_and_rejects_bad_values():
    cfg = type("Loss", (), {"positions": "tool_call_and_final", "position_ratio": 1.0})()
    assert select_positions_for(_traj(), cfg).tolist() == [5, 6, 7, 11, 12, 13]
    assert len(select_positions_for(_traj(), LossConfig())) == 9
    with pytest.raises(ConfigError, match="loss.positions"):
        select_positions(_traj(), "some")
    with pytest.raises(ConfigError, match="position_ratio"):
        select_positions(_traj(), "uniform", ratio=0.0)
