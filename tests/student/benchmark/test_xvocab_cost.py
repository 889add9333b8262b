"""The cross-tokenizer cost benchmark's script (benchmarks/xvocab_cost.py,
docs/cross-tokenizer.md, "Cost per position").

Its smoke form runs end to end through the two real teacher servers and writes a record
whose fields the page describes, consistent with each other; its defaults are the
measurement the page describes; a bad value is one line.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import xvocab_cost as bench  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "xvocab_cost.py"
PAGE = ROOT / "docs" / "cross-tokenizer.md"
SPREAD_KEYS = {"median", "min", "max"}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def _spread_ok(row: dict) -> bool:
    return (set(row) == SPREAD_KEYS and all(math.isfinite(v) and v > 0 for v in row.values())
            and row["min"] <= row["median"] <= row["max"])


@pytest.mark.slow  # imports torch and starts two servers: several seconds
def test_the_smoke_form_writes_every_field(tmp_path):
    done = _run("--smoke", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "xvocab_cost.json").read_text())
    assert record["benchmark"] == "xvocab_cost" and record["smoke"] is True
    assert (record["environment"], record["episodes"], record["warmup"], record["repeats"]) == (
        "calculator", 4, 1, 2)
    toks = record["tokenizers"]
    assert toks["student"] == toks["topk_teacher"] and toks["student"]["name"] == "toy"
    assert toks["xvocab_teacher"]["name"] == "byte_fallback"
    assert toks["xvocab_teacher"]["vocab"] != toks["student"]["vocab"]
    t = record["totals"]
    # topk scores exactly the student's loss positions of the same episodes.
    assert t["topk_teacher_positions"] == t["student_positions"] > 0
    assert t["topk_teacher_tokens"] == t["student_tokens"] > t["student_positions"]
    assert 0 < t["xvocab_teacher_positions"] < t["xvocab_teacher_tokens"]
    assert 0 < t["xvocab_trained_positions"] <= t["student_positions"]
    assert record["xvocab_trained_share"] == t["xvocab_trained_positions"] / t["student_positions"]
    us = record["us_per_student_position"]
    assert set(us) == {"topk", "xvocab", "topk_teacher_compute", "xvocab_teacher_compute",
                       "xvocab_teacher_plan", "xvocab_student_request", "xvocab_student_map"}
    assert all(_spread_ok(row) for row in us.values())
    assert _spread_ok(record["ratio_xvocab_to_topk"])
    assert _spread_ok(record["ratio_with_student_side"])
    # The student's side only adds to the wire ratio.
    assert record["ratio_with_student_side"]["min"] > record["ratio_xvocab_to_topk"]["min"]
    per_trained = record["us_per_trained_position"]
    assert per_trained["topk"] == us["topk"] and _spread_ok(per_trained["xvocab"])
    assert per_trained["xvocab"]["median"] >= us["xvocab"]["median"] * 0.999
    for kind in ("topk", "xvocab"):  # every request went through the prefix cache
        cache = record["prefix_cache"][kind]
        assert cache["hits"] + cache["misses"] == 3 * record["episodes"], cache
    assert "xvocab / topk per student position" in done.stdout


@pytest.mark.parametrize("args", [["--episodes", "0"], ["--repeats", "0"], ["--k", "0"]])
def test_a_bad_value_is_one_line(args, tmp_path):
    done = _run(*args, "--output-dir", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert args[0] in done.stderr and "must be at least" in done.stderr
    assert not (tmp_path / "xvocab_cost.json").exists()


def test_the_defaults_are_the_measurement_the_page_describes(tmp_path):
    args = bench._args(["--output-dir", str(tmp_path)])
    assert (args.episodes, args.seed, args.warmup, args.repeats, args.k, args.threads) == (
        48, 0, 2, 7, 16, 1)
    assert args.out == tmp_path / "xvocab_cost.json" and not args.smoke
    smoke = bench._args(["--smoke", "--output-dir", str(tmp_path)])
    assert (smoke.episodes, smoke.warmup, smoke.repeats) == (4, 1, 2)
    committed = bench._args(["--update-committed"]).out
    assert committed == ROOT / "benchmarks" / "results" / "xvocab_cost.json"
    section = PAGE.read_text(encoding="utf-8").split("## Cost per position", 1)[1]
    for said in ("48 tasks, seed 0", "k = 16 for both", "two warm-up repeats are discarded and "
                 "seven are timed", "(four episodes, one warm-up, two repeats)",
                 "python benchmarks/xvocab_cost.py --update-committed"):
        assert said in " ".join(section.split()), said


@pytest.mark.slow  # imports torch, saves a model and starts two servers on it
def test_a_teacher_dir_is_served_to_both_arms(tmp_path):
    # --teacher-dir: both servers load one real model directory; topk is asked by a
    # student of that directory's own tokenizer, xvocab by the toy byte student.
    import torch

    from tests.common.cross_tokenizer_kit import byte_fallback_tokenizer
    from tests.toy_kit import TEACHER, bare_qwen3

    tok = byte_fallback_tokenizer()
    torch.manual_seed(3)
    model_dir = tmp_path / "bf-teacher"
    bare_qwen3(TEACHER, vocab=len(tok), max_positions=4096).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    done = _run("--smoke", "--teacher-dir", str(model_dir), "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "xvocab_cost_real.json").read_text())
    assert record["teacher_dir"] == str(model_dir) and record["teacher_shape"] is None
    toks = record["tokenizers"]
    assert toks["student"]["name"] == "toy" and toks["topk_student"] == toks["topk_teacher"]
    assert toks["topk_teacher"]["vocab"] == toks["xvocab_teacher"]["vocab"] == len(tok)
    t = record["totals"]
    # The same tasks, tokenized by each student: the byte student has more positions.
    assert t["topk_teacher_positions"] == t["topk_student_positions"] > 0
    assert t["student_positions"] > t["topk_student_positions"]
    assert all(_spread_ok(record[k]) for k in ("ratio_xvocab_to_topk", "ratio_per_episode"))
    assert all(_spread_ok(row) for row in record["us_per_teacher_position"].values())
    assert "xvocab / topk per episode" in done.stdout


def test_a_teacher_dir_without_a_model_is_one_line(tmp_path):
    done = _run("--teacher-dir", str(tmp_path), "--output-dir", str(tmp_path))
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0
    assert f"--teacher-dir {tmp_path} holds no config.json" in done.stderr
    (tmp_path / "config.json").write_text("{}")
    committed = bench._args(["--teacher-dir", str(tmp_path), "--update-committed"]).out
    assert committed == ROOT / "benchmarks" / "results" / "xvocab_cost_real.json"
