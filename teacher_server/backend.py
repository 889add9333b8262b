"""The interface between the teacher's server and the model that scores: :class:`Backend`.

A backend is what a *loader* builds (the built-in one is
:class:`~miniverl.teacher_server.torch_backend.TorchTeacher`; plug-in scorers build
their own, see ``teacher_server/scorers.py``). The server hands it coalesced
:class:`ScoreJob` s on its worker thread and gets back, per job, either the reply arrays
or a :class:`BackendError`. This module only declares that contract; it holds no
state, touches no socket and never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from miniverl.common.errors import MiniverlError
from miniverl.protocol.messages import ErrorCode


class BackendError(MiniverlError, RuntimeError):
    """A per-request failure a backend reports instead of a result."""

    def __init__(self, code: ErrorCode | str, message: str, retryable: bool = False):
        super().__init__(message)
        self.code = ErrorCode(code)
        self.retryable = retryable


@dataclass
class ScoreJob:
    """One accepted SCORE: the arrays a backend scores plus the server's bookkeeping.

    ``tokens_N``, ``cu_seqlens_B1``, ``positions_P``, ``kind``, ``k`` and ``temperature``
    are what a backend scores. ``deterministic``: the batcher hands this job over alone,
    and a backend must compute it the same way every time (the built-in one skips its
    prefix cache). ``adapter``: the served adapter that scores it (None: the model
    alone); the batcher hands over only jobs of one adapter at a time.
    """

    tokens_N: np.ndarray
    cu_seqlens_B1: np.ndarray
    positions_P: np.ndarray
    kind: str
    k: int
    temperature: float
    client: bytes = b""
    id: int = 0
    student_version: int = 0
    received: float = 0.0
    deadline: float | None = None
    aborted: bool = False
    deterministic: bool = False
    # An xvocab request (teacher_server/xvocab.py): the plan its reply is sent with; the
    # backend scores it as the top-k job it is over the teacher's own tokens.
    xvocab: Any = None
    adapter: str | None = None


class Backend(Protocol):
    """What the server needs from a teacher. All methods run on the worker thread."""

    info: dict[str, Any]  # HELLO_OK ``teacher``: name, model, revision, adapter_sha256
    tokenizer_fp: str
    vocab_size: int
    # Optional: the model's context in tokens. When set, longer sequences are TOO_LARGE
    # and max_tokens defaults to it (protocol/limits.py, Limits.for_context).
    context_len: int | None
    # Optional: the named adapters it serves, name -> adapter_sha256 (``--adapters``).
    # When set, every job names one of them (ScoreJob.adapter) and the model alone is not
    # served; absent or empty, no job names one.
    adapters: dict[str, str]

    def score_batch(self, jobs: list[ScoreJob]) -> list[dict[str, np.ndarray] | BackendError]:
        """Score coalesced jobs; one result (arrays) or :class:`BackendError` per job."""

    def park(self) -> None:
        """Move the weights off the accelerator."""

    def wake(self) -> None:
        """Move the weights back onto the accelerator."""

    def memory(self) -> dict[str, Any]:
        """``{device, allocated_bytes, reserved_bytes, total_bytes}``."""

    def stats(self) -> dict[str, Any]:
        """Counters of the backend's own, logged with each batch (``{}`` when it has none)."""

    def close(self) -> None:
        """Release the weights (called after a successful reload and at shutdown)."""


def served_adapters(backend: Backend) -> dict[str, str]:
    """The named adapters ``backend`` serves (``{}``: none; a plug-in may not say)."""
    return dict(getattr(backend, "adapters", None) or {})


# loader(None) builds the initial teacher; loader({"model", "revision", "adapter",
# "adapter_revision"}) a reload.
Loader = Callable[[dict[str, Any] | None], Backend]
