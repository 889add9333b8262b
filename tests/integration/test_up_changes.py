"""Teacher changes that land *between* updates are recorded like those during one.

Under ``up`` a reload or a restart often happens while the student computes its update
or evaluates, when no request is bound to the teacher: the next update then binds to
the new teacher without any reply being dropped. The run must still say so (a
``teacher_changed`` event and a manifest version range), and a retarget must be
recorded once, not also as a restart. The trainer runs in this process against
``FakeTeacherClient``; the change is made from inside the update.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.student.train.trainer_kit import load_toy_teacher
from tests.toy_kit import ONE_TURN, TWO_LAYER, make_recipe, seeded

pytestmark = pytest.mark.integration


def changes_recipe(output_dir: Path, cycles: int):
    """One-turn strict OPD, one rollout a cycle (not deterministic, default runtime)."""
    return make_recipe("opd", output_dir, teacher=seeded(TWO_LAYER, 1), cycles=cycles,
                       rollouts_per_cycle=1,
                       sections={"run": {"name": "changes", "deterministic": False},
                                 "rollout": {**ONE_TURN, "batch_size": 1},
                                 "loss": {"top_k": 4}, "runtime": None})


@pytest.fixture(scope="module")
def teacher_model():
    return load_toy_teacher(seeded(TWO_LAYER, 1))


def test_changes_between_updates_are_recorded(tmp_path, teacher_model, monkeypatch):
    import miniverl.student.train.updates as steps_module
    from miniverl.student.train.trainer import Trainer

    client = teacher_model.fake_client()
    real_step = steps_module.distill_step
    live: dict = {}

    def step_then_change(*args, **kwargs):
        stats = real_step(*args, **kwargs)
        if kwargs["objective"].kind == "none":  # an SFT step: not a distillation update
            return stats
        trainer = live["trainer"]
        if trainer.version == 0:
            client.gen += 1  # `teacher reload` lands while the student updates
        elif trainer.version == 1:
            client.instance, client.gen = uuid.uuid4().hex, 0  # a restart, same endpoint
        elif trainer.version == 2:
            trainer.request_retarget("tcp://127.0.0.1:5556")  # applied at the boundary
        return stats

    monkeypatch.setattr(steps_module, "distill_step", step_then_change)
    with Trainer(changes_recipe(tmp_path, cycles=5), client=client, show_progress=False,
                 write_report=False, checkpoints=False) as trainer:
        live["trainer"] = trainer
        assert trainer.train().status == "completed"
        run_dir = trainer.run.path
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    changes = [(e["how"], e["version"]) for e in events if e["event"] == "teacher_changed"]
    assert changes == [("reload", 1), ("restart", 2), ("retarget", 3)], changes
    manifest = json.loads((run_dir / "manifest.json").read_text())
    ranges = [(t["how"], t["from_version"], t["to_version"]) for t in manifest["teachers"]]
    assert ranges == [("connect", 0, 0), ("reload", 1, 1), ("restart", 2, 2),
                      ("retarget", 3, 4)], ranges  # closed at the end (final version 5)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # Each update's metrics row names the teacher that scored it.
    assert metrics[1]["teacher"]["gen"] == 1 and metrics[2]["teacher"]["gen"] == 0
    assert metrics[1]["teacher"]["instance"] != metrics[2]["teacher"]["instance"]
