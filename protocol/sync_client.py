"""The blocking facade over :class:`~miniverl.protocol.client.TeacherClient`.

The training loop is synchronous; :class:`SyncTeacherClient` runs the async client on its
own event-loop thread (anyio blocking portal, asyncio backend) and exposes the same
methods as plain calls. It implements
:class:`~miniverl.protocol.scoring_client.ScoringClient`, the seam the training side is
typed against. It adds no behaviour of its own: the staleness rule lives in
``pending.py``, liveness and retries in ``link.py``, messages in ``client.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import anyio

from miniverl.protocol.client import TeacherClient
from miniverl.protocol.messages import (
    HelloOk,
    ParkOk,
    Pong,
    ReloadOk,
    ShutdownOk,
    WakeOk,
)
from miniverl.protocol.scoring_client import (
    Identity,
    ScoreResult,
    StoppableCalls,
    as_async,
    connected,
)


class SyncTeacherClient:
    """Blocking facade over :class:`TeacherClient` for the training loop.

    Runs the async core on its own event-loop thread (anyio blocking portal,
    asyncio backend). Use as a context manager or call :meth:`close`.
    """

    def __init__(self, endpoint: str, **settings: Any):
        """``settings`` as for :class:`TeacherClient` (``LinkSettings`` fields; ``adapter=NAME``
        scores with that adapter of a teacher serving ``--adapters``)."""
        self._core = TeacherClient(endpoint, **settings)
        # Opened by _start on first use, closed by close (None before and after).
        self._portal_cm: Any = None
        self._portal: Any = None
        self._client_cm: Any = None
        self._calls = StoppableCalls()

    def _start(self) -> Any:
        if self._portal is None:
            self._portal_cm = anyio.from_thread.start_blocking_portal(backend="asyncio")
            self._portal = self._portal_cm.__enter__()
            self._client_cm = self._portal.wrap_async_context_manager(self._core)
            self._client_cm.__enter__()
        return self._portal

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self._calls.call(self._start(), fn, *args, **kwargs)

    def interrupt(self, reason: str) -> None:
        """End every call in progress (a wait, a handshake) and every later one with
        ``StopRequested`` (``scoring_client.py``); any thread may call it."""
        self._calls.interrupt(reason)

    # Read-only views of the async core's state.
    endpoint = property(lambda self: self._core.endpoint, doc="The teacher endpoint in use.")
    hello = property(lambda self: self._core.hello, doc="The validated HELLO_OK, or None.")
    counters = property(lambda self: self._core.counters, doc="TeacherClient.counters.")
    bound = property(lambda self: self._core.bound, doc="The bound (instance, gen), or None.")
    connected = property(lambda self: self._core.connected, doc="TeacherClient.connected.")

    def connect(self, timeout_s: float | None = None) -> HelloOk | None:
        return self._run(self._core.connect, timeout_s)

    def connect_soon(self, timeout_s: float | None = None) -> Future:
        """Start :meth:`connect` without waiting: the future holds its ``HELLO_OK`` or
        error (:meth:`close` ends a handshake still waiting)."""
        return self._calls.soon(self._start(), self._core.connect, timeout_s)

    def set_version(self, version: int, lag: int = 0) -> None:
        if self._portal is None:
            self._core.set_version(version, lag)
        else:
            self._run(as_async(self._core.set_version), version, lag)

    def bind(self) -> Identity:
        return self._run(self._core.bind)

    def unbind(self) -> None:
        self._run(as_async(self._core.unbind))

    def submit(self, tokens_N: Any, cu_seqlens_B1: Any, positions_P: Any, *,
               kind: str = "topk", k: int = 16, temperature: float = 1.0,
               deadline_ms: int | None = None, deterministic: bool = False) -> int:
        return self._run(self._core.submit, tokens_N, cu_seqlens_B1, positions_P, kind=kind,
                         k=k, temperature=temperature, deadline_ms=deadline_ms,
                         deterministic=deterministic)

    def submit_xvocab(self, episode: Any, student_cuts: Any, student_pieces: Any, *,
                      k: int = 16, temperature: float = 1.0, deadline_ms: int | None = None,
                      deterministic: bool = False) -> int:
        """:meth:`TeacherClient.submit_xvocab` (docs/protocol.md, "xvocab")."""
        return self._run(self._core.submit_xvocab, episode, student_cuts, student_pieces, k=k,
                         temperature=temperature, deadline_ms=deadline_ms,
                         deterministic=deterministic)

    def wait(self, ids: Iterable[int], timeout_s: float | None = None) -> dict[int, ScoreResult]:
        return self._run(self._core.wait, list(ids), timeout_s)

    def forget(self, ids: Iterable[int]) -> None:
        self._run(as_async(self._core.forget), list(ids))

    def score(self, tokens_N: Any, cu_seqlens_B1: Any, positions_P: Any, **kw: Any) -> ScoreResult:
        return self._run(self._core.score, tokens_N, cu_seqlens_B1, positions_P, **kw)

    def retarget(self, endpoint: str) -> HelloOk:
        return self._run(self._core.retarget, endpoint)

    def ping(self) -> Pong:
        return self._run(self._core.ping)

    def status(self) -> dict[str, Any]:
        return self._run(self._core.status)

    def park(self) -> ParkOk:
        return self._run(self._core.park)

    def wake(self) -> WakeOk:
        return self._run(self._core.wake)

    def reload(self, model: str, *args: Any, **kwargs: Any) -> ReloadOk:
        """Arguments as :meth:`TeacherClient.reload` (revision, adapter, mode, timeout_s, ...)."""
        return self._run(self._core.reload, model, *args, **kwargs)

    def shutdown(self, mode: str = "drain", timeout_s: float | None = None) -> ShutdownOk:
        return self._run(self._core.shutdown, mode, timeout_s)

    def close(self) -> None:
        """Close the connection and stop the event-loop thread (idempotent)."""
        if self._portal is None:
            return
        client_cm, portal_cm, portal_cm_portal = self._client_cm, self._portal_cm, self._portal
        self._portal = self._client_cm = self._portal_cm = None
        try:
            client_cm.__exit__(None, None, None)
        finally:
            # Cancel what is still running (a wait a signal left behind): stopping the
            # portal without cancelling waits for it, possibly forever.
            with contextlib.suppress(RuntimeError):
                portal_cm_portal.call(portal_cm_portal.stop, True)
            portal_cm.__exit__(None, None, None)

    def __enter__(self) -> SyncTeacherClient:
        return connected(self)

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
