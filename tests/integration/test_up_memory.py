"""Memory strategies of one device (docs/up.md, "Memory strategies on one device"):
``swap`` trains exactly like ``resident``.

The trainer runs in this process against ``FakeTeacherClient`` (the real scoring
function, no sockets) given ``park``/``wake`` methods that record when they are
called. Under ``swap`` the teacher must be awake whenever it scores and parked while
the student updates; the final parameters must be bit-identical to ``resident``, and
``auto`` on CPU must choose ``resident`` and say why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from miniverl.testing import FakeBackend
from miniverl.testing.fake_teacher import FakeTeacherClient
from tests.student.train.trainer_kit import load_toy_teacher
from tests.toy_kit import ONE_TURN, TWO_LAYER, make_recipe, seeded

pytestmark = pytest.mark.integration


class ParkingTeacher(FakeTeacherClient):
    """The fake teacher plus ``park``/``wake``; scoring while parked is an error.

    ``park``/``wake`` land on a ``FakeBackend``, as a served teacher's land on its backend;
    ``calls`` is that backend's record, each ``submit`` added in order.
    """

    def __post_init__(self):
        super().__post_init__()
        self.backend = FakeBackend()
        self.calls = self.backend.calls

    def park(self) -> None:
        self.backend.park()

    def wake(self) -> None:
        self.backend.wake()

    def submit(self, *args, **kwargs):
        assert not self.backend.parked, "a parked teacher was asked to score"
        self.calls.append("submit")
        return super().submit(*args, **kwargs)


def memory_recipe(memory: str, output_dir: Path):
    """One-turn strict OPD, two rollouts a cycle, under teacher memory ``memory``."""
    return make_recipe("opd", output_dir, teacher=seeded(TWO_LAYER, 1), rollouts_per_cycle=2,
                       sections={"run": {"name": f"mem-{memory}"},
                                 "teacher": {"memory": memory},
                                 "rollout": {**ONE_TURN, "batch_size": 2},
                                 "loss": {"top_k": 4}, "runtime": None})


@pytest.fixture(scope="module")
def teacher_model():
    return load_toy_teacher(seeded(TWO_LAYER, 1))


def train(memory: str, tmp_path: Path, teacher_model) -> tuple[list[Any], ParkingTeacher, Path]:
    from miniverl.student.train.trainer import Trainer

    client = ParkingTeacher(teacher_model.model, teacher_model.tokenizer_fp,
                            teacher_model.vocab_size)
    with Trainer(memory_recipe(memory, tmp_path), client=client, show_progress=False,
                 write_report=False, checkpoints=False) as trainer:
        result = trainer.train()
        params = [p.detach().clone() for p in trainer.state.policy.model.parameters()]
    assert result.status == "completed"
    return params, client, result.run_dir


def test_swap_gives_the_resident_parameters(tmp_path, teacher_model):
    # Parking the teacher during updates must not change what the student learns.
    import torch

    resident, r_client, _ = train("resident", tmp_path / "r", teacher_model)
    swapped, s_client, run_dir = train("swap", tmp_path / "s", teacher_model)
    assert len(resident) == len(swapped)
    assert all(torch.equal(a, b) for a, b in zip(resident, swapped, strict=True))
    assert "park" not in r_client.calls and "wake" not in r_client.calls
    # Each cycle: wake, score every rollout, park before the update.
    cycle = ["wake", "submit", "submit", "park"]
    assert s_client.calls == cycle * 3
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    chosen = [e for e in events if e["event"] == "memory_strategy"]
    assert chosen and chosen[0]["chosen"] == "swap"


def test_auto_on_cpu_is_resident_with_a_reason(tmp_path, teacher_model):
    # `auto` decides from measured free accelerator memory; a CPU student has none.
    from miniverl.common.manifest import read_manifest
    from miniverl.common.rundir import RunDir

    _, client, run_dir = train("auto", tmp_path / "a", teacher_model)
    assert "park" not in client.calls
    memory = read_manifest(RunDir.open(run_dir))["memory"]
    assert memory["wanted"] == "auto" and memory["chosen"] == "resident"
    assert "CPU" in memory["reason"]
