"""benchmarks/several_up.py reads what a run under ``miniverl up`` recorded: each domain
before and after, each route's counters from the last metrics row, and how many teacher
processes stood behind the routes (``manifest.json``'s instances). The runs themselves
are what tests/integration/test_up_teachers.py checks; this checks the reading."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import several_up  # noqa: E402


def _write(run: Path, instances: dict[str, str]) -> None:
    run.mkdir(parents=True)
    evals = [{"event": "eval", "version": 0, "success": 0.25,
              "by_environment": {"calculator": {"success": 0.5}, "jsonnav": {"success": 0.0}}},
             {"event": "eval", "version": 60, "success": 0.75,
              "by_environment": {"calculator": {"success": 1.0}, "jsonnav": {"success": 0.5}}}]
    counters = {name: {"episodes": 8 * (i + 1), "positions_scored": 100, "stale_dropped": 0,
                       "held_back": 0, "wait_s": 0.5, "bytes_sent": 1}
                for i, name in enumerate(instances)}
    rows = [{"mode": "opd", "phase": "sft_warmup", "step": 1},
            {"mode": "opd", "step": 2, "stale_dropped": 0, "by_teacher": {}},
            {"mode": "opd", "step": 3, "stale_dropped": 0, "by_teacher": counters}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "manifest.json").write_text(json.dumps({"teachers": [
        {"route": r, "instance": i} for r, i in instances.items()]}))
    (run / "status.json").write_text(json.dumps({"status": "completed"}))


def test_a_run_is_read_domain_by_domain_and_route_by_route(tmp_path):
    _write(tmp_path / "two", {"calc": "a", "nav": "b"})
    _write(tmp_path / "one", {"teacher/calc": "c", "teacher/nav": "c"})
    two, one = several_up.read_run(tmp_path / "two"), several_up.read_run(tmp_path / "one")
    assert two["before"]["domains"] == {"calculator": 0.5, "jsonnav": 0.0}
    assert two["after"]["domains"] == {"calculator": 1.0, "jsonnav": 0.5}
    assert (two["warmup_steps"], two["updates"]) == (1, 2)
    assert two["stale_dropped"] == 0 and two["status"] == "completed"
    assert two["routes"]["nav"] == {"episodes": 16, "positions_scored": 100, "stale_dropped": 0,
                                    "held_back": 0, "wait_s": 0.5}
    assert (two["teacher_instances"], one["teacher_instances"]) == (2, 1)


def test_both_forms_are_the_example_from_the_benchmarks_student(tmp_path, monkeypatch):
    import several_bench

    def prepared(settings, config_dir, out_dir):
        assert set(settings.adapters) == {"calc", "nav"}  # the generalist is not prepared
        return {"base": {"model_dir": "/m/base"}, "adapter:calc": {"model_dir": "/m/calc"},
                "adapter:nav": {"model_dir": "/m/nav"}, "student": {"model_dir": "/m/student"}}

    monkeypatch.setattr(several_bench, "prepare_all", prepared)
    paths = several_up.recipes(tmp_path)
    two = yaml.safe_load(paths["two_processes"].read_text())
    one = yaml.safe_load(paths["one_process_two_adapters"].read_text())
    example = yaml.safe_load(several_up.EXAMPLE.read_text())
    for data in (two, one):
        assert data["student"]["model"] == {"path": "/m/student"}
        assert "sft_warmup_steps" not in data["train"]
        assert (data["train"]["cycles"], data["train"]["lr"]) == (64, 1e-3)
    assert set(two["teachers"]) == set(example["teachers"])
    assert all(Path(t["prepare"]).is_file() for t in two["teachers"].values())
    assert "teachers" not in one and one["teacher"]["adapters"] == {"calc": "/m/calc",
                                                                    "nav": "/m/nav"}
    assert [m["adapter"] for m in one["environments"]] == ["calc", "nav"]


def test_reread_without_a_record_is_one_line(tmp_path):
    import pytest

    with pytest.raises(SystemExit) as info:
        several_up.main(["--output-dir", str(tmp_path), "--reread"])
    (line,) = str(info.value).splitlines()
    assert line.startswith("error: --reread needs a record") and "several_up.py first" in line
