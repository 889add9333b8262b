"""A user's custom teacher: a bigram model in numpy, as a miniverl teacher backend.

``BigramTeacher`` counts which token follows which in a corpus and answers ``SCORE``
with the smoothed next-token distribution ``P(next | token)`` at each position,
divided by the temperature the student asked for. It has the methods the teacher
server calls (``teacher_server/backend.py``: ``info``, ``tokenizer_fp``, ``vocab_size``,
``score_batch``, ``park``, ``wake``, ``memory``, ``stats``, ``close``) and a scorer
factory, ``make_scorer``, in the shape ``--scorer`` calls. ``test_my_teacher.py`` runs
it behind the real server with ``miniverl.testing``'s ``TeacherHarness``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

VOCAB = 32
FINGERPRINT = "sha256:" + "ab" * 32  # the tokenizer shared with the students
CORPUS = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9] * 20 + [1, 3, 1, 3], np.int64)


class BigramTeacher:
    """Smoothed bigram next-token targets; ``broken=True`` returns NaN (a bug to catch)."""

    def __init__(self, corpus: np.ndarray = CORPUS, smoothing: float = 1.0, broken: bool = False):
        counts = np.full((VOCAB, VOCAB), smoothing, np.float64)
        np.add.at(counts, (corpus[:-1], corpus[1:]), 1.0)
        self.logits = np.log(counts / counts.sum(axis=1, keepdims=True))
        self.broken = broken
        self.info = {"name": f"bigram(smoothing={smoothing:g})", "model": "bigram",
                     "revision": None, "adapter_sha256": None}
        self.tokenizer_fp = FINGERPRINT
        self.vocab_size = VOCAB
        self.context_len = 512
        self.batch_sizes: list[int] = []

    def distribution(self, token: int, temperature: float) -> np.ndarray:
        """log P(next | token) at ``temperature`` (fp64)."""
        scaled = self.logits[token] / temperature
        return scaled - np.logaddexp.reduce(scaled)

    def score_batch(self, jobs: list[Any]) -> list[dict[str, np.ndarray]]:
        self.batch_sizes.append(len(jobs))
        return [self._score(job) for job in jobs]

    def _score(self, job: Any) -> dict[str, np.ndarray]:
        rows = np.stack([self.distribution(int(job.tokens_N[p]), job.temperature)
                         for p in job.positions_P])
        following = job.tokens_N[np.asarray(job.positions_P) + 1]
        target = rows[np.arange(len(rows)), following].astype(np.float32)
        if self.broken:
            target[:] = np.nan
        if job.kind == "exact":
            return {"logprobs": rows.astype(np.float32), "target_logprobs": target}
        ids = np.argsort(-rows, axis=1, kind="stable")[:, : job.k]
        top = np.take_along_axis(rows, ids, axis=1)
        kept = np.exp(top).sum(axis=1)
        tail = np.log1p(-np.minimum(kept, 1.0)) if job.k < VOCAB else np.full(len(rows), -np.inf)
        return {"ids": ids.astype(np.int32), "logprobs": top.astype(np.float32),
                "tail_logmass": tail.astype(np.float32), "target_logprobs": target}

    def park(self) -> None: ...

    def wake(self) -> None: ...

    def memory(self) -> dict[str, Any]:
        return {"device": "cpu"}

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None: ...


def make_scorer(spec: Any, *, exact_max_vocab: int, max_batch_tokens: int,
                options: dict[str, Any]) -> BigramTeacher:
    """The scorer factory (``--scorer``): option ``smoothing`` (> 0, default 1)."""
    smoothing = options.get("smoothing", 1.0)
    if not isinstance(smoothing, (int, float)) or smoothing <= 0:
        raise ValueError(f"bigram smoothing {smoothing!r} must be a number > 0")
    return BigramTeacher(smoothing=float(smoothing))
