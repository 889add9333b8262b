"""Run directory: layout, one lock per run, legal status transitions, atomic writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from miniverl.common.atomic import atomic_write_json, atomic_write_text
from miniverl.common.errors import ConfigError, RunLockedError
from miniverl.common.manifest import (
    finish_manifest,
    read_manifest,
    record_teacher,
    update_manifest,
)
from miniverl.common.recipe import Recipe, load_recipe, recipe_digest
from miniverl.common.rundir import RunDir


@pytest.fixture
def recipe() -> Recipe:
    return Recipe.model_validate(
        {
            "run": {"name": "unit", "mode": "opd", "seed": 7},
            "student": {"model": {"toy": {}}, "device": "cpu"},
            "teacher": {"model": {"toy": {}}, "device": "cpu"},
        }
    )


@pytest.fixture
def run(tmp_path, recipe) -> RunDir:
    return RunDir.create(tmp_path / "runs", recipe, recipe_text="# as submitted\n")


def test_create_lays_out_the_run(run, recipe):
    assert run.id.startswith("unit-")
    for name in ("recipe.yaml", "recipe.resolved.yaml", "manifest.json", "status.json"):
        assert (run.path / name).is_file(), name
    for sub in (run.eval_dir, run.targets_dir, run.checkpoints_dir, run.logs_dir):
        assert sub.is_dir()
    assert run.recipe_path.read_text() == "# as submitted\n"
    assert recipe_digest(load_recipe(run.resolved_recipe_path)) == recipe_digest(recipe)
    manifest = read_manifest(run)
    assert manifest["recipe_digest"] == recipe_digest(recipe)
    assert manifest["seeds"]["run"] == 7 and manifest["on_policy"] is True
    assert manifest["models"]["student"]["source"] == "toy"
    assert run.status == "ready"
    assert RunDir.open(run.path).id == run.id


def test_run_ids_are_unique(tmp_path, recipe):
    ids = {RunDir.create(tmp_path, recipe).id for _ in range(5)}
    assert len(ids) == 5
    with pytest.raises(ConfigError, match="already exists"):
        RunDir.create(tmp_path, recipe, run_id=next(iter(ids)))


def test_open_refuses_a_non_run(tmp_path):
    with pytest.raises(ConfigError, match="not a miniverl run"):
        RunDir.open(tmp_path)


def test_status_transitions(run):
    run.set_status("running")
    run.set_status("interrupted", reason="SIGINT")
    assert run.read_status()["reason"] == "SIGINT"
    run.set_status("running")  # resume
    run.set_status("completed")
    for illegal in ("running", "failed", "ready"):
        with pytest.raises(ConfigError, match="cannot go from 'completed'"):
            run.set_status(illegal)
    with pytest.raises(ConfigError, match="unknown run status"):
        run.set_status("paused")


def test_ready_cannot_complete_and_running_cannot_go_back(tmp_path, recipe):
    run = RunDir.create(tmp_path, recipe)
    with pytest.raises(ConfigError):
        run.set_status("completed")
    run.set_status("running")
    with pytest.raises(ConfigError):
        run.set_status("ready")


def test_lock_is_exclusive_in_process(run):
    with run.lock():
        assert run.locked_by_me
        other = RunDir.open(run.path)
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
            other.lock()
    assert not run.locked_by_me
    with RunDir.open(run.path).lock():
        pass


@pytest.mark.integration
def test_second_process_fails_fast_naming_the_holder(run):
    # Two writers on one run would interleave checkpoints; the second must stop at once.
    code = textwrap.dedent(
        f"""
        import sys, time
        from miniverl.common.rundir import RunDir
        run = RunDir.open({str(run.path)!r})
        run.lock()
        print("locked", flush=True)
        sys.stdin.readline()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError) as info:
            RunDir.open(run.path).lock()
        assert f"pid {child.pid}" in str(info.value)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    # The kernel drops the lock with its holder: no stale-lock cleanup needed.
    with RunDir.open(run.path).lock():
        pass


def test_events_and_metrics_append(run):
    run.event("run_started", version=0)
    run.event("checkpoint", path="checkpoints/v1", version=1)
    run.metric({"step": 1, "loss": 0.5})
    events = run.events()
    assert [e["event"] for e in events] == ["run_started", "checkpoint"]
    assert all("ts" in e for e in events)
    assert run.metrics()[0]["loss"] == 0.5
    with run.metrics_path.open("a") as fh:
        fh.write('{"step": 2, "lo')  # a writer killed mid-line
    assert len(run.metrics()) == 1


def test_manifest_updates_and_teacher_ranges(run):
    update_manifest(run, tokenizer_fp="sha256:abc")
    record_teacher(run, 0, {"name": "t1", "instance": "i1", "gen": 0}, how="start")
    record_teacher(run, 5, {"name": "t2", "instance": "i1", "gen": 1}, how="reload")
    manifest = read_manifest(run)
    assert manifest["tokenizer_fp"] == "sha256:abc"
    assert [(t["from_version"], t["to_version"]) for t in manifest["teachers"]] == [
        (0, 4),
        (5, None),
    ]


def test_finishing_a_run_closes_the_last_teacher_range_and_counts_policy_steps(run, recipe):
    record_teacher(run, 12, {"name": "t1", "instance": "i1", "gen": 0}, how="connect")
    finish_manifest(run, 42, mode_on_policy=recipe.on_policy, on_policy_steps=30,
                    off_policy_steps=12)
    manifest = read_manifest(run)
    # The last teacher scored versions 12..41; version 42 is the result.
    assert [(t["from_version"], t["to_version"]) for t in manifest["teachers"]] == [(12, 41)]
    # 12 warm-up steps were off-policy: the run was not on-policy, whatever its mode.
    assert manifest["steps"] == {"on_policy": 30, "off_policy": 12}
    assert manifest["on_policy"] is False and manifest["final_version"] == 42
    # A resumed run connects again: a new range opens after the closed one.
    record_teacher(run, 42, {"name": "t1", "instance": "i2", "gen": 0}, how="connect")
    finish_manifest(run, 50, mode_on_policy=True, on_policy_steps=38, off_policy_steps=0)
    manifest = read_manifest(run)
    assert [(t["from_version"], t["to_version"]) for t in manifest["teachers"]] == [
        (12, 41), (42, 49)]
    assert manifest["on_policy"] is True


def test_the_plan_is_not_on_policy_when_a_warm_up_comes_first(tmp_path, recipe):
    warm = recipe.model_copy(
        update={"train": recipe.train.model_copy(update={"sft_warmup_steps": 5})})
    run = RunDir.create(tmp_path / "warm", warm)
    assert read_manifest(run)["on_policy"] is False


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    path = tmp_path / "state.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(ValueError):
        atomic_write_json(path, {"a": float("nan")})  # not valid JSON
    assert json.loads(path.read_text()) == {"a": 1}
    atomic_write_text(path, "x")
    assert path.read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp files left


def test_a_row_holding_a_line_separator_character_is_read_whole(run):
    # json.dumps(ensure_ascii=False) leaves U+2028 and U+0085 raw inside a string; a
    # reader splitting with str.splitlines lost the row.
    run.event("tool_output", text="a\u2028b\x85c")
    run.event("after")
    rows = run.read_jsonl("events.jsonl")
    assert [r["event"] for r in rows][-2:] == ["tool_output", "after"]
    assert rows[-2]["text"] == "a\u2028b\x85c"
