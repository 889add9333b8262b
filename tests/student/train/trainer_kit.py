"""Shared pieces of the trainer tests: the toy teacher in process, recorders, a scripted teacher.

The recipes and shapes come from ``tests/toy_kit.py`` (32-wide two-layer students, a
48-wide teacher, four rollouts per cycle, twelve new tokens per turn). The teacher
model is loaded once per test session and scored in process, either through
``FakeTeacherClient`` (the trainer's client interface, no protocol) or through the
real ``SyncTeacherClient`` talking to ``miniverl.testing``'s fake teacher scoring with
the toy model (``scripted_teacher``), which exercises the client's staleness rule byte
for byte.

Not a test module: pytest collects nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from miniverl.testing import FakeTeacher
from miniverl.testing.fake_teacher import FakeTeacherClient
from tests.toy_kit import TEACHER, toy_dir


@dataclass
class ToyTeacher:
    """The toy teacher model, its tokenizer fingerprint and vocabulary size."""

    model: Any
    tokenizer_fp: str
    vocab_size: int

    def fake_client(self) -> FakeTeacherClient:
        return FakeTeacherClient(self.model, self.tokenizer_fp, self.vocab_size)

    def score_job(self, job) -> dict[str, np.ndarray]:
        """What an honest teacher returns for one ``ScoreJob`` (the in-process scorer)."""
        from miniverl.teacher_server.scoring import score_positions

        return score_positions(self.model, job.tokens_N, job.cu_seqlens_B1, job.positions_P,
                               kind=job.kind, k=job.k, temperature=job.temperature,
                               exact_max_vocab=1 << 20)

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
    """Wraps ``updates.distill_step``, which every distillation update calls: what
    reached the loss, and at which version."""

    trainer: Any = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def install(self, monkeypatch) -> LossRecorder:
        import miniverl.student.train.updates as steps_module

        real = steps_module.distill_step

        def recording(policy, optimizer, scheduler, scored, **kw):
            if kw["objective"].kind == "none":  # an SFT step (the warm-up): not a distillation update
                return real(policy, optimizer, scheduler, scored, **kw)
            self.calls.append({
                "version": self.trainer.version,
                "cycle": self.trainer.state.cycle,
                "scored": [(s.traj, np.array(s.positions_P), {k: np.array(v) for k, v in
                            s.arrays.items()}, s.student_version, dict(s.teacher))
                           for s in scored],
            })
            return real(policy, optimizer, scheduler, scored, **kw)

        monkeypatch.setattr(steps_module, "distill_step", recording)
        return self


def scripted_teacher(toy: ToyTeacher) -> FakeTeacher:
    """A protocol-level fake teacher (``miniverl.testing``) scoring with the real toy model.

    Script its misbehaviour with the kit's steps (``stale``, ``wrong_id``, ``reload``...);
    :func:`poison` makes a step's reply wrong on purpose.
    """
    return FakeTeacher(tokenizer_fp=toy.tokenizer_fp, vocab_size=toy.vocab_size,
                       instance="teacher-A", scorer=toy.score_job)


def poison(job) -> dict[str, np.ndarray]:
    """Well-formed targets whose numbers are wrong on purpose (all mass on id 0)."""
    p = len(job.positions_P)
    return {
        "ids": np.zeros((p, job.k), np.int32),
        "logprobs": np.full((p, job.k), -0.5, np.float32),
        "tail_logmass": np.full(p, -3.0, np.float32),
        "target_logprobs": np.full(p, -7.0, np.float32),
    }


def scripted_client(teacher: FakeTeacher, **kw):
    """A ``SyncTeacherClient`` of ``teacher`` patient enough for in-process toy scoring."""
    return teacher.client(**{"heartbeat_ms": 100, "request_timeout_s": 10,
                             "unavailable_timeout_s": 20, **kw})


def parameters(trainer) -> list:
    return [p.detach().clone() for p in trainer.state.policy.model.parameters()]


def same_parameters(a: list, b: list) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def stop_at_step(monkeypatch, trainer, step: int) -> None:
    """Ask ``trainer`` to stop at the update boundary once its update ``step`` is logged
    (the first half of a run that a resume finishes)."""
    from miniverl.student.train import loop

    log = loop.log_cycle

    def logging_then_stop(state, done):
        log(state, done)
        if state is trainer.state and state.step == step:
            trainer.stop_event.set()

    monkeypatch.setattr(loop, "log_cycle", logging_then_stop)
