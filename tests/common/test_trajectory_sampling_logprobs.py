"""Sampling-time log-probs on a trajectory: one float32 value per model-span token,
read back exactly; a trajectory without them is written as it was before they existed
(its line and digest unchanged) and old lines still read; wrong lengths or values that
are not log-probs are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from miniverl.common.trajectory import (
    Span,
    SpanType,
    Trajectory,
    trajectory_from_json,
    trajectory_to_json,
)


def _traj(**kw):
    return Trajectory(
        id="calculator/t0/v0/s0", tokens=[5, 6, 7, 8, 9, 10], policy_version=0,
        tokenizer_fp="fp", environment="calculator", task_id="t0",
        spans=[Span(type=SpanType.USER, start=0, end=2),
               Span(type=SpanType.ASSISTANT_TOOL_CALL, start=2, end=4),
               Span(type=SpanType.TOOL_RESULT, start=4, end=5),
               Span(type=SpanType.ASSISTANT_FINAL, start=5, end=6)],
        **kw,
    )


def test_values_align_with_model_tokens_and_read_back_as_float32():
    values = [float(np.float32(v)) for v in (-0.1234567, -2.5, -1e-7)]
    traj = trajectory_from_json(trajectory_to_json(_traj(sampling_logprobs=values)))
    assert np.array_equal(np.asarray(traj.sampling_logprobs, np.float32),
                          np.asarray(values, np.float32))
    # Positions 1, 2 and 4 predict the model tokens 2, 3 and 5.
    assert traj.sampling_logprobs_at(np.array([4, 1])).tolist() == [values[2], values[0]]


def test_a_trajectory_without_them_keeps_its_line():
    line = trajectory_to_json(_traj())
    assert "sampling_logprobs" not in json.loads(line)
    # A line written before the field existed is this same line: it reads, unchanged.
    assert trajectory_to_json(trajectory_from_json(line)) == line
    assert trajectory_from_json(line).sampling_logprobs_at(np.array([1])) is None


@pytest.mark.parametrize("values,needle", [
    ([-0.5, -0.5], "2 values for 3 model-span tokens"),
    ([-0.5, 0.5, -1.0], "finite log-probs"),
    ([-0.5, float("nan"), -1.0], "finite log-probs"),
])
def test_wrong_lengths_and_values_are_refused(values, needle):
    with pytest.raises(ValueError, match=needle):
        _traj(sampling_logprobs=values)
