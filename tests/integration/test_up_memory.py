"""Memory strategies of one device (DESIGN §4): ``swap`` trains exactly like ``resident``.

The trainer runs in this process against ``FakeTeacherClient`` (the real scoring
function, no sockets) given ``park``/``wake`` methods that record when they are
called. Under ``swap`` the teacher must be awake whenever it scores and parked while
the student updates; the final parameters must be bit-identical to ``resident``, and
``auto`` on CPU must choose ``resident`` and say why.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "student" / "train"))

from fake_teacher import FakeTeacherClient  # noqa: E402

pytestmark = pytest.mark.integration

TOY = {"hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 64}


class ParkingTeacher(FakeTeacherClient):
    """The fake teacher plus ``park``/``wake``; scoring while parked is an error."""

    def __post_init__(self):
        super().__post_init__()
        self.calls: list[str] = []
        self.parked = False

    def park(self) -> None:
        self.calls.append("park")
        self.parked = True

    def wake(self) -> None:
        self.calls.append("wake")
        self.parked = False

    def submit(self, *args, **kwargs):
        assert not self.parked, "a parked teacher was asked to score"
        self.calls.append("submit")
        return super().submit(*args, **kwargs)


def make_recipe(memory: str, output_dir: Path):
    from miniverl.common.recipe import Recipe

    return Recipe.model_validate({
        "run": {"name": f"mem-{memory}", "mode": "opd", "seed": 0,
                "output_dir": str(output_dir), "deterministic": True},
        "student": {"model": {"toy": {**TOY, "seed": 0}}, "dtype": "float32", "device": "cpu",
                    "lora": None},
        "teacher": {"model": {"toy": {**TOY, "seed": 1}}, "dtype": "float32", "device": "cpu",
                    "memory": memory},
        "environment": {"name": "calculator", "difficulty": "easy", "train_tasks": 8,
                        "eval_tasks": 2, "test_tasks": 2},
        "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 8, "max_total_tokens": 512,
                    "batch_size": 2},
        "loss": {"objective": "bucketed_topk_tail", "top_k": 4},
        "train": {"cycles": 3, "rollouts_per_cycle": 2, "lr": 1e-3, "eval_every": 0,
                  "save_every": 0},
    })


@pytest.fixture(scope="module")
def teacher_model():
    from miniverl.common.modeling import load_causal_lm, load_tokenizer
    from miniverl.common.recipe_models import ToySpec
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.common.toy import toy_model_dir

    model_dir = toy_model_dir(ToySpec(**TOY, seed=1))
    model = load_causal_lm(model_dir, dtype="float32", device="cpu")
    model.eval()
    tokenizer = load_tokenizer(model_dir)
    return model, fingerprint_tokenizer(tokenizer), len(tokenizer)


def train(memory: str, tmp_path: Path, teacher_model) -> tuple[list[Any], ParkingTeacher, Path]:
    from miniverl.student.train.trainer import Trainer

    client = ParkingTeacher(*teacher_model)
    with Trainer(make_recipe(memory, tmp_path), client=client, show_progress=False,
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
