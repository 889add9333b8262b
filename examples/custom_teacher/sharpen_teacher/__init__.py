"""A teacher scorer that sharpens a causal LM's distribution by a temperature ``tau``.

The teacher's targets become ``softmax(logits / (T * tau))`` where ``T`` is the
temperature the student asked for: ``tau < 1`` concentrates the mass on the teacher's
favourite tokens (a more decisive teacher), ``tau > 1`` flattens it. Greedy choices do
not change, so a qualification of the base model still describes this teacher.

It is a complete scorer in a few lines: the built-in ``causal_lm`` scorer loads the
model (and its adapter), this wrapper rescales each job's temperature and renames the
teacher so runs record who produced their targets. Registered through the
``miniverl.scorers`` entry point in this folder's ``pyproject.toml``; it does not
touch sockets or the wire.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from miniverl.common.errors import ConfigError
from miniverl.teacher_server.scorers import causal_lm

OPTIONS = ("tau",)


class SharpenedTeacher:
    """A backend that forwards to ``base`` with every temperature multiplied by ``tau``."""

    def __init__(self, base: Any, tau: float):
        self.base = base
        self.tau = tau
        self.info = {**base.info, "name": f"{base.info['name']}+sharpen(tau={tau:g})"}
        self.tokenizer_fp = base.tokenizer_fp
        self.vocab_size = base.vocab_size

    def score_batch(self, jobs: list[Any]) -> list[Any]:
        return self.base.score_batch(
            [replace(job, temperature=job.temperature * self.tau) for job in jobs]
        )

    def park(self) -> None:
        self.base.park()

    def wake(self) -> None:
        self.base.wake()

    def memory(self) -> dict[str, Any]:
        return self.base.memory()

    def stats(self) -> dict[str, Any]:
        return {}  # no counters of its own (the server logs none)

    def close(self) -> None:
        self.base.close()


def make_scorer(
    spec: Any, *, exact_max_vocab: int, max_batch_tokens: int, options: dict[str, Any]
) -> SharpenedTeacher:
    """The ``sharpen`` scorer: options ``tau`` (default 0.5, in (0, 10])."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"scorer 'sharpen' has no option(s) {unknown}; it takes only tau")
    tau = options.get("tau", 0.5)
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 < tau <= 10:
        raise ConfigError(f"scorer 'sharpen': tau {tau!r} must be a number in (0, 10]; e.g. 0.5")
    base = causal_lm(
        spec, exact_max_vocab=exact_max_vocab, max_batch_tokens=max_batch_tokens, options={}
    )
    return SharpenedTeacher(base, float(tau))
