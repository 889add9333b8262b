"""The cross-tokenizer benchmark's analysis (benchmarks/xvocab_bench.py, docs/cross-tokenizer.md).

A reader of its table trusts that "episodes aligned" is the share of OPD episodes the
student could render and send, and "trainable positions trained" the positions that
carried a teacher target over the trainable positions of the episodes the run sampled,
both read from the run itself; this file checks them on a run folder built by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import xvocab_bench as bench  # noqa: E402


def _episodes(n: int):
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.common.toy import build_toy_tokenizer
    from miniverl.student.environments import make_tasks
    from miniverl.student.rollout.oracle import oracle_trajectories

    tok = build_toy_tokenizer()
    tasks = make_tasks("calculator", "train", n, "easy", 0, {"units": False})
    trajs = oracle_trajectories("calculator", tasks, tok, fingerprint_tokenizer(tok),
                                {"units": False})
    return [t.model_copy(update={"source": "rollout"}) for t in trajs]


def _write(out: Path) -> int:
    from miniverl.common.trajectory import write_trajectories

    run = out / "runs" / "opd-s1"
    run.mkdir(parents=True)
    trajs = _episodes(4)
    trainable = sum(len(t.target_positions()) for t in trajs)
    events = [
        {"event": "eval", "version": 0, "success": 0.5, "n": 4, "sampled": {"success": 0.25}},
        {"event": "eval", "version": 2, "success": 0.75, "n": 4, "sampled": {"success": 0.5}},
        {"event": "run_completed", "version": 2, "steps": 2,
         "teacher_counters": {"sent": 9, "xvocab_sent": 3, "xvocab_unaligned": 1}},
    ]
    rows = [{"phase": "train", "step": s, "positions": 10, "time_rollout_s": 1.0,
             "time_teacher_wait_s": 2.0, "time_update_s": 0.5} for s in (1, 2)]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_trajectories(run / "trajectories.jsonl", trajs)
    results = {"name": "xvocab", "metric": "sampled_success_after", "baseline": "sft",
               "complete": True, "config_digest": "sha256:x",
               "summary": [{"arm": "opd", "mean": 0.5}],
               "cells": [{"arm": "opd", "seed": 1,
                          "result": {"status": "ok", "run_dir": "runs/opd-s1", "updates": 2,
                                     "wall_s": 9.0}},
                         {"arm": "opd", "seed": 2,
                          "result": {"status": "failed", "run_dir": None,
                                     "error": "teacher unavailable"}}]}
    (out / "results.json").write_text(json.dumps(results))
    return trainable


def test_the_analysis_reads_alignment_and_training_seconds_from_the_run(tmp_path):
    trainable = _write(tmp_path)
    data = bench.analyze(tmp_path)
    ok, failed = data["cells"]
    assert failed["status"] == "failed" and "curve" not in failed  # kept, not read
    assert [(p["update"], p["t1"], p["greedy"]) for p in ok["curve"]] == [(0, 0.25, 0.5),
                                                                        (2, 0.5, 0.75)]
    assert ok["training_s"] == 7.0  # rollout + wait + update of both rows, no evaluation
    xv = ok["xvocab"]
    assert (xv["episodes_sent"], xv["episodes_unaligned"]) == (3, 1)
    assert xv["episodes_aligned_share"] == 0.75 and xv["teacher_wait_s"] == 4.0
    assert xv["trainable_positions"] == trainable and xv["trained_positions"] == 20
    assert xv["trained_share"] == 20 / trainable
    arm = data["arms"]["opd"]
    assert (arm["cells"], arm["ok"], arm["t1_before"], arm["t1_after"]) == (2, 1, 0.25, 0.5)
    assert arm["xvocab"]["episodes_sent"] == 3 and arm["benchmark"] == {"arm": "opd", "mean": 0.5}


def test_analyze_only_without_results_is_one_line(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as info:
        bench.main(["--analyze-only", "--output-dir", str(tmp_path / "none")])
    assert info.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "holds no results.json" in line
