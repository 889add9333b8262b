"""Shared pieces of the trainer tests: the toy teacher in process, recorders, a scripted teacher.

The recipes and shapes come from ``tests/toy_kit.py`` (32-wide two-layer students, a
48-wide teacher, four rollouts per cycle, twelve new tokens per turn). The teacher
model is loaded once per test session and scored in process, either through
``FakeTeacherClient`` (the trainer's client interface, no protocol) or through the
real ``SyncTeacherClient`` over a scripted in-memory transport (``ScriptedTeacher``),
which exercises the client's staleness rule byte for byte.

Not a test module: pytest collects nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.protocol.protocol_fakes import FakeTeacher
from tests.student.train.fake_teacher import FakeTeacherClient
from tests.toy_kit import TEACHER, toy_dir


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


def load_toy_teacher(shape: dict[str, int] = TEACHER) -> ToyTeacher:
    """The toy teacher of ``shape`` (default ``toy_kit.TEACHER``), in eval mode on CPU."""
    from miniverl.common.modeling import load_causal_lm, load_tokenizer
    from miniverl.common.tokenizer_id import fingerprint_tokenizer

    model_dir = toy_dir(shape)
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
