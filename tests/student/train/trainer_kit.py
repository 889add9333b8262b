"""Shared pieces of the trainer tests: tiny recipes, a toy teacher, recorders.

Recipes are sized for seconds on one CPU thread: 32-wide two-layer students, a
48-wide teacher, four rollouts per cycle, twelve new tokens per turn. The teacher
model is loaded once per test session and scored in process, either through
``FakeTeacherClient`` (the trainer's client interface, no protocol) or through the
real ``SyncTeacherClient`` over a scripted in-memory transport (``ScriptedTeacher``),
which exercises the client's staleness rule byte for byte.

Not a test module: pytest collects nothing here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fake_teacher import FakeTeacherClient

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "protocol"))

from protocol_fakes import FakeTeacher  # noqa: E402

STUDENT = {"hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 64, "seed": 0}
TEACHER = {"hidden": 48, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 96, "seed": 1}


def recipe_dict(mode: str, output_dir: Path | str, **train: Any) -> dict[str, Any]:
    """A tiny, deterministic recipe as a dict (tests edit it before validating)."""
    recipe: dict[str, Any] = {
        "run": {"name": f"t-{mode}", "mode": mode, "seed": 0, "output_dir": str(output_dir),
                "deterministic": True},
        "student": {"model": {"toy": dict(STUDENT)}, "dtype": "float32", "device": "cpu",
                    "lora": None},
        "environment": {"name": "calculator", "difficulty": "easy", "train_tasks": 8,
                        "eval_tasks": 2, "test_tasks": 2},
        "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 12, "max_total_tokens": 640,
                    "batch_size": 4},
        "loss": {"objective": "bucketed_topk_tail", "top_k": 8},
        "train": {"cycles": 3, "rollouts_per_cycle": 4, "lr": 1e-3, "eval_every": 0,
                  "save_every": 0, **train},
        "runtime": {"heartbeat_ms": 100, "request_timeout_s": 10, "unavailable_timeout_s": 20},
    }
    if mode != "sft":
        recipe["teacher"] = {"model": {"toy": dict(TEACHER)}, "dtype": "float32",
                             "device": "cpu"}
    return recipe


def make_recipe(mode: str, output_dir: Path | str, **train: Any):
    from miniverl.common.recipe import Recipe

    return Recipe.model_validate(recipe_dict(mode, output_dir, **train))


@dataclass
class ToyTeacher:
    """The toy teacher model, its tokenizer fingerprint and vocabulary size."""

    model: Any
    tokenizer_fp: str
    vocab_size: int

    def fake_client(self) -> FakeTeacherClient:
        return FakeTeacherClient(self.model, self.tokenizer_fp, self.vocab_size)

    def reference(self, traj, positions_P, *, k: int, kind: str = "topk") -> dict[str, np.ndarray]:
        """What an honest teacher returns for one trajectory (the in-process scorer)."""
        from miniverl.teacher_server.scoring import score_positions

        tokens = np.asarray(traj.tokens, dtype=np.int32)
        return score_positions(self.model, tokens, np.array([0, len(tokens)], np.int32),
                               np.asarray(positions_P, np.int32), kind=kind, k=k,
                               temperature=1.0, exact_max_vocab=1 << 20)


def load_toy_teacher() -> ToyTeacher:
    from miniverl.common.modeling import load_causal_lm, load_tokenizer
    from miniverl.common.recipe_models import ToySpec
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.common.toy import toy_model_dir

    model_dir = toy_model_dir(ToySpec(**TEACHER))
    model = load_causal_lm(model_dir, dtype="float32", device="cpu")
    model.eval()
    tokenizer = load_tokenizer(model_dir)
    return ToyTeacher(model, fingerprint_tokenizer(tokenizer), len(tokenizer))


@dataclass
class LossRecorder:
    """Wraps ``distill_step`` where every distillation update calls it
    (``modes/opd.py``): what reached the loss, and at which version."""

    trainer: Any = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def install(self, monkeypatch) -> LossRecorder:
        import miniverl.student.train.modes.opd as opd_module

        real = opd_module.distill_step

        def recording(policy, optimizer, scheduler, scored, **kw):
            self.calls.append({
                "version": self.trainer.version,
                "cycle": self.trainer.state.cycle,
                "scored": [(s.traj, np.array(s.positions_P), {k: np.array(v) for k, v in
                            s.arrays.items()}, s.student_version, dict(s.teacher))
                           for s in scored],
            })
            return real(policy, optimizer, scheduler, scored, **kw)

        monkeypatch.setattr(opd_module, "distill_step", recording)
        return self


class ScriptedTeacher(FakeTeacher):
    """A protocol-level fake teacher that scores with the real toy teacher model.

    ``misbehave(conn, msg, arrays, honest_frames)`` may return the list of replies to
    send instead of the honest one (stale, duplicate, foreign-generation replies...).
    """

    def __init__(self, toy: ToyTeacher):
        super().__init__(tokenizer_fp=toy.tokenizer_fp, vocab_size=toy.vocab_size,
                         instance="teacher-A")
        self.toy = toy
        self.misbehave = None
        self.scores: list[Any] = []
        self.on_score = self._score

    def honest(self, msg, arrays, **override) -> list:
        from miniverl.protocol import messages as m
        from miniverl.protocol.codec import encode
        from miniverl.teacher_server.scoring import score_positions

        out = score_positions(self.toy.model, arrays["tokens"], arrays["cu_seqlens"],
                              arrays["positions"], kind=msg.kind, k=msg.k,
                              temperature=msg.temperature, exact_max_vocab=1 << 20)
        fields = dict(id=msg.id, student_version=msg.student_version, instance=self.instance,
                      gen=self.gen, kind=msg.kind, k=msg.k,
                      timing={"queue_ms": 0.0, "compute_ms": 1.0})
        fields.update(override)
        return encode(m.ScoreOk(**fields), out)

    def poison(self, msg, arrays, **override) -> list:
        """A well-formed reply whose numbers are wrong on purpose (all mass on id 0)."""
        from miniverl.protocol import messages as m
        from miniverl.protocol.codec import encode

        p = len(arrays["positions"])
        out = {
            "ids": np.zeros((p, msg.k), np.int32),
            "logprobs": np.full((p, msg.k), -0.5, np.float32),
            "tail_logmass": np.full(p, -3.0, np.float32),
            "target_logprobs": np.full(p, -7.0, np.float32),
        }
        fields = dict(id=msg.id, student_version=msg.student_version, instance=self.instance,
                      gen=self.gen, kind=msg.kind, k=msg.k,
                      timing={"queue_ms": 0.0, "compute_ms": 1.0})
        fields.update(override)
        return encode(m.ScoreOk(**fields), out)

    def _score(self, conn, msg, arrays):
        self.scores.append(msg)
        if self.misbehave is not None:
            return self.misbehave(conn, msg, arrays)
        return [self.honest(msg, arrays)]

    def client(self, **kw):
        from miniverl.protocol.sync_client import SyncTeacherClient

        opts = dict(tokenizer_fp=self.tokenizer_fp, vocab_size=self.vocab_size,
                    heartbeat_ms=100, request_timeout_s=10, unavailable_timeout_s=20,
                    transport_factory=self.factory)
        opts.update(kw)
        return SyncTeacherClient("tcp://127.0.0.1:5555", **opts)


def parameters(trainer) -> list:
    return [p.detach().clone() for p in trainer.state.policy.model.parameters()]


def same_parameters(a: list, b: list) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    import json

    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(run_dir: Path, name: str | None = None) -> list[dict[str, Any]]:
    import json

    path = Path(run_dir) / "events.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if name is None or r["event"] == name]
