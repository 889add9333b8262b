"""The trainer against a real ``python -m miniverl.teacher_server`` process over ipc.

One teacher process serves the whole module (its start costs seconds of imports):
strict OPD trains on replies from it, every reply tagged with the version being
updated and identical to the in-process reference scorer; offline KD asks it once per
fixed trajectory; the run records which teacher process (instance, gen) supervised it.
"""

from __future__ import annotations

import pytest
import torch

from tests.student.train.trainer_kit import LossRecorder, load_toy_teacher
from tests.toy_kit import TEACHER, events, make_recipe, metrics, started_teacher, toy_dir

pytestmark = pytest.mark.integration

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """``(endpoint, process)`` of one toy teacher serving over ipc."""
    folder = tmp_path_factory.mktemp("teacher")
    with started_teacher(toy_dir(TEACHER), folder, extra=["--dtype", "float32"]) as served:
        yield served.endpoint, served.proc


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
