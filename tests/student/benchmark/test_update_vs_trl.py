"""One on-policy update, ours against TRL's GKDTrainer (benchmarks/update_vs_trl.py, docs/gpu.md).

Its smallest form runs both arms end to end — our strict OPD through the public
``Trainer`` with a teacher process, TRL's ``GKDTrainer`` (``lmbda: 1``, ``beta: 1``) in
the TRL venv — and writes a record whose split of our update adds up; the recipe it
trains is the update the page describes. Marker ``integration``; the end-to-end test
skips without the TRL venv (``bash tests/teacher_server/setup_trl_venv.sh``).
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

import update_vs_trl as bench  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "update_vs_trl.py"
PYTHON = bench.VENV / "bin" / "python"


def _trl_missing() -> str | None:
    if not PYTHON.is_file():
        return (f"no TRL venv at {bench.VENV}; create it with: bash "
                "tests/teacher_server/setup_trl_venv.sh")
    probe = subprocess.run([str(PYTHON), "-c", "import trl; print(trl.__version__)"],
                           capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() != "1.16.0":
        return f"trl 1.16.0 is not in {bench.VENV}: {(probe.stderr or probe.stdout)[-300:]}"
    return None


@pytest.mark.integration  # a teacher process, two Trainer runs and two TRL runs
def test_both_arms_run_and_the_split_adds_up(tmp_path):
    missing = _trl_missing()
    if missing:
        pytest.skip(missing)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--reps", "2", "--updates", "1", "--batch", "2",
         "--max-new-tokens", "4", "--output-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "update_vs_trl.json").read_text())
    assert record["config"]["trl"] == {
        "trainer": "GKDTrainer", "lmbda": 1.0, "beta": 1.0,
        "threads": {"trl_gkd": 2, "trl_gkd_no_checkpointing": 2, "trl_gkd_1thread": 1},
        "gradient_checkpointing": {"trl_gkd": True, "trl_gkd_no_checkpointing": False,
                                   "trl_gkd_1thread": True}, "version": "1.16.0"}
    runs = record["runs"]
    assert set(runs) == {"ours", "trl_gkd", "trl_gkd_no_checkpointing", "trl_gkd_1thread"}
    assert all([len(r["update_s"]) for r in arm] == [1, 1] for arm in runs.values())
    for run in runs["ours"]:  # the split of each update adds up to the update
        assert math.isclose(run["update_s"][0], run["sampling_s"][0] + run["teacher_wait_s"][0]
                            + run["loss_and_step_s"][0] + run["other_s"][0], abs_tol=1e-9)
        assert 0 < run["sampled_tokens"][0] <= 2 * 4
    ours = record["ours"]
    for arm in ("trl_gkd", "trl_gkd_no_checkpointing", "trl_gkd_1thread"):
        trl = record[arm]
        assert 0 < trl["sampling_s"] < trl["update_s"] and 0 < trl["teacher_s"] < trl["update_s"]
        assert 0 < trl["sampled_tokens"] <= 2 * 4
        assert record[f"ratio_ours_over_{arm}"] == round(ours["update_s"] / trl["update_s"], 3)
    assert [r["threads"] for r in runs["trl_gkd"]] == [2, 2]
    assert [r["threads"] for r in runs["trl_gkd_1thread"]] == [1, 1]
    # GKDConfig's default gradient checkpointing also switches generate's KV cache off.
    assert [(r["gradient_checkpointing"], r["generate_use_cache"]) for r in runs["trl_gkd"]] == [
        (True, False)] * 2
    assert [(r["gradient_checkpointing"], r["generate_use_cache"])
            for r in runs["trl_gkd_no_checkpointing"]] == [(False, True)] * 2
    for run in (run for arm in runs.values() for run in arm):
        assert all(math.isfinite(x) for x in run["loss"])
    assert "ours / GKDTrainer (2 threads) per update" in done.stdout


def test_the_recipe_is_the_update_the_page_describes(tmp_path):
    args = bench._args(["--output-dir", str(tmp_path), "--trl-python", sys.executable])
    assert (args.reps, args.updates, args.batch, args.max_new_tokens) == (3, 4, 8, 32)
    recipe = bench.build_recipe(args, tmp_path)
    assert recipe.run.mode == "opd" and recipe.student.lora is None
    assert (recipe.loss.objective, recipe.loss.divergence) == ("exact_full_vocab", "reverse_kl")
    assert recipe.rollout.max_turns == 1 and recipe.rollout.temperature == 1.0
    assert recipe.train.rollouts_per_cycle == recipe.rollout.batch_size == 8
    assert recipe.train.updates_per_batch == 1 and recipe.train.lr == bench.LR
    assert recipe.train.cycles == 5 and recipe.train.max_grad_norm == bench.MAX_GRAD_NORM
    assert recipe.runtime.cpu_threads == 1 and bench.THREADS_TOTAL == 2
    assert recipe.teacher.model.toy.model_dump(include=set(bench.TEACHER)) == bench.TEACHER


def test_a_missing_trl_venv_is_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--trl-python", str(tmp_path / "nope"), "--output-dir",
         str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0
    assert "setup_trl_venv.sh" in done.stderr and "Traceback" not in done.stderr
