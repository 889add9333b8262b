"""A numpy-only fake teacher backend for the server's tests (no torch).

:class:`FakeBackend` scores a uniform distribution over ``VOCAB`` tokens, can hold each
batch behind a ``gate`` and fails a job whose temperature is 7 with ``UNSUPPORTED``.
"""

from __future__ import annotations

import threading

import numpy as np

from miniverl.teacher_server.backend import BackendError

FP = "sha256:" + "cd" * 32
VOCAB = 50


class FakeBackend:
    """Uniform distribution over VOCAB tokens; ``gate`` (when set) blocks each batch."""

    def __init__(self, name="fake", fp=FP, vocab=VOCAB, gate=None):
        self.info = {"name": name, "model": name, "revision": None, "adapter_sha256": None}
        self.tokenizer_fp = fp
        self.vocab_size = vocab
        self.gate = gate
        self.batches: list[list[int]] = []
        self.entered = threading.Event()
        self.parked = False
        self.calls: list[str] = []

    def score_batch(self, jobs):
        self.batches.append([job.id for job in jobs])
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        out = []
        for job in jobs:
            if job.temperature == 7.0:  # a scripted per-job failure
                out.append(BackendError("UNSUPPORTED", "temperature 7 is not served"))
                continue
            n_pos = job.positions_P.shape[0]
            lp = np.float32(-np.log(self.vocab_size))
            target = np.full(n_pos, lp, np.float32)
            if job.kind == "exact":
                out.append(
                    {
                        "logprobs": np.full((n_pos, self.vocab_size), lp, np.float32),
                        "target_logprobs": target,
                    }
                )
                continue
            ids = np.tile(np.arange(job.k, dtype=np.int32), (n_pos, 1))
            tail = np.log1p(-job.k / self.vocab_size) if job.k < self.vocab_size else -np.inf
            out.append(
                {
                    "ids": ids,
                    "logprobs": np.full((n_pos, job.k), lp, np.float32),
                    "tail_logmass": np.full(n_pos, tail, np.float32),
                    "target_logprobs": target,
                }
            )
        return out

    def park(self):
        self.calls.append("park")
        self.parked = True

    def wake(self):
        self.calls.append("wake")
        self.parked = False

    def memory(self):
        return {"device": "cpu"}

    def stats(self):
        return {}

    def close(self):
        self.calls.append("close")
