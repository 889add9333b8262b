"""The student's side of ``mvl-score/1``: an async client with the staleness rule, and a sync facade.

:class:`TeacherClient` (anyio, asyncio backend) keeps one DEALER connection, several
SCORE requests in flight matched by ``id``, and the link alive: HELLO on connect
(tokenizer fingerprint and vocabulary must match — :class:`TokenizerMismatch` is
fatal), a resend of the same id after ``request_timeout_s``, a PING whenever the
teacher has been silent for ``heartbeat_ms`` (three misses: close, reconnect with
backoff, HELLO again, resend what is pending), NEED_HELLO and a new ``instance``
answered by a fresh handshake, and :class:`TeacherUnavailable` once the teacher has
been silent for ``unavailable_timeout_s``.

The staleness rule (DESIGN §3): a SCORE_OK is accepted only if its id is pending,
its echoed ``student_version`` equals the pending one, the current version minus it
is within ``allowed_lag`` and — once :meth:`TeacherClient.bind` tied the update to a
teacher — it comes from that ``(instance, gen)``. Everything else is dropped and
counted in ``stale_dropped``. A new ``instance``/``gen`` seen while bound means the
update cannot complete: :meth:`TeacherClient.wait` raises :class:`TeacherChanged`.

:class:`SyncTeacherClient` runs the core on a blocking portal for the training loop.
The socket layer is injectable (``transport_factory``); see ``transport.py``. This
module does not compute losses, cache targets or serve anything.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np

from miniverl.common.errors import (
    MiniverlError,
    ProtocolError,
    StaleTargetError,
    TeacherError,
    TeacherUnavailable,
    TokenizerMismatch,
)
from miniverl.protocol.codec import decode, encode
from miniverl.protocol.endpoints import CurveClientKeys, check_endpoint
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import (
    ErrorCode,
    ErrorReply,
    Hello,
    HelloOk,
    Message,
    ParkOk,
    Ping,
    Pong,
    Reload,
    ReloadOk,
    Score,
    ScoreOk,
    Shutdown,
    ShutdownOk,
    StatusOk,
    WakeOk,
    validate_score,
)
from miniverl.protocol.messages import Park as ParkMsg
from miniverl.protocol.messages import Status as StatusMsg
from miniverl.protocol.messages import Wake as WakeMsg
from miniverl.protocol.transport import Transport, TransportFactory, frame_nbytes
from miniverl.protocol.transport import zmq_transport_factory as _zmq_factory

Identity = tuple[str, int]  # (instance, gen)

MISSED_PINGS = 3
BACKOFF_START_S = 0.05
BACKOFF_MAX_S = 2.0
RETRYABLE_CODES = {ErrorCode.OVERLOADED, ErrorCode.RELOADING, ErrorCode.DEADLINE_EXCEEDED}
_REPLY_TO = {
    "HELLO": HelloOk,
    "PING": Pong,
    "STATUS": StatusOk,
    "RELOAD": ReloadOk,
    "PARK": ParkOk,
    "WAKE": WakeOk,
    "SHUTDOWN": ShutdownOk,
}
_NOT_RESENT = {"RELOAD", "SHUTDOWN"}  # not idempotent: never sent twice


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


@dataclass
class _Request:
    id: int
    t: str
    frames: list[Any]
    sent_at: float | None = None  # None: queued, not sent yet
    retry_at: float | None = None
    student_version: int = 0
    binding: Identity | None = None
    kind: str = ""
    k: int = 0
    positions: int = 0
    result: Any = None
    error: BaseException | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class TeacherClient:
    """Async client of one teacher endpoint; use as ``async with TeacherClient(...) as c``.

    ``tokenizer_fp=None`` makes an admin-only client (status/park/wake/reload/
    shutdown; no HELLO, no SCORE).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        tokenizer_fp: str | None,
        vocab_size: int,
        client_name: str = "student",
        heartbeat_ms: int = 1000,
        request_timeout_s: float = 30.0,
        unavailable_timeout_s: float = 60.0,
        curve: CurveClientKeys | None = None,
        transport_factory: TransportFactory | None = None,
        limits: Limits | None = None,
    ):
        self.endpoint = check_endpoint(endpoint)
        self.tokenizer_fp = tokenizer_fp
        self.vocab_size = vocab_size
        self.client_name = client_name
        self.heartbeat_s = heartbeat_ms / 1000.0
        self.request_timeout_s = request_timeout_s
        self.unavailable_timeout_s = unavailable_timeout_s
        self._factory = transport_factory or _zmq_factory(curve)
        self._base_limits = limits or Limits()
        self._limits = self._base_limits
        self.hello: HelloOk | None = None
        self._tick = max(0.002, min(0.05, self.heartbeat_s / 5, request_timeout_s / 5))
        self._next_id = 1
        self._pending: dict[int, _Request] = {}
        self._version = 0
        self._allowed_lag = 0
        self._bound: Identity | None = None
        self._identity: Identity | None = None
        self._changed: TeacherChanged | None = None
        self._retargeting = False
        self._transport: Transport | None = None
        self._reader_scope: anyio.CancelScope | None = None
        self._link = "down"  # down -> hello -> up
        self._link_wake = anyio.Event()
        self._fatal: BaseException | None = None
        self._unavailable: TeacherUnavailable | None = None
        self._last_recv = time.monotonic()
        self._last_ping = 0.0
        self._pings_out = 0
        self._failures = 0
        self._resend_on_up = False
        self._last_error: BaseException | None = None
        self._progress = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._started = False
        self._counters = dict.fromkeys(
            (
                "sent",
                "received",
                "stale_dropped",
                "retries",
                "reconnects",
                "bytes_sent",
                "bytes_received",
                "malformed",
                "late_control_replies",
            ),
            0,
        )

    # ----------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> TeacherClient:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._started = True
        self._tg.start_soon(self._ticker)
        self._tg.start_soon(self._keeper)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool | None:
        await self.aclose()
        self._tg.cancel_scope.cancel()
        if exc is not None and not isinstance(exc, anyio.get_cancelled_exc_class()):
            # The background tasks never fail on their own; let the caller's error
            # propagate as itself rather than wrapped in an ExceptionGroup.
            await self._tg.__aexit__(None, None, None)
            return False
        return await self._tg.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Close the connection; pending requests fail with :class:`TeacherUnavailable`."""
        self._close_transport()
        self._link = "closed"
        self._fail_all(TeacherUnavailable(f"client for {self.endpoint} was closed"))

    @property
    def counters(self) -> dict[str, int]:
        """sent, received, stale_dropped, retries, reconnects, bytes_sent,
        bytes_received (all frames, resends and PINGs included), malformed."""
        return dict(self._counters)

    @property
    def bound(self) -> Identity | None:
        return self._bound

    @property
    def version(self) -> int:
        return self._version

    # ----------------------------------------------------------------- public API
    async def connect(self, timeout_s: float | None = None) -> HelloOk | None:
        """Open the link and handshake; returns the validated ``HELLO_OK``.

        Raises :class:`TokenizerMismatch` (fatal) or :class:`TeacherUnavailable`.
        """
        self._require_started()
        if isinstance(self._fatal, TeacherUnavailable):
            self._fatal = None
        if self._link == "closed":
            self._link = "down"
        self._unavailable = None
        self._last_recv = time.monotonic()
        self._wake_keeper()
        await self._until_up(timeout_s)
        return self.hello

    def set_version(self, version: int, allowed_lag: int = 0) -> None:
        """Set the student's current parameter version and the lag replies may have.

        Pending requests that fall outside the lag can never be accepted and are
        failed with :class:`StaleTargetError` (their late replies count as stale).
        """
        if version < 0 or allowed_lag < 0:
            raise ValueError(f"version={version}, allowed_lag={allowed_lag} must be >= 0")
        self._version, self._allowed_lag = version, allowed_lag
        for req in list(self._pending.values()):
            if req.t == "SCORE" and not self._within_lag(req.student_version):
                self._drop(
                    req,
                    StaleTargetError(
                        f"request {req.id} was sent for student version {req.student_version}, "
                        f"now {version} with allowed lag {allowed_lag}; re-submit it"
                    ),
                )
        self._notify()

    async def bind(self) -> Identity:
        """Tie the current update to the teacher ``(instance, gen)`` now connected.

        Requests bound to an earlier teacher are dropped (their replies count as stale).
        """
        await self._until_up(None)
        identity = (self.hello.instance, self.hello.gen)
        if self._identity is not None and self._identity != identity:
            await self._rehello()
            identity = (self.hello.instance, self.hello.gen)
        self._bound, self._changed = identity, None
        for req in list(self._pending.values()):
            if req.binding is not None and req.binding != identity:
                self._drop(req, self._changed_error(req.binding, identity))
        return identity

    def unbind(self) -> None:
        """Stop requiring a particular teacher for new requests."""
        self._bound, self._changed = None, None

    async def submit(
        self,
        tokens_N: Any,
        cu_seqlens_B1: Any,
        positions_P: Any,
        *,
        kind: str = "topk",
        k: int = 16,
        temperature: float = 1.0,
        deadline_ms: int | None = None,
    ) -> int:
        """Queue one SCORE for the current version and binding; returns its id.

        Arrays are checked locally first (:class:`ProtocolError` for a bad request).
        """
        self._require_started()
        self._raise_fatal()
        if self.tokenizer_fp is None:
            raise ProtocolError("this client has no tokenizer_fp (admin only); it cannot SCORE")
        arrays = {
            "tokens": _int32(tokens_N, "tokens_N"),
            "cu_seqlens": _int32(cu_seqlens_B1, "cu_seqlens_B1"),
            "positions": _int32(positions_P, "positions_P"),
        }
        rid = self._new_id()
        msg = Score(
            id=rid,
            student_version=self._version,
            kind=kind,
            k=k if kind == "topk" else 0,
            temperature=temperature,
            deadline_ms=deadline_ms,
        )
        validate_score(msg, arrays, self.vocab_size, self._limits)
        req = _Request(
            id=rid,
            t="SCORE",
            frames=encode(msg, arrays),
            student_version=self._version,
            binding=self._bound,
            kind=msg.kind,
            k=msg.k,
            positions=len(arrays["positions"]),
        )
        self._pending[rid] = req
        await self._pump()
        return rid

    async def wait(
        self, ids: Iterable[int], timeout_s: float | None = None
    ) -> dict[int, ScoreResult]:
        """Wait until every id has an accepted reply; returns ``{id: ScoreResult}``.

        Raises :class:`TeacherChanged`, :class:`TeacherError` (a non-retryable ERROR),
        :class:`StaleTargetError`, :class:`TokenizerMismatch`,
        :class:`TeacherUnavailable`, or :class:`ScoreTimeout` after ``timeout_s``.
        """
        wanted = list(ids)
        reqs = []
        for rid in wanted:
            req = self._pending.get(rid)
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
                    self._pending.pop(req.id, None)
                    raise req.error
            if all(req.result is not None for req in reqs):
                for rid in wanted:
                    self._pending.pop(rid, None)
                return {req.id: req.result for req in reqs}
            self._raise_fatal()
            if self._changed is not None and any(req.binding is not None for req in reqs):
                raise self._changed
            if deadline is not None and time.monotonic() >= deadline:
                left = [req.id for req in reqs if req.result is None]
                raise ScoreTimeout(f"no accepted reply for ids {left} within {timeout_s} s")
            with anyio.move_on_after(self._tick):
                await progress.wait()

    async def score(self, tokens_N: Any, cu_seqlens_B1: Any, positions_P: Any, **kw: Any):
        """``submit`` then ``wait`` for one request."""
        rid = await self.submit(tokens_N, cu_seqlens_B1, positions_P, **kw)
        return (await self.wait([rid]))[rid]

    async def retarget(self, endpoint: str) -> HelloOk:
        """Handshake with ``endpoint``; only if it validates, switch this client to it."""
        self._require_started()
        check_endpoint(endpoint)
        probe = TeacherClient(
            endpoint,
            tokenizer_fp=self.tokenizer_fp,
            vocab_size=self.vocab_size,
            client_name=self.client_name,
            heartbeat_ms=int(self.heartbeat_s * 1000),
            request_timeout_s=self.request_timeout_s,
            unavailable_timeout_s=self.unavailable_timeout_s,
            transport_factory=self._factory,
            limits=self._base_limits,
        )
        async with probe:
            await probe.connect()
        self.endpoint = endpoint
        self._retargeting = True
        self._failures = 0
        self._link_down(reason=None)
        await self._until_up(None)
        return self.hello

    async def ping(self) -> Pong:
        return await self._call(Ping(id=self._new_id()))

    async def status(self) -> dict[str, Any]:
        reply = await self._call(StatusMsg(id=self._new_id()))
        return reply.model_dump(mode="json")

    async def park(self) -> ParkOk:
        return await self._call(ParkMsg(id=self._new_id()))

    async def wake(self) -> WakeOk:
        return await self._call(WakeMsg(id=self._new_id()))

    async def reload(
        self,
        model: str,
        revision: str | None = None,
        adapter: str | None = None,
        mode: str = "drain",
        timeout_s: float = 600.0,
        adapter_revision: str | None = None,
    ) -> ReloadOk:
        msg = Reload(id=self._new_id(), model=model, revision=revision, adapter=adapter,
                     adapter_revision=adapter_revision, mode=mode)
        return await self._call(msg, timeout_s=timeout_s)

    async def shutdown(self, mode: str = "drain", timeout_s: float | None = None) -> ShutdownOk:
        msg = Shutdown(id=self._new_id(), mode=mode, timeout_s=timeout_s)
        wait_s = max(self.request_timeout_s, (timeout_s or 0.0) + self.request_timeout_s)
        return await self._call(msg, timeout_s=wait_s)

    # ----------------------------------------------------------------- internals
    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("use TeacherClient as 'async with TeacherClient(...) as client'")

    def _new_id(self) -> int:
        rid, self._next_id = self._next_id, self._next_id + 1
        return rid

    def _notify(self) -> None:
        self._progress.set()
        self._progress = anyio.Event()

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._unavailable is not None:
            raise self._unavailable

    def _within_lag(self, student_version: int) -> bool:
        return 0 <= self._version - student_version <= self._allowed_lag

    def _drop(self, req: _Request, error: BaseException) -> None:
        self._pending.pop(req.id, None)
        req.finish(error=error)

    def _fail_all(self, error: BaseException) -> None:
        for req in list(self._pending.values()):
            if req.result is None and req.error is None:
                req.finish(error=error)
        self._notify()

    def _changed_error(self, old: Identity, new: Identity) -> TeacherChanged:
        if self._retargeting:
            how = "retarget"
        elif old[0] != new[0]:
            how = "restart"
        else:
            how = "reload"
        return TeacherChanged(old, new, how)

    async def _until_up(self, timeout_s: float | None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            progress = self._progress
            self._raise_fatal()
            if self._link == "up":
                return
            if self._link == "closed":
                raise TeacherUnavailable(f"client for {self.endpoint} is closed")
            if deadline is not None and time.monotonic() >= deadline:
                raise TeacherUnavailable(
                    f"no handshake with the teacher at {self.endpoint} within {timeout_s} s"
                )
            with anyio.move_on_after(self._tick):
                await progress.wait()

    # -- sending
    async def _send(self, frames: Sequence[Any]) -> bool:
        transport = self._transport
        if transport is None:
            return False
        try:
            await transport.send_multipart(frames)
        except Exception:
            if transport is self._transport:
                self._link_down(reason="send failed")
            return False
        self._counters["sent"] += 1
        self._counters["bytes_sent"] += sum(frame_nbytes(f) for f in frames)
        return True

    async def _send_request(self, req: _Request) -> None:
        resend = req.sent_at is not None
        req.sent_at, req.retry_at = time.monotonic(), None
        if await self._send(req.frames) and resend:
            self._counters["retries"] += 1

    def _can_send(self, req: _Request) -> bool:
        if self._link == "up":
            return True
        return self._link == "hello" and req.t != "SCORE"

    async def _pump(self) -> None:
        """Send what is due: queued requests (within max_inflight), timeouts, retries."""
        now = time.monotonic()
        inflight = sum(
            1
            for r in self._pending.values()
            if r.t == "SCORE" and r.sent_at is not None and r.result is None
        )
        for req in list(self._pending.values()):
            if req.result is not None or req.error is not None or not self._can_send(req):
                continue
            if req.sent_at is None:
                if req.t == "SCORE":
                    if inflight >= self._limits.max_inflight:
                        continue
                    inflight += 1
                await self._send_request(req)
            elif (
                req.retry_at is not None
                and now >= req.retry_at
                or req.t not in _NOT_RESENT
                and now - req.sent_at >= self.request_timeout_s
            ):
                await self._send_request(req)

    # -- background tasks
    async def _ticker(self) -> None:
        while True:
            await anyio.sleep(self._tick)
            try:
                await self._tick_once()
            except Exception as exc:  # keep the loop alive; surface the error to callers
                self._fatal = exc
                self._notify()

    async def _tick_once(self) -> None:
        now = time.monotonic()
        if self._link in ("closed", "fatal"):
            return
        silent = now - self._last_recv
        busy = self._link != "up" or any(r.result is None for r in self._pending.values())
        if busy and silent >= self.unavailable_timeout_s and self._unavailable is None:
            self._unavailable = TeacherUnavailable(
                f"the teacher at {self.endpoint} has not answered for {silent:.1f} s "
                f"(unavailable_timeout_s={self.unavailable_timeout_s}); check that it runs "
                "('miniverl teacher status ENDPOINT')"
            )
            self._fail_all(self._unavailable)
        if self._transport is not None and self._link in ("up", "hello"):
            if silent >= self.heartbeat_s and now - self._last_ping >= self.heartbeat_s:
                if self._pings_out >= MISSED_PINGS and self._link == "up":
                    self._link_down(reason=f"{MISSED_PINGS} heartbeats missed")
                else:
                    self._pings_out += 1
                    self._last_ping = now
                    await self._send(encode(Ping(id=self._new_id())))
            await self._pump()

    def _wake_keeper(self) -> None:
        self._link_wake.set()
        self._link_wake = anyio.Event()

    def _link_down(self, reason: str | None) -> None:
        if self._link in ("closed", "fatal"):
            return
        self._link = "down"
        self._resend_on_up = True
        self._wake_keeper()
        self._notify()

    def _need_hello(self, resend: bool) -> None:
        """Handshake again on the same socket; ``resend`` when the teacher may have lost
        our requests (a new instance, NEED_HELLO), not for a new gen of the same process."""
        self._resend_on_up = self._resend_on_up or resend
        if self._link == "up" and self.tokenizer_fp is not None:
            self._link = "hello"
            self._wake_keeper()

    def _close_transport(self) -> None:
        if self._reader_scope is not None:
            self._reader_scope.cancel()
            self._reader_scope = None
        if self._transport is not None:
            transport, self._transport = self._transport, None
            with contextlib.suppress(Exception):  # a broken socket must not mask the reason
                transport.close()

    async def _keeper(self) -> None:
        """Bring the link up whenever it is down: (re)connect with backoff, then HELLO."""
        opened_before = False
        while True:
            wake = self._link_wake
            if self._link not in ("down", "hello"):
                await wake.wait()
                continue
            try:
                if self._link == "down":
                    if opened_before:
                        self._counters["reconnects"] += 1
                        delay = min(BACKOFF_MAX_S, BACKOFF_START_S * 2**self._failures)
                        self._failures += 1
                        self._close_transport()
                        await anyio.sleep(delay)
                    opened_before = True
                    self._transport = self._factory(self.endpoint)
                    self._pings_out = 0
                    self._reader_scope = await self._tg.start(self._reader, self._transport)
                    self._link = "hello"
                if self.tokenizer_fp is None:
                    self._link_up()
                    continue
                if await self._handshake():
                    self._link_up()
                elif self._link == "hello":
                    self._link_down(reason="handshake timed out")
            except (TokenizerMismatch, TeacherError) as exc:
                self._fatal, self._link = exc, "fatal"
                self._close_transport()
                self._fail_all(exc)
            except Exception as exc:  # a broken factory or transport: retry with backoff
                self._last_error = exc
                self._resend_on_up = True
                if self._link not in ("closed", "fatal"):
                    self._link = "down"
                await anyio.sleep(self._tick)

    def _link_up(self) -> None:
        self._link = "up"
        self._failures = 0
        self._unavailable = None
        self._retargeting = False
        if self._resend_on_up:
            self._resend_on_up = False
            for req in self._pending.values():
                if req.t == "SCORE" and req.result is None and req.error is None:
                    req.sent_at = None  # resend what is pending (same id)
        self._notify()
        self._tg.start_soon(self._pump)

    async def _reader(self, transport: Transport, *, task_status=anyio.TASK_STATUS_IGNORED):
        with anyio.CancelScope() as scope:
            task_status.started(scope)
            while True:
                try:
                    frames = await transport.recv_multipart()
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception:
                    if transport is self._transport:
                        self._link_down(reason="receive failed")
                    return
                if transport is not self._transport:
                    return
                await self._on_frames(frames)

    async def _handshake(self) -> bool:
        """HELLO until validated (True) or the socket looks dead (False: reconnect)."""
        while True:
            reply = await self._hello_once()
            if reply is None:
                return False
            if isinstance(reply, HelloOk):
                break
            if reply.code == ErrorCode.TOKENIZER_MISMATCH:
                raise TokenizerMismatch(reply.message)
            if not (reply.retryable or reply.code in RETRYABLE_CODES):
                raise TeacherError(f"teacher refused HELLO: {reply.code.value}: {reply.message}")
            await anyio.sleep(min(BACKOFF_MAX_S, max(self._tick, self.heartbeat_s)))
            if self._link != "hello":
                return False
        if reply.tokenizer_fp != self.tokenizer_fp or reply.vocab_size != self.vocab_size:
            raise TokenizerMismatch(
                f"student tokenizer {self.tokenizer_fp} (vocab {self.vocab_size}) differs from "
                f"teacher tokenizer {reply.tokenizer_fp} (vocab {reply.vocab_size}); "
                "cross-tokenizer distillation is refused: use a teacher with the same tokenizer"
            )
        self.hello = reply
        self._limits = Limits.from_hello(reply, self._base_limits)
        self._observe(reply.instance, reply.gen, rehello=False)
        return True

    async def _hello_once(self) -> HelloOk | ErrorReply | None:
        """Send one HELLO; its reply, or None when the socket went silent."""
        hello = Hello(
            id=self._new_id(),
            client=self.client_name,
            tokenizer_fp=self.tokenizer_fp,
            vocab_size=self.vocab_size,
        )
        req = _Request(id=hello.id, t="HELLO", frames=encode(hello))
        self._pending[req.id] = req
        try:
            await self._pump()
            while not req.done.is_set():
                # Give up on this socket only when the teacher is silent (a loading
                # teacher answers PING and keeps the attempt alive).
                with anyio.move_on_after(self._tick):
                    await req.done.wait()
                if self._link != "hello" or self._pings_out >= MISSED_PINGS:
                    return None
        finally:
            self._pending.pop(req.id, None)
        if req.error is not None:
            raise req.error
        return req.result

    async def _rehello(self) -> None:
        self._need_hello(resend=False)
        await self._until_up(None)

    def _observe(self, instance: str | None, gen: int | None, rehello: bool = True) -> None:
        """Track the teacher identity seen on the wire; a change while bound is fatal
        for the bound update, a new instance needs a fresh HELLO."""
        if instance is None or gen is None:
            return
        new = (instance, gen)
        old, self._identity = self._identity, new
        if old == new:
            return
        if rehello and old is not None:
            # A new process lost our requests; a new gen only needs a fresh HELLO_OK.
            self._need_hello(resend=old[0] != instance)
        if self._bound is not None and new != self._bound and self._changed is None:
            self._changed = self._changed_error(self._bound, new)
            self._notify()

    # -- receiving
    async def _on_frames(self, frames: list[Any]) -> None:
        self._counters["bytes_received"] += sum(frame_nbytes(f) for f in frames)
        self._last_recv = time.monotonic()
        self._pings_out = 0
        try:
            msg, arrays = decode(frames, self._limits)
        except ProtocolError:
            self._counters["malformed"] += 1
            return
        self._counters["received"] += 1
        if isinstance(msg, ScoreOk):
            self._on_score_ok(msg, arrays)
        elif isinstance(msg, ErrorReply):
            self._on_error(msg)
        elif type(msg) in _REPLY_TO.values():
            self._on_control_reply(msg)
        else:
            self._counters["malformed"] += 1
        self._notify()

    def _stale(self) -> None:
        self._counters["stale_dropped"] += 1

    def _on_score_ok(self, msg: ScoreOk, arrays: dict[str, np.ndarray]) -> None:
        req = self._pending.get(msg.id)
        identity = (msg.instance, msg.gen)
        if (
            req is None
            or req.t != "SCORE"
            or req.result is not None
            or req.error is not None
            or msg.student_version != req.student_version
        ):
            self._stale()
        elif not self._within_lag(req.student_version):
            self._stale()
            self._drop(req, StaleTargetError(f"reply {msg.id} is outside the allowed lag"))
        elif req.binding is not None and (req.binding != self._bound or identity != req.binding):
            self._stale()
        elif not self._reply_matches(req, msg, arrays):
            self._counters["malformed"] += 1
        else:
            req.finish(
                result=ScoreResult(
                    id=msg.id,
                    student_version=msg.student_version,
                    instance=msg.instance,
                    gen=msg.gen,
                    kind=msg.kind,
                    k=msg.k,
                    arrays=arrays,
                    timing=msg.timing.model_dump(),
                )
            )
        self._observe(msg.instance, msg.gen)

    def _reply_matches(self, req: _Request, msg: ScoreOk, arrays: dict[str, np.ndarray]) -> bool:
        if msg.kind != req.kind or (req.kind == "topk" and msg.k != req.k):
            return False
        if arrays["target_logprobs"].shape[0] != req.positions:
            return False
        return req.kind == "topk" or arrays["logprobs"].shape[1] == self.vocab_size

    def _on_error(self, msg: ErrorReply) -> None:
        self._observe(msg.instance, msg.gen)
        rid = msg.ref_id if msg.ref_id is not None else msg.id
        req = self._pending.get(rid) if rid is not None else None
        if msg.code == ErrorCode.NEED_HELLO:
            self._need_hello(resend=True)
        if req is None or req.result is not None or req.error is not None:
            self._stale()
            return
        if req.t != "SCORE":
            req.finish(result=msg)  # the caller interprets control errors
            return
        if msg.code == ErrorCode.NEED_HELLO:
            req.sent_at = None  # resent after the new HELLO_OK
        elif msg.code == ErrorCode.TOKENIZER_MISMATCH:
            self._fatal, self._link = TokenizerMismatch(msg.message), "fatal"
            self._fail_all(self._fatal)
        elif msg.retryable or msg.code in RETRYABLE_CODES:
            backoff = min(BACKOFF_MAX_S, self.heartbeat_s)
            req.retry_at = time.monotonic() + backoff
        else:
            self._drop(
                req,
                TeacherError(f"teacher refused SCORE {rid}: {msg.code.value}: {msg.message}"),
            )

    def _on_control_reply(self, msg: Message) -> None:
        if isinstance(msg, (Pong, StatusOk)):
            self._observe(msg.instance, msg.gen)
        elif isinstance(msg, ReloadOk) and self._identity is not None:
            self._observe(self._identity[0], msg.gen)
        req = self._pending.get(msg.id)
        if req is None or req.t == "SCORE" or req.done.is_set():
            # A second HELLO_OK for a HELLO resent while the teacher was loading carries no
            # targets: count it apart, so `stale_dropped` counts only SCORE replies.
            if not isinstance(msg, Pong):  # answers to heartbeat PINGs are not tracked
                self._counters["late_control_replies"] += 1
            return
        if not isinstance(msg, _REPLY_TO[req.t]):
            self._stale()
            return
        req.finish(result=msg)

    async def _call(self, msg: Message, timeout_s: float | None = None) -> Any:
        """Send one control request and return its reply (ERROR -> TeacherError)."""
        self._require_started()
        if self._fatal is not None:
            raise self._fatal
        req = _Request(id=msg.id, t=msg.t, frames=encode(msg))
        self._pending[req.id] = req
        deadline = time.monotonic() + (timeout_s or self.unavailable_timeout_s)
        try:
            if self._link in ("down", "closed"):
                self._link = "down" if self._link == "closed" else self._link
                self._wake_keeper()
            await self._pump()
            while not req.done.is_set():
                if time.monotonic() >= deadline:
                    raise TeacherUnavailable(
                        f"no answer to {msg.t} from {self.endpoint} within "
                        f"{timeout_s or self.unavailable_timeout_s} s"
                    )
                with anyio.move_on_after(self._tick):
                    await req.done.wait()
        finally:
            self._pending.pop(req.id, None)
        if req.error is not None:
            raise req.error
        if isinstance(req.result, ErrorReply):
            reply = req.result
            raise TeacherError(f"teacher refused {msg.t}: {reply.code.value}: {reply.message}")
        return req.result


def _int32(value: Any, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ProtocolError(f"{name} must be a 1-D integer array, got {arr.dtype}{list(arr.shape)}")
    if arr.size and (int(arr.min()) < -(2**31) or int(arr.max()) >= 2**31):
        raise ProtocolError(f"{name} holds values outside int32")
    return arr.astype("<i4", copy=False)


def __getattr__(name: str) -> Any:
    # The blocking facade lives in its own module; it stays importable from here.
    if name == "SyncTeacherClient":
        from miniverl.protocol.sync_client import SyncTeacherClient

        return SyncTeacherClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
