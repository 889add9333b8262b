"""The trainer against a real ``python -m miniverl.teacher_server`` process over ipc.

One teacher process serves the whole module (its start costs seconds of imports):
strict OPD trains on replies from it, every reply tagged with the version being
updated and identical to the in-process reference scorer; offline KD asks it once per
fixed trajectory; the run records which teacher process (instance, gen) supervised it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "student" / "train"))

from trainer_kit import (  # noqa: E402
    TEACHER,
    LossRecorder,
    events,
    load_toy_teacher,
    make_recipe,
    metrics,
)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """``(endpoint, process)`` of one toy teacher serving over ipc."""
    from miniverl.common.recipe_models import ToySpec
    from miniverl.common.toy import toy_model_dir
    from miniverl.protocol.sync_client import SyncTeacherClient

    root = tmp_path_factory.mktemp("teacher")
    endpoint = f"ipc://{root}/teacher.sock"
    model_dir = toy_model_dir(ToySpec(**TEACHER))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = root / "teacher.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "miniverl.teacher_server", "--model", str(model_dir), "--bind",
         endpoint, "--threads", "1", "--device", "cpu", "--dtype", "float32", "--log",
         str(log)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        yield endpoint, proc
    finally:
        admin = SyncTeacherClient(endpoint, tokenizer_fp=None, vocab_size=0,
                                  request_timeout_s=5, unavailable_timeout_s=10)
        try:
            if proc.poll() is None:
                admin.shutdown(mode="abort")
        except Exception:  # a teacher that cannot answer is killed below
            pass
        finally:
            admin.close()
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="module")
def toy():
    return load_toy_teacher()


def train(recipe, endpoint, monkeypatch):
    from miniverl.student.train.trainer import Trainer

    trainer = Trainer(recipe, teacher_endpoint=endpoint, show_progress=False,
                      write_report=False)
    recorder = LossRecorder(trainer).install(monkeypatch)
    with trainer:
        result = trainer.train()
    return trainer, result, recorder


def test_strict_opd_against_a_teacher_process(tmp_path, teacher, toy, monkeypatch):
    endpoint, proc = teacher
    recipe = make_recipe("opd", tmp_path, cycles=3)
    trainer, result, recorder = train(recipe, endpoint, monkeypatch)
    assert proc.poll() is None
    assert result.status == "completed" and result.final_version == result.steps == 3
    assert [c["version"] for c in recorder.calls] == [0, 1, 2]
    for call in recorder.calls:
        for traj, positions, arrays, version, _ in call["scored"]:
            assert traj.policy_version == version == call["version"]
            ref = toy.reference(traj, positions, k=recipe.loss.top_k)
            # Same weights, same function, fp32 both sides: the wire adds no error.
            assert (arrays["ids"] == ref["ids"]).all()
            assert abs(arrays["logprobs"] - ref["logprobs"]).max() < 1e-5
    rows = metrics(result.run_dir)
    instance = rows[0]["teacher"]["instance"]
    assert all(r["teacher"]["instance"] == instance and r["teacher"]["gen"] == 0 for r in rows)
    assert all(r["on_policy"] and r["stale_dropped"] == 0 and r["bytes_received"] > 0
               for r in rows)
    assert len(events(result.run_dir, "teacher_connected")) == 1
    assert result.counters["received"] >= 3 * recipe.train.rollouts_per_cycle


def test_offline_kd_against_a_teacher_process(tmp_path, teacher, monkeypatch):
    endpoint, _ = teacher
    recipe = make_recipe("offline_kd", tmp_path, cycles=3)
    _, result, recorder = train(recipe, endpoint, monkeypatch)
    assert result.status == "completed" and result.final_version == 3
    scored = events(result.run_dir, "offline_targets_scored")
    assert scored[0]["trajectories"] == recipe.environment.train_tasks
    assert {s[3] for call in recorder.calls for s in call["scored"]} == {0}
    assert all(r["on_policy"] is False for r in metrics(result.run_dir))
    # Targets went to the run's cache, keyed by the teacher process that made them.
    assert any((result.run_dir / "targets").iterdir())
