"""The client's pending table and THE staleness rule of ``mvl-score/1`` (DESIGN §3).

A :class:`Request` is one row of the table: a request sent (or queued) under its
``id``, with its encoded frames for a resend and, for a ``SCORE``, what DESIGN calls
``pending[id] = (student_version, instance, gen)``: the student version it was sent
for and the teacher ``(instance, gen)`` the update was bound to. :class:`PendingTable`
holds the rows, sends what is due through the link's ``send``, files ERROR and
control replies under their rows, and counts what it drops.

:func:`accept_reply` is the one place that decides whether a ``SCORE_OK`` may be
trained on; every check of a reply against a version and a teacher calls it (the
client on receipt, the student's teacher link before the loss, test fakes).
:func:`within_lag` is its version half, for checks that have no reply (a pending
request after the version moved, a replay buffer entry).

This module holds no socket and never reconnects (``link.py``); it does not know the
student's current version or binding (``client.py`` passes them in).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

import anyio

from miniverl.common.errors import TeacherError, TokenizerMismatch
from miniverl.protocol.messages import (
    ErrorCode,
    ErrorReply,
    HelloOk,
    Message,
    ParkOk,
    Pong,
    ReloadOk,
    ShutdownOk,
    StatusOk,
    WakeOk,
)

Identity = tuple[str, int]  # a teacher process and reload: (instance, gen)

RETRYABLE_CODES = {ErrorCode.OVERLOADED, ErrorCode.RELOADING, ErrorCode.DEADLINE_EXCEEDED}
REPLY_TO = {
    "HELLO": HelloOk,
    "PING": Pong,
    "STATUS": StatusOk,
    "RELOAD": ReloadOk,
    "PARK": ParkOk,
    "WAKE": WakeOk,
    "SHUTDOWN": ShutdownOk,
}
_NOT_RESENT = {"RELOAD", "SHUTDOWN"}  # not idempotent: never sent twice
COUNTERS = (
    "sent", "received", "stale_dropped", "retries", "reconnects",
    "bytes_sent", "bytes_received", "malformed", "late_control_replies", "nonfinite_replies",
)  # fmt: skip

StaleReason = Literal["not_pending", "version", "lag", "teacher"]
"""Why a reply is dropped: its id is not pending, it echoes another student version,
the version it was sent for is now outside the allowed lag, or it comes from another
teacher than the one the update is bound to."""


class Pending(NamedTuple):
    """What a SCORE was sent for: DESIGN's ``pending[id] = (student_version, instance,
    gen)``, the teacher kept as one ``binding`` (None: sent while no update was bound)."""

    student_version: int
    binding: Identity | None


class ScoredReply(Protocol):
    """What the rule reads from a reply (``ScoreOk`` on the wire, ``ScoreResult`` after)."""

    student_version: int
    instance: str
    gen: int


@dataclass
class Request:
    """One row of the pending table, SCORE or control request, until its reply is taken."""

    id: int
    t: str
    frames: list[Any]
    sent_at: float | None = None  # None: queued, not sent yet
    retry_at: float | None = None
    student_version: int = 0
    binding: Identity | None = None  # the teacher the update was bound to; None: any
    kind: str = ""
    k: int = 0
    positions: int = 0
    result: Any = None
    error: BaseException | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def open(self) -> bool:
        """Still waiting: neither a result nor an error yet."""
        return self.result is None and self.error is None

    @property
    def pending(self) -> Pending | None:
        """This row's entry for :func:`accept_reply`; None unless an open SCORE."""
        if self.t != "SCORE" or not self.open:
            return None
        return Pending(self.student_version, self.binding)

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


def within_lag(current_version: int, sent_version: int, max_lag: int) -> bool:
    """True when targets for ``sent_version`` may train version ``current_version``:
    ``0 <= current - sent <= max_lag`` (0 for strict OPD, ``max_lag`` for replay)."""
    return 0 <= current_version - sent_version <= max_lag


def accept_reply(
    pending: Pending | None,
    reply: ScoredReply,
    *,
    current_version: int,
    max_lag: int,
    bound_teacher: Identity | None,
) -> StaleReason | None:
    """None when ``reply`` may be trained on, else why it must be dropped (DESIGN §3).

    A SCORE_OK is accepted only if its id is pending (``pending`` is the entry for the
    reply's id, None when there is none), its echoed ``student_version`` equals the pending one,
    ``current_version`` minus that version is within ``max_lag``, and — when the
    request was sent bound to a teacher — it comes from that ``(instance, gen)``, which
    is still the one the current update is bound to (``bound_teacher``).
    """
    if pending is None:
        return "not_pending"
    if reply.student_version != pending.student_version:
        return "version"
    if not within_lag(current_version, pending.student_version, max_lag):
        return "lag"
    binding = pending.binding
    if binding is not None and (binding != bound_teacher or (reply.instance, reply.gen) != binding):
        return "teacher"
    return None


class PendingTable:
    """Rows by id, the counters, and the ``progress`` event waiters sleep on."""

    def __init__(self) -> None:
        self.rows: dict[int, Request] = {}
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.progress = anyio.Event()
        self._next_id = 1

    def new_id(self) -> int:
        rid, self._next_id = self._next_id, self._next_id + 1
        return rid

    def notify(self) -> None:
        """Wake everyone waiting on :attr:`progress`."""
        self.progress.set()
        self.progress = anyio.Event()

    def drop(self, req: Request, error: BaseException) -> None:
        self.rows.pop(req.id, None)
        req.finish(error=error)

    def fail_all(self, error: BaseException) -> None:
        for req in list(self.rows.values()):
            if req.open:
                req.finish(error=error)
        self.notify()

    def busy(self) -> bool:
        """Some row still waits for its reply."""
        return any(r.result is None for r in self.rows.values())

    def resend_scores(self) -> None:
        """Queue every open SCORE again under its id (the teacher may have lost them)."""
        for req in self.rows.values():
            if req.t == "SCORE" and req.open:
                req.sent_at = None

    async def pump(
        self,
        send: Callable[[Sequence[Any]], Awaitable[bool]],
        can_send: Callable[[Request], bool],
        *,
        max_inflight: int,
        request_timeout_s: float,
    ) -> None:
        """Send what is due: queued requests (within max_inflight), timeouts, retries."""
        now = time.monotonic()
        inflight = sum(
            1
            for r in self.rows.values()
            if r.t == "SCORE" and r.sent_at is not None and r.result is None
        )
        for req in list(self.rows.values()):
            if not req.open or not can_send(req):
                continue
            if req.sent_at is None:
                if req.t == "SCORE":
                    if inflight >= max_inflight:
                        continue
                    inflight += 1
            elif not (
                req.retry_at is not None
                and now >= req.retry_at
                or req.t not in _NOT_RESENT
                and now - req.sent_at >= request_timeout_s
            ):
                continue
            resend = req.sent_at is not None
            req.sent_at, req.retry_at = time.monotonic(), None
            if await send(req.frames) and resend:
                self.counts["retries"] += 1

    def on_error(self, msg: ErrorReply, retry_after_s: float) -> TokenizerMismatch | None:
        """File an ERROR under its row; returns the fatal error a tokenizer mismatch is."""
        rid = msg.ref_id if msg.ref_id is not None else msg.id
        req = self.rows.get(rid) if rid is not None else None
        if req is None or not req.open:
            self.counts["stale_dropped"] += 1
            return None
        if req.t != "SCORE":
            req.finish(result=msg)  # the caller interprets control errors
        elif msg.code == ErrorCode.NEED_HELLO:
            req.sent_at = None  # resent after the new HELLO_OK
        elif msg.code == ErrorCode.TOKENIZER_MISMATCH:
            return TokenizerMismatch(msg.message)
        elif msg.retryable or msg.code in RETRYABLE_CODES:
            req.retry_at = time.monotonic() + retry_after_s
        else:
            self.drop(
                req,
                TeacherError(f"teacher refused SCORE {rid}: {msg.code.value}: {msg.message}"),
            )
        return None

    def on_control_reply(self, msg: Message) -> None:
        """File a HELLO_OK, PONG, STATUS_OK or admin ``*_OK`` under its row."""
        req = self.rows.get(msg.id)
        if req is None or req.t == "SCORE" or req.done.is_set():
            # A second HELLO_OK for a HELLO resent while the teacher was loading carries no
            # targets: count it apart, so `stale_dropped` counts only SCORE replies.
            if not isinstance(msg, Pong):  # answers to heartbeat PINGs are not tracked
                self.counts["late_control_replies"] += 1
            return
        if not isinstance(msg, REPLY_TO[req.t]):
            self.counts["stale_dropped"] += 1
            return
        req.finish(result=msg)
