"""Same seed, same weights: the shipped ``recipes/toy_cpu_opd.yaml``, shortened, run
with ``miniverl up`` twice and once interrupted (Ctrl-C) then resumed, ends in three
bitwise-equal final checkpoints (every tensor: weights, optimizer moments, RNG states).

This is what ``run.deterministic: true`` promises (docs/up.md, "Reruns and resumes"):
pipelined scoring with the teacher coalescing requests by arrival time used to make
two runs differ from the first distillation step on (max 1.2e-7); a deterministic
student now asks the teacher to score each SCORE alone, without the prefix cache.

The copy keeps every setting of the shipped recipe (pipelining, batch sizes, loss,
the teacher's shape and the coalescing teacher's defaults) except its length (fewer
warm-up steps and cycles, a smaller eval split) and the teacher preparation (an SFT of
minutes, cached per machine): the teacher is the untrained toy of the same shape.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from benchmarks.behaviour_hashes import checkpoint_sha256  # the hash docs/checkpoints.md shows
from tests.toy_kit import MINIVERL, write_recipe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 300.0
WARMUP, CYCLES = 3, 6


@pytest.fixture(scope="module")
def work():
    path = Path(tempfile.mkdtemp(prefix="mvl", dir="/tmp"))  # ipc paths must fit 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def recipe_path(work):
    data = yaml.safe_load((ROOT / "recipes" / "toy_cpu_opd.yaml").read_text())
    assert data["run"]["deterministic"] is True  # what the shipped recipe says
    data["run"]["output_dir"] = str(work / "runs")
    for key in ("prepare", "min_success"):
        data["teacher"].pop(key)
    data["environment"].update(eval_tasks=4, test_tasks=4)
    data["train"].update(sft_warmup_steps=WARMUP, cycles=CYCLES)
    return write_recipe(work / "toy_cpu_opd_short.yaml", data)


def up(recipe: Path, run_id: str, *extra: str, log: Path) -> subprocess.Popen:
    cmd = [*MINIVERL, "up", str(recipe), "--run-id", run_id, "--quiet", *extra]
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, log: Path) -> int:
    try:
        return proc.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"`up` did not exit within {WAIT_S:g} s:\n{log.read_text()[-3000:]}")


def last_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except ValueError:  # a line still being written
            continue
        if row.get("phase") == "train":
            steps.append(row["step"])
    return max(steps, default=0)


def test_reruns_and_a_resumed_run_are_bitwise_equal(work, recipe_path):
    runs = work / "runs"
    hashes = {}
    for run_id in ("first", "second"):
        log = work / f"{run_id}.out"
        assert finish(up(recipe_path, run_id, log=log), log) == 0, log.read_text()[-3000:]
        hashes[run_id] = checkpoint_sha256(runs / run_id)
    assert hashes["first"] == hashes["second"]
    assert hashes["first"][1] == f"step_{WARMUP + CYCLES}"

    # Ctrl-C once distillation has begun; up checkpoints at the update boundary, exits 130.
    log = work / "resumed.out"
    proc = up(recipe_path, "resumed", log=log)
    deadline = time.monotonic() + WAIT_S
    while last_step(runs / "resumed") <= WARMUP:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert finish(proc, log) == 130, log.read_text()[-3000:]
    stopped_at = checkpoint_sha256(runs / "resumed")[1]
    assert WARMUP < int(stopped_at.removeprefix("step_")) < WARMUP + CYCLES, \
        "the stop must land mid-distillation for this test to mean anything"
    assert finish(up(recipe_path, "resumed", "--resume", log=log), log) == 0
    assert checkpoint_sha256(runs / "resumed") == hashes["first"]
