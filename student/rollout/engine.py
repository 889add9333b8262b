"""The sampling engine seam: what the rollout runner asks of whatever samples its turns.

Each round the runner (:mod:`miniverl.student.rollout.runner`) hands an engine one
:class:`TurnRequest` per active episode (its token ids so far, how many ids its turn may
add, its own random stream) and one :class:`Sampling` for the batch; the engine returns
one :class:`SampledTurn` per request, in order: the ids it sampled, verbatim, and the
log-prob each had under the distribution it was drawn from. The runner turns those into
spans, tool calls and trajectories; an engine never sees an environment, a chat template
or a trajectory.

:class:`~miniverl.student.rollout.hf_engine.HFEngine` (the policy's own forward over a KV
cache) is the one the runner uses unless it is handed another;
:class:`~miniverl.student.rollout.vllm_engine.VllmEngine` (``rollout.engine: vllm``) is
the other. This module holds only
the types of the seam; it runs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class TurnRequest:
    """One episode's next assistant turn.

    ``tokens``: the episode's ids so far (its prompt for this turn, ending with the
    assistant header). ``budget``: the turn samples at most this many ids (``>= 1``).
    ``generator``: the episode's own random stream, seeded once with its seed and kept
    across its turns, so its samples do not depend on which episodes share its batch
    (the HF engine draws exactly one uniform per sampled id from it; an engine with a
    sampler of its own draws its turn's seed from it). ``prefix_len``: how many of
    ``tokens`` are the episode's system block, which other episodes may open with too
    (an engine may compute a prefix they share once for all); 0 when it has none.
    """

    tokens: list[int]
    budget: int
    generator: torch.Generator
    prefix_len: int = 0


@dataclass(frozen=True)
class Sampling:
    """How every turn of one round is sampled: ``greedy`` (or ``temperature <= 0``) takes
    the argmax; otherwise temperature and top-p (1 = off). A turn ends after the first id
    in ``stop_ids`` (empty: only its budget ends it)."""

    greedy: bool
    temperature: float
    top_p: float
    stop_ids: frozenset[int]


@dataclass(frozen=True)
class SampledTurn:
    """The ids one turn sampled (the stop id included) and, per id, its float32 log-prob
    under the distribution it was drawn from (temperature and top-p applied,
    renormalised); ``logprobs`` is None when the ids were not drawn (argmax)."""

    ids: list[int]
    logprobs: list[float] | None


class SamplingEngine(Protocol):
    """Samples one assistant turn for each of a batch of episodes."""

    def reset(self) -> None:
        """Forget what was computed from the weights (they may have changed since)."""
        ...

    def sample(self, requests: Sequence[TurnRequest], sampling: Sampling) -> list[SampledTurn]:
        """One :class:`SampledTurn` per request, in the requests' order."""
        ...

    def release(self) -> None:
        """The run's turns are all sampled: free what only sampling needs until the next
        :meth:`reset` (vLLM sleeps on CUDA while the trainer takes its step)."""
        ...
