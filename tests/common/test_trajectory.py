"""Trajectory model: spans tile, position 0 is never a target, tampered masks are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miniverl.common.errors import ProvenanceError
from miniverl.common.hashing import seal
from miniverl.common.trajectory import (
    CONTEXT_SPANS,
    MODEL_SPANS,
    Span,
    SpanType,
    Trajectory,
    read_trajectories,
    write_trajectories,
)


def make(spans: list[tuple[str, int]], tid: str = "t0", version: int = 0) -> Trajectory:
    tokens, out, cursor = [], [], 0
    for kind, length in spans:
        out.append(Span(type=SpanType(kind), start=cursor, end=cursor + length))
        tokens.extend(range(cursor, cursor + length))
        cursor += length
    return Trajectory(
        id=tid,
        tokens=tokens,
        spans=out,
        policy_version=version,
        tokenizer_fp="sha256:" + "0" * 64,
        environment="calculator",
        task_id="task-0",
    )


def test_masks_and_targets_follow_spans():
    traj = make(
        [("system", 3), ("assistant_tool_call", 2), ("tool_result", 2), ("assistant_final", 1)]
    )
    assert traj.loss_mask().tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    # The distribution predicting token j lives at position j - 1.
    assert traj.target_positions().tolist() == [2, 3, 6]
    assert traj.target_positions([SpanType.ASSISTANT_FINAL]).tolist() == [6]
    assert traj.target_positions([SpanType.USER]).tolist() == []
    counts = traj.token_counts()
    assert counts["system"] == 3 and counts["assistant_tool_call"] == 2 and counts["user"] == 0
    assert traj.model_ids() == [[3, 4], [7]]


def test_spans_must_tile():
    with pytest.raises(ValueError, match="tile"):
        Trajectory(
            id="x",
            tokens=[1, 2, 3, 4],
            spans=[
                Span(type="system", start=0, end=2),
                Span(type="assistant_final", start=3, end=4),
            ],
            policy_version=0,
            tokenizer_fp="fp",
            environment="e",
            task_id="t",
        )
    with pytest.raises(ValueError, match="cover"):
        Trajectory(
            id="x",
            tokens=[1, 2, 3, 4],
            spans=[Span(type="system", start=0, end=3)],
            policy_version=0,
            tokenizer_fp="fp",
            environment="e",
            task_id="t",
        )


def test_position_zero_is_never_a_target():
    with pytest.raises(ValueError, match="position 0"):
        make([("assistant_text", 2), ("user", 1)])


def test_tampered_mask_is_rejected_with_file_and_line(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(
        path, [make([("user", 2), ("assistant_final", 2)], tid=f"t{i}") for i in range(3)]
    )
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    record["loss_mask"] = "1111"  # claims the prompt is trainable
    lines[1] = json.dumps(seal(record))  # resealed: the mask rule itself must catch it
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProvenanceError, match=rf"{path}:2: stored loss_mask"):
        read_trajectories(path)


def test_corrupt_line_names_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [make([("user", 1), ("assistant_final", 1)])])
    with path.open("a") as fh:
        fh.write("{not json\n")
    with pytest.raises(ProvenanceError, match=rf"{path}:2: not valid JSON"):
        read_trajectories(path)


span_lists = st.lists(
    st.tuples(st.sampled_from([t.value for t in SpanType]), st.integers(1, 6)),
    min_size=1,
    max_size=8,
).map(lambda spans: [(st_ if i else "system", n) for i, (st_, n) in enumerate(spans)])


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(spans=st.lists(span_lists, min_size=1, max_size=4), version=st.integers(0, 1000))
def test_write_read_round_trip(tmp_path, spans, version):
    trajs = [make(s, tid=f"t{i}", version=version) for i, s in enumerate(spans)]
    path = tmp_path / "rt.jsonl"
    write_trajectories(path, trajs)
    back = read_trajectories(path)
    assert back == trajs
    for a, b in zip(back, trajs, strict=True):
        assert np.array_equal(a.loss_mask(), b.loss_mask())
        positions = a.target_positions()
        assert (positions >= 0).all()
        assert all(a.span_types()[p + 1] in MODEL_SPANS for p in positions.tolist())
        assert a.span_types()[0] in CONTEXT_SPANS
