"""The client's pending table: every request in flight, and THE staleness rule
(docs/protocol.md, "Staleness rule").

A :class:`Request` is one row of the table: a request sent (or queued) under its
``id``, with its encoded frames for a resend and, for a ``SCORE``, what docs/protocol.md
("Staleness rule") calls ``pending[id] = (student_version, binding)``: the student
version it was sent for and the teacher ``(instance, gen)`` the update was bound to.

:class:`PendingTable` owns the rows and everything that decides their fate: the
student's current version, the allowed lag and the bound teacher (set by the client,
``client.py``), which rows are due to be sent (the link sends them, ``link.py``), and
what each reply does to its row. A request passes through it four times, each once:
filed (:meth:`~PendingTable.file`), sent (:meth:`~PendingTable.pump`), answered
(:meth:`~PendingTable.on_score_ok`, :meth:`~PendingTable.on_error`,
:meth:`~PendingTable.on_control_reply`) and collected (:meth:`~PendingTable.collect`).
No other module writes a row's fields or the table's; the link only reads back the
control requests it filed (their ``done``, ``result`` or ``error``).

:func:`accept_reply` is the one place that decides whether a ``SCORE_OK`` may be
trained on; :meth:`PendingTable.on_score_ok` applies it once per reply, then the
reply checks of ``checks.py``. :func:`within_lag` is its version half, for checks that
have no reply (a pending request after the version moved, a replay buffer entry, the
targets cache). The in-process fake (``miniverl.testing``) applies the same rule.

This module holds no socket and never reconnects (``link.py``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

import anyio
import numpy as np

from miniverl.common.errors import (
    StaleTargetError,
    TeacherError,
    TeacherRefusing,
    TokenizerMismatch,
)
from miniverl.protocol.checks import reply_problem, xvocab_reply_problem
from miniverl.protocol.messages import (
    ErrorCode,
    ErrorReply,
    HelloOk,
    Message,
    ParkOk,
    Pong,
    ReloadOk,
    ScoreOk,
    ShutdownOk,
    StatusOk,
    WakeOk,
)
from miniverl.protocol.scoring_client import Identity, ScoreResult, ScoreTimeout, TeacherChanged

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
    """What a SCORE was sent for: ``pending[id] = (student_version, binding)`` of
    docs/protocol.md ("Staleness rule"), the binding the teacher ``(instance, gen)`` (None:
    sent while no update was bound)."""

    student_version: int
    binding: Identity | None


class ScoredReply(Protocol):
    """What the rule reads from a reply (``ScoreOk`` on the wire, ``ScoreResult`` after)."""

    @property
    def student_version(self) -> int: ...
    @property
    def instance(self) -> str: ...
    @property
    def gen(self) -> int: ...


@dataclass
class Request:
    """One row of the pending table, SCORE or control request, until its reply is taken."""

    id: int
    t: str
    frames: list[Any]
    sent_at: float | None = None  # None: queued, not sent yet
    retry_at: float | None = None
    resent: bool = False  # queued again after it went out once: its next send is a retry
    student_version: int = 0
    binding: Identity | None = None  # the teacher the update was bound to; None: any
    kind: str = ""
    k: int = 0
    positions: int = 0  # xvocab: the student's tokens the groups must tile
    digest: str | None = None  # xvocab: the request digest a reply must name
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


def within_lag(current_version: int, sent_version: int, lag: int) -> bool:
    """True when targets for ``sent_version`` may train version ``current_version``:
    ``0 <= current - sent <= lag`` (0 for strict OPD, ``lag`` for replay)."""
    return 0 <= current_version - sent_version <= lag


def accept_reply(
    pending: Pending | None,
    reply: ScoredReply,
    *,
    current_version: int,
    lag: int,
    bound_teacher: Identity | None,
) -> StaleReason | None:
    """None when ``reply`` may be trained on, else why it must be dropped (docs/protocol.md,
    "Staleness rule").

    A SCORE_OK is accepted only if its id is pending (``pending`` is the entry for the
    reply's id, None when there is none), its echoed ``student_version`` equals the pending one,
    ``current_version`` minus that version is within ``lag``, and — when the
    request was sent bound to a teacher — it comes from that ``(instance, gen)``, which
    is still the one the current update is bound to (``bound_teacher``).
    """
    if pending is None:
        return "not_pending"
    if reply.student_version != pending.student_version:
        return "version"
    if not within_lag(current_version, pending.student_version, lag):
        return "lag"
    binding = pending.binding
    if binding is not None and (binding != bound_teacher or (reply.instance, reply.gen) != binding):
        return "teacher"
    return None


class PendingTable:
    """Rows by id, the counters, the version and binding replies are held to, and the
    ``progress`` event waiters sleep on."""

    def __init__(self) -> None:
        self._rows: dict[int, Request] = {}
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._progress = anyio.Event()
        self._next_id = 1
        self.version = 0
        self.lag = 0
        self.bound: Identity | None = None
        self._changed: TeacherChanged | None = None

    # ----------------------------------------------------------------- bookkeeping
    def new_id(self) -> int:
        rid, self._next_id = self._next_id, self._next_id + 1
        return rid

    @property
    def progress(self) -> anyio.Event:
        """Set (and replaced) whenever something changed: a reply, an error, a drop."""
        return self._progress

    def notify(self) -> None:
        """Wake everyone waiting on :attr:`progress`."""
        self._progress.set()
        self._progress = anyio.Event()

    def count(self, name: str, by: int = 1) -> None:
        self._counts[name] += by

    def counters(self) -> dict[str, int]:
        """A copy of the counters (``COUNTERS``)."""
        return dict(self._counts)

    def file(self, req: Request) -> None:
        """Add a row; it goes out at the next :meth:`pump`."""
        self._rows[req.id] = req

    def file_score(self, frames: list[Any], *, rid: int, kind: str, k: int,
                   positions: int, digest: str | None = None) -> None:
        """File a SCORE encoded for :attr:`version` and sent under :attr:`bound`
        (``digest``: an xvocab request's, ``xvocab.request_digest``)."""
        self.file(Request(id=rid, t="SCORE", frames=frames, student_version=self.version,
                          binding=self.bound, kind=kind, k=k, positions=positions,
                          digest=digest))

    def take(self, rid: int) -> None:
        """Forget a row whose caller has its answer (or gave up)."""
        self._rows.pop(rid, None)

    def _drop(self, req: Request, error: BaseException) -> None:
        self._rows.pop(req.id, None)
        req.finish(error=error)

    def fail_all(self, error: BaseException) -> None:
        for req in list(self._rows.values()):
            if req.open:
                req.finish(error=error)
        self.notify()

    def busy(self) -> bool:
        """Some row still waits for its reply."""
        return any(r.open for r in self._rows.values())

    def resend_scores(self) -> None:
        """Queue every open SCORE again under its id (the teacher may have lost them)."""
        for req in self._rows.values():
            if req.t == "SCORE" and req.open:
                req.sent_at, req.resent = None, req.resent or req.sent_at is not None

    # ----------------------------------------------------------------- version and binding
    def set_version(self, version: int, lag: int = 0) -> None:
        """The student's version now; SCOREs outside the lag fail with StaleTargetError."""
        if version < 0 or lag < 0:
            raise ValueError(f"version={version}, lag={lag} must be >= 0")
        self.version, self.lag = version, lag
        for req in list(self._rows.values()):
            if req.t == "SCORE" and not within_lag(version, req.student_version, lag):
                self._drop(req, StaleTargetError(
                    f"request {req.id} was sent for student version {req.student_version}, "
                    f"now {version} with allowed lag {lag}; re-submit it"))
        self.notify()

    def bind(self, identity: Identity, *, retargeting: bool) -> None:
        """Tie new SCOREs to ``identity``; rows bound to another teacher are dropped."""
        self.bound, self._changed = identity, None
        for req in list(self._rows.values()):
            if req.binding is not None and req.binding != identity:
                self._drop(req, _changed(req.binding, identity, retargeting))

    def unbind(self) -> None:
        self.bound, self._changed = None, None

    def teacher_seen(self, new: Identity, *, retargeting: bool) -> None:
        """A teacher answered; one other than the bound one means the update cannot finish."""
        if self.bound is not None and new != self.bound and self._changed is None:
            self._changed = _changed(self.bound, new, retargeting)
            self.notify()

    # ----------------------------------------------------------------- sending
    async def pump(
        self,
        send: Callable[[Sequence[Any]], Awaitable[bool]],
        can_send: Callable[[str], bool],
        *,
        max_inflight: int,
        request_timeout_s: float,
    ) -> None:
        """Send what is due: queued requests (within max_inflight), timeouts, retries."""
        now = time.monotonic()
        inflight = sum(
            1
            for r in self._rows.values()
            if r.t == "SCORE" and r.sent_at is not None and r.result is None
        )
        for req in list(self._rows.values()):
            if not req.open or not can_send(req.t):
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
            resend = req.sent_at is not None or req.resent
            req.sent_at, req.retry_at = time.monotonic(), None
            if await send(req.frames) and resend:
                req.resent = False
                self._counts["retries"] += 1

    # ----------------------------------------------------------------- receiving
    def on_score_ok(self, msg: ScoreOk, arrays: dict[str, np.ndarray], vocab_size: int,
                    teacher_vocab_size: int | None = None) -> None:
        """Accept a SCORE_OK (the staleness rule, then ``checks.reply_problem``, or for
        an xvocab request ``xvocab.xvocab_reply_problem`` against the teacher's
        vocabulary ``teacher_vocab_size``) or drop it."""
        req = self._rows.get(msg.id)
        reason = accept_reply(req.pending if req is not None else None, msg,
                              current_version=self.version, lag=self.lag,
                              bound_teacher=self.bound)
        if reason is not None or req is None:  # no pending request: accept_reply refused it
            self._counts["stale_dropped"] += 1
            if reason == "lag" and req is not None:
                self._drop(req, StaleTargetError(f"reply {msg.id} is outside the allowed lag"))
            return
        if req.kind == "xvocab":
            problem = xvocab_reply_problem(msg, arrays, k=req.k, request_sha256=req.digest,
                                           student_tokens=req.positions,
                                           vocab_size=teacher_vocab_size or vocab_size)
        else:
            problem = reply_problem(msg, arrays, kind=req.kind, k=req.k,
                                    positions=req.positions, vocab_size=vocab_size)
        if problem is None:
            req.finish(result=ScoreResult.from_reply(msg, arrays))
            return
        self._counts[problem.counter] += 1  # never trained on
        if problem.error is not None:
            # The row stays until collected, so the waiter reads this error, not "id is
            # not pending" (a reply refused before wait() was called).
            req.finish(error=TeacherError(problem.error))

    def on_error(self, msg: ErrorReply, retry_after_s: float) -> TokenizerMismatch | None:
        """File an ERROR under its row; returns the fatal error a tokenizer mismatch is."""
        rid = msg.ref_id if msg.ref_id is not None else msg.id
        req = self._rows.get(rid) if rid is not None else None
        if req is None or not req.open:
            self._counts["stale_dropped"] += 1
            return None
        if req.t != "SCORE":
            req.finish(result=msg)  # the caller interprets control errors
        elif msg.code == ErrorCode.NEED_HELLO:
            # resent after the new HELLO_OK
            req.sent_at, req.resent = None, req.resent or req.sent_at is not None
        elif msg.code == ErrorCode.TOKENIZER_MISMATCH:
            return TokenizerMismatch(msg.message)
        elif msg.retryable or msg.code in RETRYABLE_CODES:
            req.retry_at = time.monotonic() + retry_after_s
        else:
            # The row stays until collected, so the waiter reads this refusal, not "id is
            # not pending" (which once ended a run whose swapped-in teacher refused every
            # SCORE); a refusal is an unavailable teacher to the run (TeacherRefusing).
            req.finish(error=TeacherRefusing(
                f"teacher refused SCORE {rid}: {msg.code.value}: {msg.message}"))
        return None

    def on_control_reply(self, msg: Message) -> None:
        """File a HELLO_OK, PONG, STATUS_OK or admin ``*_OK`` under its row."""
        req = self._rows.get(msg.id)
        if req is None or req.t == "SCORE" or req.done.is_set():
            # A second HELLO_OK for a HELLO resent while the teacher was loading carries no
            # targets: count it apart, so `stale_dropped` counts only SCORE replies.
            if not isinstance(msg, Pong):  # answers to heartbeat PINGs are not tracked
                self._counts["late_control_replies"] += 1
            return
        if not isinstance(msg, REPLY_TO[req.t]):
            self._counts["stale_dropped"] += 1
            return
        req.finish(result=msg)

    # ----------------------------------------------------------------- collecting
    async def collect(
        self,
        ids: Iterable[int],
        timeout_s: float | None,
        *,
        tick: float,
        raise_fatal: Callable[[], None],
    ) -> dict[int, ScoreResult]:
        """Wait until every SCORE in ``ids`` has an accepted reply and take the rows.

        Raises the row's error, ``raise_fatal``'s (the connection's), the pending
        :class:`TeacherChanged` of a bound row, or :class:`ScoreTimeout`.
        """
        wanted = list(ids)
        reqs = []
        for rid in wanted:
            req = self._rows.get(rid)
            if req is None or req.t != "SCORE":
                raise StaleTargetError(
                    f"request id {rid} is not pending (already collected, or dropped by "
                    "set_version/bind); re-submit it"
                )
            reqs.append(req)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            progress = self._progress
            for req in reqs:
                if req.error is not None:
                    self._rows.pop(req.id, None)
                    raise req.error
            if all(req.result is not None for req in reqs):
                for rid in wanted:
                    self._rows.pop(rid, None)
                return {req.id: req.result for req in reqs}
            raise_fatal()
            if self._changed is not None and any(req.binding is not None for req in reqs):
                raise self._changed
            if deadline is not None and time.monotonic() >= deadline:
                left = [req.id for req in reqs if req.result is None]
                raise ScoreTimeout(f"no accepted reply for ids {left} within {timeout_s} s")
            with anyio.move_on_after(tick):
                await progress.wait()


def _changed(old: Identity, new: Identity, retargeting: bool) -> TeacherChanged:
    if retargeting:
        how = "retarget"
    elif old[0] != new[0]:
        how = "restart"
    else:
        how = "reload"
    return TeacherChanged(old, new, how)
