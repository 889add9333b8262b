"""The demo's live board follows both processes through their files, phase by phase,
and the demo's time split adds up from the run's timestamps."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

from rich.console import Console

from miniverl.cli.demo import recipes, summary_lines, time_split, write_recipes
from miniverl.cli.demo_board import Board
from miniverl.common.jsonl_tail import JsonlTail
from miniverl.common.recipe import load_recipe


def _append(path, *rows):
    with path.open("a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def _ts(second: float) -> str:
    return f"2026-12-01T10:00:{second:06.3f}Z"


def _setup(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    final = tmp_path / "teachers" / "prepared-abc"
    prep_metrics = tmp_path / "teachers" / ".prepared-abc-x1" / "runs" / "r" / "metrics.jsonl"
    prep_metrics.parent.mkdir(parents=True)
    sup = SimpleNamespace(teacher_phase="starting", teacher_model_dir=final,
                          run=SimpleNamespace(path=run, metrics_path=run / "metrics.jsonl"))
    board = Board(sup, Console(file=io.StringIO()), prep_total=3, cycles=2, warmup=10)
    return sup, board, run, prep_metrics


def test_the_board_walks_through_both_processes_phases(tmp_path):
    sup, board, run, prep = _setup(tmp_path)
    assert board.student_text()[0] == "starting"
    sup.teacher_phase = "preparing"
    _append(prep, {"step": 1, "loss": 2.5})
    board.poll()
    assert board.teacher_text() == ("preparing", "SFT step 1/3  loss 2.5000")
    _append(run / "events.jsonl", {"ts": _ts(1), "event": "run_started"})
    board.poll()
    assert board.student_text()[0] == "eval before"
    _append(run / "events.jsonl", {"ts": _ts(2), "event": "eval", "version": 0, "success": 0.0})
    _append(run / "metrics.jsonl", {"step": 4, "phase": "sft_warmup", "loss": 0.3})
    _append(prep, {"step": 3, "loss": 0.01})
    board.poll()
    assert board.student_text() == ("SFT warm-up", "step 4  loss 0.3000  (eval before: success 0%)")
    assert board.teacher_text()[0] == "qualifying"  # its steps are done; its eval runs
    sup.teacher_phase = "serving"
    _append(run / "events.jsonl", {"ts": _ts(3), "event": "teacher_prepared", "cached": False,
                                   "eval_success": 0.97})
    _append(run / "events.jsonl", {"ts": _ts(4), "event": "sft_warmup_done", "step": 5})
    board.poll()
    assert board.teacher_text() == ("serving", "prepared, held-out success 97%")
    assert board.student_text()[0] == "waiting for the teacher"
    _append(run / "metrics.jsonl", {"step": 6, "phase": "train", "loss": 0.05,
                                    "train_success": 0.75, "positions_scored": 100,
                                    "bytes_sent": 4000, "bytes_received": 9000,
                                    "stale_dropped": 0})
    board.poll()
    assert board.student_text() == ("strict OPD", "update 1/2  loss 0.0500  rollout success 75%")
    assert board.wire_text().startswith("100 positions scored  4 KB sent  9 KB received  0 stale")
    _append(run / "metrics.jsonl", {"step": 7, "phase": "train", "positions_scored": 50})
    board.poll()
    assert board.student_text()[0] == "eval after"
    assert board.state.positions_scored == 150
    _append(run / "events.jsonl", {"ts": _ts(9), "event": "eval", "version": 7, "success": 0.94},
            {"ts": _ts(9.5), "event": "run_completed"})
    board.poll()
    assert board.student_text() == ("done", "success 0% -> 94%")


def test_without_a_terminal_the_board_prints_one_line_per_phase_change(tmp_path):
    sup, board, run, _ = _setup(tmp_path)
    out = io.StringIO()
    board.console = Console(file=out, force_terminal=False, width=200)
    with board:
        _append(run / "events.jsonl", {"ts": _ts(1), "event": "run_started"})
    lines = out.getvalue().splitlines()
    assert any(line.endswith("student  eval before: greedy eval on the held-out tasks")
               for line in lines), lines
    assert sum("teacher  starting" in line for line in lines) == 1


def test_a_half_written_line_waits_and_a_bad_line_is_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    assert tail.read() == []  # not written yet
    path.write_text('{"a": 1}\nnot json\n{"b": ')
    assert tail.read() == [{"a": 1}]
    with path.open("a") as fh:
        fh.write("2}\n")
    assert tail.read() == [{"b": 2}]


def test_time_split_from_the_run_timestamps():
    events = [
        {"ts": _ts(1), "event": "run_started"},
        {"ts": _ts(3), "event": "eval"},
        {"ts": _ts(20), "event": "sft_warmup_done"},
        {"ts": _ts(25), "event": "teacher_prepared", "wall_s": 22.5},
        {"ts": _ts(25.5), "event": "teacher_connected"},
        {"ts": _ts(40), "event": "eval"},
        {"ts": _ts(40.5), "event": "run_completed"},
    ]
    metrics = [{"phase": "sft_warmup", "ts": _ts(10)},
               {"phase": "train", "ts": _ts(30), "time_rollout_s": 2.0, "time_update_s": 1.0},
               {"phase": "train", "ts": _ts(38), "time_rollout_s": 2.5,
                "time_teacher_wait_s": 0.5}]
    t = time_split(events, metrics)
    assert (t["eval_before"], t["warmup"], t["waiting"]) == (2.0, 17.0, 5.5)
    assert (t["opd"], t["eval_after"], t["teacher_prep"]) == (12.5, 2.0, 22.5)
    assert (t["rollout"], t["teacher_wait"], t["update"]) == (4.5, 0.5, 1.0)


def test_the_demo_recipes_validate_and_the_seed_reaches_the_run(tmp_path):
    main = write_recipes(tmp_path, seed=7)
    recipe = load_recipe(main)
    assert recipe.run.seed == 7 and recipe.teacher.min_success == 0.9
    assert recipe.train.sft_warmup_until_loss is not None
    fast = load_recipe(write_recipes(tmp_path / "fast", fast=True))
    assert fast.train.sft_warmup_steps == 0 and fast.teacher.min_success is None
    prep, run = recipes()
    assert prep["student"]["model"] == run["teacher"]["model"]


def test_the_fast_summary_says_it_does_not_learn(tmp_path):
    s = {"mode": "opd", "on_policy": "yes", "steps": 8, "warmup_steps": 0, "opd_updates": 8,
         "version": 8, "success_before": {"success": 0.0}, "success_after": {"success": 0.0},
         "teacher": {"name": "t", "instance": "abcdef123", "gen": 0}, "teacher_success": 0.0,
         "teacher_cached": True, "teacher_prep_steps": 12, "positions_scored": 10,
         "bytes_received": 100, "stale_dropped": 0, "tokens_trainable": 5, "tokens_context": 9,
         "fast": True, "time": {k: 1.0 for k in ("teacher_prep", "start", "eval_before",
                                                  "warmup", "waiting", "opd", "rollout",
                                                  "teacher_wait", "update", "eval_after", "end")}}
    text = "\n".join(summary_lines(tmp_path, s, 20.0))
    assert "--fast shows the machinery only" in text
    assert "preparation cached" in text
