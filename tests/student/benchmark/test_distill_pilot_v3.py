"""The pilot of the distillation benchmark's version 3 (benchmarks/distill_pilot_v3.py).

A reader of docs/distillbench-history.md's "Version 3" trusts that each N was judged by the gates
the benchmark itself checks (plateau: last two T=1 validation evaluations within the
tolerance; margin: the teacher's T=1 at least the margin above the plateau), that the
choice is the preregistered rule, that a bad config is one line, and that the smoke form
runs on a fresh clone as the docs write it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import distill_pilot_v3 as pilot  # noqa: E402

GATES = pilot.PilotGates(plateau_tolerance=0.02, teacher_margin=0.15, warm_floor=0.2)


def _run(n: int, curve: list[float]) -> dict:
    return {"n": n, "evals": [{"update": 200 * (i + 1), "t1": v, "greedy": 0.9}
                              for i, v in enumerate(curve)]}


def test_each_n_is_judged_by_the_benchmarks_gates_and_the_rule_chooses():
    runs = [_run(256, [0.05, 0.10, 0.11]),   # plateau, margin, but cold
            _run(512, [0.40, 0.60, 0.61]),   # all three hold
            _run(1024, [0.70, 0.85, 0.90]),  # still rising, and no margin
            _run(2048, [0.70, 0.86, 0.87])]  # a plateau without a margin
    for run in runs:
        run["gates"] = pilot.judge(run, 0.945, GATES)
    by_n = {r["n"]: r["gates"] for r in runs}
    assert by_n[512]["plateau"] == 0.61 and by_n[512]["margin"] == pytest.approx(0.335)
    assert by_n[512]["plateau_holds"] and by_n[512]["margin_holds"] and by_n[512]["warm"]
    assert not by_n[256]["warm"]
    assert not by_n[1024]["plateau_holds"] and "not at a plateau" in by_n[1024]["plateau_holds_why"]
    assert by_n[2048]["plateau_holds"] and not by_n[2048]["margin_holds"]
    assert pilot.choose(runs)["n"] == 512 and pilot.choose(runs)["passing"] == [512]
    assert pilot.choose(runs[2:])["n"] is None


def test_a_bad_pilot_config_is_one_line(tmp_path):
    good = (ROOT / "benchmarks/distill/pilot_v3.yaml").read_text()
    bad = tmp_path / "pilot.yaml"
    bad.write_text(good.replace("eval_every: 200", "eval_every: 300"))
    with pytest.raises(SystemExit, match=r"train\.eval_every 300 does not divide train\.cycles "
                                          r"800"):
        pilot.load_config(bad)
    bad.write_text(good.replace("plateau_tolerance: 0.02", "plateau_tolerance: 0"))
    with pytest.raises(SystemExit, match=r"gates\.plateau_tolerance"):
        pilot.load_config(bad)
    with pytest.raises(SystemExit, match=r"--only \[3\] is not in the config's data_prompts"):
        pilot.main(["--only", "3"])


def test_the_record_prints_as_the_docs_table(tmp_path, capsys):
    run = _run(512, [0.40, 0.60, 0.61])
    run.update(teacher_set={"episodes": 512, "success": 0.941}, wall_s=400.4)
    run["gates"] = pilot.judge(run, 0.945, GATES)
    record = tmp_path / "r.json"
    record.write_text(json.dumps({"gates": GATES.model_dump(), "runs": [run]}))
    assert pilot.main(["--report", "--record", str(record), "--commit", "abc1234"]) == 0
    out = capsys.readouterr().out
    assert ("| 512 | 512 (0.941) | 200: 0.400, 400: 0.600, 600: 0.610 | 0.900 | 0.610 | 0.010 | "
            "+0.335 | yes | 400 |") in out
    assert f"<!-- table: {record} @ abc1234 by python benchmarks/distill_pilot_v3.py" in out


@pytest.mark.slow
def test_the_smoke_pilot_runs_on_a_fresh_clone(tmp_path):
    out = tmp_path / "pilot"
    done = subprocess.run([sys.executable, "benchmarks/distill_pilot_v3.py", "--config",
                           "benchmarks/smoke/distill_pilot_v3.yaml", "--output-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((out / "distill_pilot_v3.json").read_text())
    assert [r["n"] for r in record["runs"]] == [4, 8]
    assert all(len(r["evals"]) == 2 and r["teacher_set"]["episodes"] == r["n"]
               for r in record["runs"])
    assert "choice" in record and record["config"] == "benchmarks/smoke/distill_pilot_v3.yaml"
    # Each N names the machine it trained on: one recipe trains another student elsewhere.
    assert all(r["machine"]["cpu_model"] and r["machine"]["transformers"]
               for r in record["runs"])
