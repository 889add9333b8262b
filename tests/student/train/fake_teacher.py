"""An in-process stand-in for ``SyncTeacherClient``: the same methods, no sockets.

It scores with ``teacher_server.scoring.score_positions`` (the function the real teacher
runs), so unit tests of the trainer see real targets. ``inject`` queues replies that the
real client's staleness rule would drop (wrong version, unknown id, old generation);
the fake drops them the same way and counts them, so tests can assert on what reached
the loss. Tests only: the student package never imports the teacher server.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from miniverl.protocol.client import ScoreResult, TeacherChanged
from miniverl.protocol.messages import HelloOk
from miniverl.protocol.pending import Pending, accept_reply
from miniverl.teacher_server.scoring import score_positions


@dataclass
class FakeTeacherClient:
    model: Any
    tokenizer_fp: str
    vocab_size: int
    name: str = "toy-teacher"
    exact_max_vocab: int = 1 << 20
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)
    gen: int = 0
    counters: dict[str, int] = field(
        default_factory=lambda: dict(sent=0, received=0, stale_dropped=0, retries=0,
                                     reconnects=0, bytes_sent=0, bytes_received=0)
    )
    scored_versions: list[int] = field(default_factory=list)
    reload_before_next_wait: bool = False
    injected: list[ScoreResult] = field(default_factory=list)

    def __post_init__(self):
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, tuple[str, int], dict]] = {}
        self._version = 0
        self._lag = 0
        self._bound: tuple[str, int] | None = None

    @property
    def hello(self) -> HelloOk:
        return HelloOk(
            id=0, teacher={"name": self.name, "model": "toy"}, instance=self.instance,
            gen=self.gen, tokenizer_fp=self.tokenizer_fp, vocab_size=self.vocab_size,
            kinds={"topk": {"k_max": self.vocab_size}, "exact": {"max_vocab": self.exact_max_vocab}},
            limits={"max_tokens": 1 << 20, "max_positions": 1 << 20, "max_inflight": 64},
            heartbeat_ms=1000, server_version="fake/1",
        )

    def connect(self, timeout_s=None):
        return self.hello

    def set_version(self, version: int, allowed_lag: int = 0) -> None:
        self._version, self._lag = version, allowed_lag

    def bind(self) -> tuple[str, int]:
        self._bound = (self.instance, self.gen)
        return self._bound

    def submit(self, tokens_N, cu_seqlens_B1, positions_P, *, kind="topk", k=16, temperature=1.0,
               deterministic=False):  # in process, every request is scored alone anyway
        rid = next(self._ids)
        arrays = score_positions(self.model, tokens_N, cu_seqlens_B1, positions_P, kind=kind, k=k,
                                 temperature=temperature, exact_max_vocab=self.exact_max_vocab)
        self._pending[rid] = (self._version, (self.instance, self.gen), arrays)
        self.counters["sent"] += 1
        self.counters["bytes_sent"] += int(np.asarray(tokens_N).nbytes + np.asarray(positions_P).nbytes)
        self.scored_versions.append(self._version)
        return rid

    def _accept(self, rid: int, result: ScoreResult) -> bool:
        # The real client's rule, applied to this fake's pending table.
        version, identity, _ = self._pending.get(rid, (None, None, None))
        entry = None if version is None else Pending(version, identity)
        reason = accept_reply(entry, result, current_version=self._version, max_lag=self._lag,
                              bound_teacher=self._bound)
        return reason is None

    def wait(self, ids, timeout_s=None) -> dict[int, ScoreResult]:
        if self.reload_before_next_wait:
            self.reload_before_next_wait = False
            old = self._bound
            self.gen += 1
            raise TeacherChanged(old, (self.instance, self.gen), "reload")
        for bad in self.injected:
            if not self._accept(bad.id, bad):
                self.counters["stale_dropped"] += 1
        self.injected.clear()
        out = {}
        for rid in ids:
            version, identity, arrays = self._pending[rid]
            result = ScoreResult(id=rid, student_version=version, instance=identity[0],
                                 gen=identity[1], kind="topk" if "ids" in arrays else "exact",
                                 k=arrays["ids"].shape[1] if "ids" in arrays else 0,
                                 arrays=arrays, timing={})
            if not self._accept(rid, result):
                self.counters["stale_dropped"] += 1
                raise TeacherChanged(identity, (self.instance, self.gen), "reload")
            out[rid] = result
            self.counters["received"] += 1
            self.counters["bytes_received"] += sum(a.nbytes for a in arrays.values())
        for rid in ids:
            self._pending.pop(rid, None)
        return out

    def retarget(self, endpoint: str):
        self.instance = uuid.uuid4().hex
        self.gen = 0
        return self.hello

    def close(self) -> None:
        pass
