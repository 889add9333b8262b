"""The collapse probe's reading (benchmarks/distill_collapse_probe.py, docs/distillbench.md):
per update the gradient norm before and after the clip, the update's own episodes' success
and entropy; the final episodes described and compared between cells."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import distill_collapse_probe as probe  # noqa: E402


def _episode(task, version, success, logprobs, first=(5, 6), seed=0, tokens=None):
    toks = tokens or [1, 2, *first, 9]
    return {"task_id": task, "seed": seed, "policy_version": version, "source": "rollout",
            "tokens": toks, "spans": [{"type": "user", "start": 0, "end": 2},
                                      {"type": "assistant_tool_call", "start": 2, "end": 2 + len(first)},
                                      {"type": "tool_result", "start": 2 + len(first), "end": len(toks)}],
            "sampling_logprobs": logprobs, "verifier": {"success": success},
            "stop_reason": "final_answer", "tool_calls": {"total": 3}}


def test_each_update_reads_its_own_episodes_and_the_clip():
    rows = [{"step": 1, "phase": "train", "loss": 0.5, "grad_norm": 0.3, "train_success": 0.5},
            {"step": 2, "phase": "train", "loss": 0.4, "grad_norm": 0.01, "train_success": 1.0}]
    episodes = [_episode("a", 0, True, [-1.0, -3.0]), _episode("b", 0, False, [-2.0]),
                _episode("a", 1, True, [-0.5, -0.5])]
    ups = probe.per_update(rows, episodes, clip=0.05)
    assert [u["clipped"] for u in ups] == [True, False]
    assert [u["grad_norm_after"] for u in ups] == [0.05, 0.01]
    assert ups[0]["entropy"] == pytest.approx(2.0) and ups[0]["episodes"] == 2
    assert ups[1]["entropy"] == pytest.approx(0.5)


def test_final_episodes_are_described_and_compared_by_task_and_seed():
    a = [_episode("t1", 64, True, [-0.1]), _episode("t2", 64, False, [-0.1]),
         _episode("t3", 64, True, [-0.1], first=(7, 7))]
    b = [_episode("t1", 64, True, [-0.1]), _episode("t2", 64, True, [-0.1], tokens=[1, 2, 5, 6, 8]),
         _episode("t3", 64, False, [-0.1], first=(7, 7), seed=1)]
    d = probe.describe_final(a)
    assert (d["successes"], d["distinct_first_turns"]) == (2, 2)
    assert d["most_common_first_turn_share"] == pytest.approx(2 / 3)
    assert d["stop_reasons"] == {"final_answer": 3} and d["mean_tool_calls"] == 3
    same = probe.alike(a, b)  # t3's seeds differ: two pairs
    assert same == {"pairs": 2, "same_tokens": 0.5, "same_success": 0.5}


def test_the_probe_without_its_cells_says_how_to_run_them(tmp_path):
    with pytest.raises(SystemExit) as info:
        probe.main(["--folder", str(tmp_path), "--record", str(tmp_path / "r.json")])
    (line,) = str(info.value).splitlines()
    assert "probe_v4_collapse.yaml" in line and "--phase grid" in line
    assert not (tmp_path / "r.json").exists()
