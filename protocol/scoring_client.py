"""The seam between the student's training side and whatever scores its visited states.

:class:`ScoringClient` is a :class:`typing.Protocol`: the methods the training side calls
on a teacher client (``student/train/teacher/link.py``, ``student/train/teacher/connect.py``,
``student/train/trainer.py``). Three classes implement it: the ZeroMQ client
(:class:`~miniverl.protocol.sync_client.SyncTeacherClient`, over ``mvl-score/1``), the
HTTP engine-teacher client (:class:`~miniverl.protocol.engine_client.EngineTeacherClient`,
a vLLM or SGLang server) and the in-process fake
(:class:`~miniverl.testing.fake_teacher.FakeTeacherClient`, no sockets);
``tests/protocol/test_scoring_client.py`` and ``tests/protocol/test_engine_client.py``
check that they do, method by method. Nothing in the signatures names a transport.

What an implementation promises: :meth:`ScoringClient.wait` returns only replies that
passed the staleness rule (``protocol/pending.py``, :func:`accept_reply`) for the
version set by :meth:`~ScoringClient.set_version` and the teacher tied by
:meth:`~ScoringClient.bind`, and raises :class:`TeacherChanged` when the bound teacher
is gone; the caller does not check a reply again.

This module holds the types the seam carries (:class:`ScoreResult`, ``Identity``) and
the errors it raises; it sends nothing.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from miniverl.common.errors import MiniverlError, TeacherUnavailable
from miniverl.protocol.messages import HelloOk, ParkOk, ScoreOk, WakeOk

Identity = tuple[str, int]  # a teacher process and reload: (instance, gen)


class TeacherChanged(MiniverlError, RuntimeError):
    """The teacher the current update is bound to is gone (new instance or gen).

    ``old``/``new`` are ``(instance, gen)``; ``how`` is ``reload``, ``restart`` or
    ``retarget``. The trainer calls ``bind()`` again and re-submits the whole update.
    """

    def __init__(self, old: Identity, new: Identity, how: str):
        super().__init__(
            f"teacher changed ({how}) from instance {old[0]} gen {old[1]} to instance "
            f"{new[0]} gen {new[1]}; call bind() and re-submit the update"
        )
        self.old, self.new, self.how = old, new, how


class StopRequested(MiniverlError, RuntimeError):
    """A stop (SIGTERM, SIGINT, the control socket's ``STOP``) ended a call on the teacher:
    :meth:`ScoringClient.interrupt` was called. Not a teacher failure: the run stops as
    interrupted, at the update boundary it was waiting at."""


class ScoreTimeout(TeacherUnavailable, TimeoutError):
    """``wait(..., timeout_s)`` ran out before every reply was accepted."""


@dataclass
class ScoreResult:
    """An accepted SCORE_OK. ``arrays`` (read-only views of the received frames):
    topk: ids i4[P,k], logprobs f4[P,k], tail_logmass f4[P], target_logprobs f4[P];
    exact: logprobs f4[P,V], target_logprobs f4[P]."""

    id: int
    student_version: int
    instance: str
    gen: int
    kind: str
    k: int
    arrays: dict[str, np.ndarray]
    timing: dict[str, float]

    @classmethod
    def from_reply(cls, msg: ScoreOk, arrays: dict[str, np.ndarray]) -> ScoreResult:
        fields = msg.model_dump(include={"id", "student_version", "instance", "gen", "kind", "k"})
        return cls(**fields, arrays=arrays, timing=msg.timing.model_dump())


@runtime_checkable
class ScoringClient(Protocol):
    """Something that scores the student's visited states, as the training side uses it.

    Arrays are numpy-convertible 1-D integers: ``tokens_N`` (B sequences packed back to
    back), ``cu_seqlens_B1`` (their offsets, ``[0, ..., N]``), ``positions_P`` (each
    predicts the next token of its own sequence).
    """

    @property
    def hello(self) -> HelloOk | None:
        """Who the teacher is (``teacher``, ``instance``, ``gen``, tokenizer, limits),
        once a handshake validated it; None before."""

    @property
    def counters(self) -> dict[str, int]:
        """sent, received, stale_dropped, retries, reconnects, bytes_sent,
        bytes_received and whatever else the client counts."""

    @property
    def connected(self) -> bool:
        """Whether the teacher answers now (handshake done, its connection alive); a run
        of several teachers holds back the episodes of a route whose teacher does not
        (docs/several-teachers.md, "A teacher that fails")."""

    def connect(self, timeout_s: float | None = None) -> HelloOk | None:
        """Handshake; raises ``TokenizerMismatch`` or ``TeacherUnavailable``."""

    def connect_soon(self, timeout_s: float | None = None) -> Future:
        """Start :meth:`connect` without waiting; the future holds its result or error."""

    def set_version(self, version: int, lag: int = 0) -> None:
        """The student's parameter version now and how far behind a reply may be."""

    def bind(self) -> Identity:
        """Tie the current update to the teacher ``(instance, gen)`` now connected."""

    def submit(self, tokens_N: Any, cu_seqlens_B1: Any, positions_P: Any, *,
               kind: str = "topk", k: int = 16, temperature: float = 1.0,
               deadline_ms: int | None = None, deterministic: bool = False) -> int:
        """Queue one request for the current version and binding; returns its id."""

    def wait(self, ids: Iterable[int], timeout_s: float | None = None) -> dict[int, ScoreResult]:
        """Accepted replies for every id; raises :class:`TeacherChanged` and the like."""

    def forget(self, ids: Iterable[int]) -> None:
        """Stop waiting for these requests: they are not sent again (to a restarted
        teacher either), and a late reply to one is dropped as stale."""

    def retarget(self, endpoint: str) -> HelloOk:
        """Handshake with another teacher; only if it validates, switch to it."""

    def park(self) -> ParkOk:
        """Move the teacher's weights off the device (memory: swap)."""

    def wake(self) -> WakeOk:
        """Bring them back before scoring."""

    def close(self) -> None:
        """Release the connection (idempotent)."""

    def interrupt(self, reason: str) -> None:
        """End every call in progress, and every later one, with :class:`StopRequested`
        (``reason`` its message). Called from another thread (the trainer's, on a stop
        request), so a teacher that never answers cannot hold a stop."""


class StoppableCalls:
    """Blocking calls into a client's event-loop thread (an anyio blocking portal) that
    :meth:`interrupt` ends from any thread, and that a ``KeyboardInterrupt`` in the
    caller cancels instead of leaving the call running (which then held the loop's
    thread, and the process, at exit)."""

    def __init__(self) -> None:
        self._futures: set[Future] = set()
        self._lock = threading.Lock()
        self.stopped: StopRequested | None = None

    def call(self, portal: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.stopped is not None:
            raise StopRequested(str(self.stopped))
        future = portal.start_task_soon(functools.partial(fn, *args, **kwargs))
        with self._lock:
            self._futures.add(future)
        try:
            return future.result()
        except CancelledError:
            if self.stopped is not None:
                raise StopRequested(str(self.stopped)) from None
            raise
        except BaseException:
            future.cancel()  # a KeyboardInterrupt here: the call must not outlive it
            raise
        finally:
            with self._lock:
                self._futures.discard(future)

    def soon(self, portal: Any, fn: Callable[..., Any], *args: Any) -> Future:
        """``fn`` started without waiting (a handshake begun early); :meth:`interrupt`
        cancels it too, so a later call meets the stop instead of the handshake."""
        future = portal.start_task_soon(fn, *args)
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._forget)
        if self.stopped is not None:
            future.cancel()
        return future

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._futures.discard(future)

    def interrupt(self, reason: str) -> None:
        self.stopped = StopRequested(reason)
        with self._lock:
            futures = list(self._futures)
        for future in futures:
            future.cancel()


def connected(client: Any) -> Any:
    """``client`` after ``client.connect()``, closed again if the connect fails: what
    ``with client:`` does for every blocking client here (their ``__enter__``)."""
    try:
        client.connect()
    except BaseException:
        client.close()
        raise
    return client


def as_async(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a coroutine function, to run a plain call on a client's event loop."""

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return call
