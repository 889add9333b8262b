"""Known targets without a model: :func:`next_token_targets` and :class:`FakeBackend`.

:func:`next_token_targets` is an honest, checkable teacher: at every position it puts
half the mass on the token that actually follows and spreads the rest evenly over the
vocabulary, so ``ids[:, 0]`` are the next tokens, every reply is finite and
``logsumexp(logprobs) ⊕ tail_logmass = 0``. It ignores the temperature. The fake
teacher (``fake_teacher.py``) answers with it by default.

:class:`FakeBackend` is a numpy-only :class:`~miniverl.teacher_server.backend.Backend`
for :class:`~miniverl.testing.harness.TeacherHarness`: it scores with
:func:`next_token_targets`, records every batch, can hold batches until released and
can fail chosen jobs. This module touches no socket and never imports torch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from miniverl.teacher_server.backend import BackendError, ScoreJob

FAKE_TOKENIZER_FP = "sha256:" + "ab" * 32
"""The tokenizer fingerprint the fake teacher and :class:`FakeBackend` announce."""
FAKE_VOCAB = 32
"""Their vocabulary size."""


def next_token_targets(
    tokens_N: np.ndarray,
    cu_seqlens_B1: np.ndarray,
    positions_P: np.ndarray,
    *,
    kind: str,
    k: int,
    vocab_size: int,
) -> dict[str, np.ndarray]:
    """The ``SCORE_OK`` arrays of a teacher sure (p = 0.5) of the token at ``p + 1``.

    topk: ``ids i4[P,k]`` (the next token first, then the smallest other ids),
    ``logprobs f4[P,k]``, ``tail_logmass f4[P]`` (``-inf`` when ``k = V``),
    ``target_logprobs f4[P]`` (log 0.5); exact: ``logprobs f4[P,V]``,
    ``target_logprobs f4[P]``. ``cu_seqlens_B1`` is accepted for the Backend's shape
    of call; a valid position always predicts a token of its own sequence.
    """
    positions = np.asarray(positions_P, dtype=np.int64)
    following = np.asarray(tokens_N, dtype=np.int64)[positions + 1]
    n_pos = positions.shape[0]
    top = 1.0 if vocab_size == 1 else 0.5
    rest = 0.0 if vocab_size == 1 else 0.5 / (vocab_size - 1)
    target = np.full(n_pos, np.log(top), np.float32)
    if kind == "exact":
        probs = np.full((n_pos, vocab_size), rest, np.float64)
        probs[np.arange(n_pos), following] = top
        return {"logprobs": np.log(probs).astype(np.float32), "target_logprobs": target}
    others = np.arange(vocab_size, dtype=np.int64)
    ids = np.empty((n_pos, k), np.int32)
    for row, nxt in enumerate(following):
        ids[row, 0] = nxt
        ids[row, 1:] = others[others != nxt][: k - 1]
    logprobs = np.full((n_pos, k), np.log(rest) if rest else 0.0, np.float32)
    logprobs[:, 0] = np.log(top)
    kept = top + (k - 1) * rest
    tail = -np.inf if k >= vocab_size else np.log1p(-kept)
    return {
        "ids": ids,
        "logprobs": logprobs,
        "tail_logmass": np.full(n_pos, tail, np.float32),
        "target_logprobs": target,
    }


def job_targets(job: ScoreJob, vocab_size: int) -> dict[str, np.ndarray]:
    """:func:`next_token_targets` for one :class:`ScoreJob`."""
    return next_token_targets(job.tokens_N, job.cu_seqlens_B1, job.positions_P,
                              kind=job.kind, k=job.k, vocab_size=vocab_size)


class BatchGate:
    """``hold()`` makes a backend's next batches wait inside ``score_batch`` until
    ``release()``; ``entered`` is set once a batch is inside. A backend calls
    :meth:`enter_batch` first thing in its ``score_batch``."""

    gate: threading.Event | None = None
    entered: threading.Event

    def hold(self) -> None:
        """Make the following batches wait until :meth:`release`."""
        self.entered.clear()
        self.gate = threading.Event()

    def release(self) -> None:
        """Let held batches (and later ones) run."""
        if self.gate is not None:
            self.gate.set()

    def enter_batch(self) -> None:
        """Say a batch is inside, then wait while held (at most 30 s)."""
        self.entered.set()
        if self.gate is not None and not self.gate.wait(30):
            raise RuntimeError(f"{type(self).__name__} was held for 30 s and never released")


class FakeBackend(BatchGate):
    """A teacher :class:`~miniverl.teacher_server.backend.Backend` in numpy.

    - ``batches``: the request ids of every batch the server handed over, in order;
    - ``hold()`` makes the next batches wait inside ``score_batch`` until ``release()``
      (``entered`` is set once a batch is inside), so a test can queue requests
      behind a busy teacher; ``gate`` may also be passed as a ``threading.Event``;
    - ``fail(job)`` may return a :class:`BackendError` for a job (a per-request failure);
    - ``calls`` records ``park``, ``wake`` and ``close``; ``parked`` the current state;
    - ``context_len`` (optional) bounds sequences as a model's context does;
    - ``tokenizer`` (optional): a fast tokenizer with a chat template, which makes it
      serve ``xvocab`` (docs/protocol.md, "xvocab") over that tokenizer's ids;
    - ``adapters`` (optional): name -> adapter_sha256 of the named adapters it serves
      (docs/protocol.md, "Adapters"); ``batch_adapters`` records the one each batch asked
      for (its targets do not depend on it).
    """

    context_len: int | None = None

    def __init__(
        self,
        name: str = "fake",
        *,
        tokenizer_fp: str = FAKE_TOKENIZER_FP,
        vocab_size: int = FAKE_VOCAB,
        context_len: int | None = None,
        gate: threading.Event | None = None,
        fail: Callable[[ScoreJob], BackendError | None] | None = None,
        tokenizer: Any = None,
        adapters: dict[str, str] | None = None,
    ):
        self.info: dict[str, Any] = {"name": name, "model": name, "revision": None,
                                     "adapter_sha256": None}
        self.tokenizer_fp = tokenizer_fp
        self.vocab_size = vocab_size
        if context_len is not None:  # else the class attribute (a subclass may set one)
            self.context_len = context_len
        self.gate = gate
        self.fail = fail
        self.tokenizer = tokenizer
        self.batches: list[list[int]] = []
        self.adapters: dict[str, str] = dict(adapters or {})
        self.batch_adapters: list[list[str | None]] = []
        self.entered = threading.Event()
        self.parked = False
        self.calls: list[str] = []

    def score_batch(self, jobs: list[ScoreJob]) -> list[dict[str, np.ndarray] | BackendError]:
        self.batches.append([job.id for job in jobs])
        self.batch_adapters.append([job.adapter for job in jobs])
        self.enter_batch()
        out: list[dict[str, np.ndarray] | BackendError] = []
        for job in jobs:
            failure = self.fail(job) if self.fail is not None else None
            out.append(failure if failure is not None else job_targets(job, self.vocab_size))
        return out

    def park(self) -> None:
        self.calls.append("park")
        self.parked = True

    def wake(self) -> None:
        self.calls.append("wake")
        self.parked = False

    def memory(self) -> dict[str, Any]:
        return {"device": "cpu"}

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.calls.append("close")
