"""The client's connection to one teacher: socket, handshake, heartbeat, reconnect.

:class:`Link` keeps one DEALER (through a ``transport.py`` factory) up and talking:
HELLO on connect and a check of ``HELLO_OK`` (tokenizer fingerprint and vocabulary
must match — :class:`TokenizerMismatch` is fatal — unless the client announced
``xvocab`` and the teacher advertises it), a PING whenever the teacher has
been silent for ``heartbeat_ms`` (three misses: close, reconnect with backoff, HELLO
again), a resend of the same id after ``request_timeout_s`` or a retryable ERROR,
NEED_HELLO and a new ``instance`` answered by a fresh handshake and a resend of what
is pending, and :class:`TeacherUnavailable` once the teacher has been silent for
``unavailable_timeout_s``. Control requests (PING, STATUS, admin) go through
:meth:`Link.call`.

The link moves frames between the socket and the pending table (``pending.py``),
which it shares with the client (``client.py``): it sends the rows the table says are
due, files every decoded reply with the table (which alone decides whether a SCORE_OK
may be trained on) and tells it of every teacher ``(instance, gen)`` it sees. It writes
no row of the table; it reads back only the control requests it filed (HELLO, PING,
STATUS, admin) for their reply.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from miniverl.common.errors import (
    AdapterNotServed,
    ConfigError,
    ProtocolError,
    TeacherError,
    TeacherUnavailable,
    TokenizerMismatch,
    Unauthorized,
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
    Ping,
    Pong,
    ReloadOk,
    ScoreOk,
    StatusOk,
)
from miniverl.protocol.pending import REPLY_TO, RETRYABLE_CODES, PendingTable, Request
from miniverl.protocol.scoring_client import Identity
from miniverl.protocol.transport import Transport, TransportFactory, checked_factory, frame_nbytes
from miniverl.protocol.transport import zmq_transport_factory as _zmq_factory

MISSED_PINGS = 3
BACKOFF_START_S = 0.05
BACKOFF_MAX_S = 2.0


@dataclass(frozen=True)
class LinkSettings:
    """Where the teacher is and how patiently to talk to it.

    ``tokenizer_fp=None`` makes an admin-only link (no HELLO, no SCORE). ``curve``
    keys go to the default ZeroMQ transport; ``transport_factory`` replaces it
    (tests). ``limits`` are this side's before ``HELLO_OK`` tightens them.
    ``admin_token``/``admin_token_file``: the ``auth`` of admin calls (client.py).
    ``xvocab``: announce in HELLO that this client reads xvocab replies
    (docs/protocol.md, "xvocab"); a teacher with another tokenizer is then accepted
    when its HELLO_OK advertises the kind. False: HELLO is what it always was.
    ``adapter``: the named adapter this client scores with, sent in HELLO (and by the
    client in every SCORE); a HELLO_OK that does not list it is
    :class:`AdapterNotServed`. None: HELLO is what it always was.
    """

    endpoint: str
    tokenizer_fp: str | None
    vocab_size: int
    client_name: str = "student"
    heartbeat_ms: int = 1000
    request_timeout_s: float = 30.0
    unavailable_timeout_s: float = 60.0
    curve: CurveClientKeys | None = None
    transport_factory: TransportFactory | None = None
    limits: Limits | None = None
    admin_token: str | None = None
    admin_token_file: str | None = None
    xvocab: bool = False
    adapter: str | None = None


class Link:
    """One kept-alive connection, opened by :class:`~miniverl.protocol.client.TeacherClient`,
    feeding the client's ``table``."""

    def __init__(self, settings: LinkSettings, table: PendingTable):
        self.settings = settings
        self.endpoint = check_endpoint(settings.endpoint)
        self.tokenizer_fp = settings.tokenizer_fp
        self.vocab_size = settings.vocab_size
        self.heartbeat_s = settings.heartbeat_ms / 1000.0
        self.request_timeout_s = settings.request_timeout_s
        self.unavailable_timeout_s = settings.unavailable_timeout_s
        self.factory = checked_factory(settings.transport_factory) or _zmq_factory(settings.curve)
        self._base_limits = settings.limits or Limits()
        self.limits = self._base_limits
        self.hello: HelloOk | None = None
        self.tick = max(0.002, min(0.05, self.heartbeat_s / 5, self.request_timeout_s / 5))
        self.table = table
        self.identity: Identity | None = None  # the teacher last seen on the wire
        self.retargeting = False
        self._transport: Transport | None = None
        self._reader_scope: anyio.CancelScope | None = None
        self._state = "down"  # down -> hello -> up; closed, fatal
        self._state_wake = anyio.Event()
        self._fatal: BaseException | None = None
        self._unavailable: TeacherUnavailable | None = None
        self._last_recv = time.monotonic()
        self._last_ping = 0.0
        self._pings_out = 0
        self._failures = 0
        self._resend_on_up = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._started = False

    @property
    def up(self) -> bool:
        """Handshake validated and the connection alive (not reconnecting, closed or fatal)."""
        return self._state == "up" and self._unavailable is None

    # ----------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> Link:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._started = True
        self._tg.start_soon(self._ticker)
        self._tg.start_soon(self._keeper)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool | None:
        await self.aclose()
        group = self._group()
        group.cancel_scope.cancel()
        if exc is not None and not isinstance(exc, anyio.get_cancelled_exc_class()):
            # The background tasks never fail on their own; let the caller's error
            # propagate as itself rather than wrapped in an ExceptionGroup.
            await group.__aexit__(None, None, None)
            return False
        return await group.__aexit__(exc_type, exc, tb)

    def _group(self) -> anyio.abc.TaskGroup:
        """The task group ``async with`` opened (the link's background tasks run in it)."""
        if self._tg is None:
            raise RuntimeError(f"the link to {self.endpoint} is used outside `async with`")
        return self._tg

    def _up_hello(self) -> HelloOk:
        """The validated HELLO_OK of the link once ``until_up`` returned."""
        if self.hello is None:
            raise TeacherUnavailable(f"no handshake with {self.endpoint} yet")
        return self.hello

    async def aclose(self) -> None:
        """Close the connection; pending requests fail with :class:`TeacherUnavailable`."""
        self._close_transport()
        self._state = "closed"
        self.table.fail_all(TeacherUnavailable(f"client for {self.endpoint} was closed"))

    async def connect(self, timeout_s: float | None = None) -> HelloOk | None:
        """Open the link and handshake; returns the validated ``HELLO_OK``."""
        self.require_started()
        if isinstance(self._fatal, TeacherUnavailable):
            self._fatal = None
        if self._state == "closed":
            self._state = "down"
        self._unavailable = None
        self._last_recv = time.monotonic()
        self._wake_keeper()
        await self.until_up(timeout_s)
        return self.hello

    async def switch(self, endpoint: str) -> HelloOk:
        """Drop the socket and bring the link up again at ``endpoint`` (a retarget)."""
        self.endpoint = endpoint
        self.retargeting = True
        self._failures = 0
        self._down()
        await self.until_up(None)
        return self._up_hello()

    async def settled_identity(self) -> Identity:
        """The teacher ``(instance, gen)`` this link is up with, once up; handshakes again
        first when the wire has shown another gen (a reload since the last HELLO_OK)."""
        await self.until_up(None)
        hello = self._up_hello()
        identity = (hello.instance, hello.gen)
        if self.identity is not None and self.identity != identity:
            self._need_hello(resend=False)
            await self.until_up(None)
            hello = self._up_hello()
            identity = (hello.instance, hello.gen)
        return identity

    # ----------------------------------------------------------------- helpers
    def require_started(self) -> None:
        if not self._started:
            raise RuntimeError("use TeacherClient as 'async with TeacherClient(...) as client'")

    def raise_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._unavailable is not None:
            raise self._unavailable

    async def until_up(self, timeout_s: float | None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            progress = self.table.progress
            self.raise_fatal()
            if self._state == "up":
                return
            if self._state == "closed":
                raise TeacherUnavailable(f"client for {self.endpoint} is closed")
            if deadline is not None and time.monotonic() >= deadline:
                raise TeacherUnavailable(
                    f"no handshake with the teacher at {self.endpoint} within {timeout_s} s"
                )
            with anyio.move_on_after(self.tick):
                await progress.wait()

    # ----------------------------------------------------------------- sending
    async def _send(self, frames: Sequence[Any]) -> bool:
        transport = self._transport
        if transport is None:
            return False
        try:
            await transport.send_multipart(frames)
        except Exception:
            if transport is self._transport:
                self._down()
            return False
        self.table.count("sent")
        self.table.count("bytes_sent", sum(frame_nbytes(f) for f in frames))
        return True

    def _can_send(self, t: str) -> bool:
        """Whether a request of type ``t`` may go out now (SCOREs wait for HELLO_OK)."""
        if self._state == "up":
            return True
        return self._state == "hello" and t != "SCORE"

    async def pump(self) -> None:
        """Send what is due from the pending table."""
        await self.table.pump(
            self._send,
            self._can_send,
            max_inflight=self.limits.max_inflight,
            request_timeout_s=self.request_timeout_s,
        )

    async def call(self, msg: Message, timeout_s: float | None = None) -> Any:
        """Send one control request and return its reply (ERROR -> TeacherError)."""
        self.require_started()
        if self._fatal is not None:
            raise self._fatal
        req = Request(id=msg.id, t=msg.t, frames=encode(msg))
        self.table.file(req)
        limit = timeout_s or self.unavailable_timeout_s
        try:
            if self._state in ("down", "closed"):
                self._state = "down" if self._state == "closed" else self._state
                self._wake_keeper()
            # One deadline over the whole call, the send included: a socket whose
            # handshake never completes (a CURVE key the teacher does not list) must
            # not hold a caller past it.
            with anyio.move_on_after(limit):
                await self.pump()
                while not req.done.is_set():
                    with anyio.move_on_after(self.tick):
                        await req.done.wait()
            if not req.done.is_set():
                raise TeacherUnavailable(
                    f"no answer to {msg.t} from {self.endpoint} within {limit} s"
                )
        finally:
            self.table.take(req.id)
        if req.error is not None:
            raise req.error
        if isinstance(req.result, ErrorReply):
            reply = req.result
            cls = Unauthorized if reply.code == ErrorCode.UNAUTHORIZED else TeacherError
            raise cls(f"teacher refused {msg.t}: {reply.code.value}: {reply.message}")
        return req.result

    # ----------------------------------------------------------------- keeping it up
    async def _ticker(self) -> None:
        while True:
            await anyio.sleep(self.tick)
            try:
                await self._tick_once()
            except Exception as exc:  # keep the loop alive; surface the error to callers
                self._fatal = exc
                self.table.notify()

    async def _tick_once(self) -> None:
        now = time.monotonic()
        if self._state in ("closed", "fatal"):
            return
        silent = now - self._last_recv
        busy = self._state != "up" or self.table.busy()
        if busy and silent >= self.unavailable_timeout_s and self._unavailable is None:
            self._unavailable = TeacherUnavailable(
                f"the teacher at {self.endpoint} has not answered for {silent:.1f} s "
                f"(unavailable_timeout_s={self.unavailable_timeout_s}); check that it runs "
                "('miniverl teacher status ENDPOINT')"
            )
            self.table.fail_all(self._unavailable)
        if self._transport is not None and self._state in ("up", "hello"):
            if silent >= self.heartbeat_s and now - self._last_ping >= self.heartbeat_s:
                if self._pings_out >= MISSED_PINGS and self._state == "up":
                    self._down()  # MISSED_PINGS heartbeats missed
                else:
                    self._pings_out += 1
                    self._last_ping = now
                    await self._send(encode(Ping(id=self.table.new_id())))
            await self.pump()

    def _wake_keeper(self) -> None:
        self._state_wake.set()
        self._state_wake = anyio.Event()

    def _down(self) -> None:
        if self._state in ("closed", "fatal"):
            return
        self._state = "down"
        self._resend_on_up = True
        self._wake_keeper()
        self.table.notify()

    def _need_hello(self, resend: bool) -> None:
        """Handshake again on the same socket; ``resend`` when the teacher may have lost
        our requests (a new instance, NEED_HELLO), not for a new gen of the same process."""
        self._resend_on_up = self._resend_on_up or resend
        if self._state == "up" and self.tokenizer_fp is not None:
            self._state = "hello"
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
            wake = self._state_wake
            if self._state not in ("down", "hello"):
                await wake.wait()
                continue
            try:
                if self._state == "down":
                    if opened_before:
                        self.table.count("reconnects")
                        delay = min(BACKOFF_MAX_S, BACKOFF_START_S * 2**self._failures)
                        self._failures += 1
                        self._close_transport()
                        await anyio.sleep(delay)
                    opened_before = True
                    self._transport = self.factory(self.endpoint)
                    self._pings_out = 0
                    self._reader_scope = await self._group().start(self._reader, self._transport)
                    self._state = "hello"
                if self.tokenizer_fp is None:
                    self._up()
                    continue
                if await self._handshake():
                    self._up()
                elif self._state == "hello":
                    self._down()  # the handshake timed out
            except (TokenizerMismatch, TeacherError, ConfigError) as exc:  # never retried
                self._fatal, self._state = exc, "fatal"
                self._close_transport()
                self.table.fail_all(exc)
            except Exception:  # a broken factory or transport: retry with backoff
                self._resend_on_up = True
                if self._state not in ("closed", "fatal"):
                    self._state = "down"
                await anyio.sleep(self.tick)

    def _up(self) -> None:
        self._state = "up"
        self._failures = 0
        self._unavailable = None
        self.retargeting = False
        if self._resend_on_up:
            self._resend_on_up = False
            self.table.resend_scores()  # the same ids: what is pending goes out again
        self.table.notify()
        self._group().start_soon(self.pump)

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
            if reply.code == ErrorCode.UNSUPPORTED and self.settings.adapter is not None:
                raise AdapterNotServed(f"teacher refused HELLO: {reply.code.value}: "
                                       f"{reply.message}")
            if not (reply.retryable or reply.code in RETRYABLE_CODES):
                raise TeacherError(f"teacher refused HELLO: {reply.code.value}: {reply.message}")
            await anyio.sleep(min(BACKOFF_MAX_S, max(self.tick, self.heartbeat_s)))
            if self._state != "hello":
                return False
        other = reply.tokenizer_fp != self.tokenizer_fp or reply.vocab_size != self.vocab_size
        if other and not (self.settings.xvocab and reply.kinds.xvocab is not None):
            raise TokenizerMismatch(
                f"student tokenizer {self.tokenizer_fp} (vocab {self.vocab_size}) differs from "
                f"teacher tokenizer {reply.tokenizer_fp} (vocab {reply.vocab_size}); "
                "cross-tokenizer distillation is refused: use a teacher with the same tokenizer"
                + ("" if not self.settings.xvocab else
                   " (this teacher's HELLO_OK does not advertise xvocab)")
            )
        served = [info.name for info in reply.adapters or ()]
        if self.settings.adapter is not None and self.settings.adapter not in served:
            raise AdapterNotServed(
                f"the teacher at {self.endpoint} does not serve adapter "
                f"{self.settings.adapter!r}; it serves "
                + (", ".join(repr(name) for name in served) if served else "no named adapters")
                + "; pass one of them as adapter=, or start the teacher with --adapters "
                f"{self.settings.adapter}=DIR")
        self.hello = reply
        self.limits = Limits.from_hello(reply, self._base_limits)
        self._observe(reply.instance, reply.gen, rehello=False)
        return True

    async def _hello_once(self) -> HelloOk | ErrorReply | None:
        """Send one HELLO; its reply, or None when the socket went silent."""
        if self.tokenizer_fp is None:
            raise RuntimeError("an admin-only link (tokenizer_fp None) sends no HELLO")
        hello = Hello(
            id=self.table.new_id(),
            client=self.settings.client_name,
            tokenizer_fp=self.tokenizer_fp,
            vocab_size=self.vocab_size,
            understands=["xvocab"] if self.settings.xvocab else None,
            adapter=self.settings.adapter,
        )
        req = Request(id=hello.id, t="HELLO", frames=encode(hello))
        self.table.file(req)
        try:
            await self.pump()
            while not req.done.is_set():
                # Give up on this socket only when the teacher is silent (a loading
                # teacher answers PING and keeps the attempt alive).
                with anyio.move_on_after(self.tick):
                    await req.done.wait()
                if self._state != "hello" or self._pings_out >= MISSED_PINGS:
                    return None
        finally:
            self.table.take(req.id)
        if req.error is not None:
            raise req.error
        return req.result

    def _observe(self, instance: str | None, gen: int | None, rehello: bool = True) -> None:
        """Track the teacher identity seen on the wire: a new instance needs a fresh
        HELLO and a resend, a new gen only a fresh HELLO_OK; the table hears of both."""
        if instance is None or gen is None:
            return
        new = (instance, gen)
        old, self.identity = self.identity, new
        if old == new:
            return
        if rehello and old is not None:
            self._need_hello(resend=old[0] != instance)
        self.table.teacher_seen(new, retargeting=self.retargeting)

    # ----------------------------------------------------------------- receiving
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
                        self._down()  # the receive failed
                    return
                if transport is not self._transport:
                    return
                await self._on_frames(frames)

    async def _on_frames(self, frames: list[Any]) -> None:
        self.table.count("bytes_received", sum(frame_nbytes(f) for f in frames))
        self._last_recv = time.monotonic()
        self._pings_out = 0
        try:
            msg, arrays = decode(frames, self.limits)
        except ProtocolError:
            self.table.count("malformed")
            return
        self.table.count("received")
        if isinstance(msg, ScoreOk):
            teacher_vocab = self.hello.vocab_size if self.hello is not None else None
            self.table.on_score_ok(msg, arrays, self.vocab_size, teacher_vocab)
            self._observe(msg.instance, msg.gen)
        elif isinstance(msg, ErrorReply):
            self._on_error(msg)
        elif type(msg) in REPLY_TO.values():
            self._on_control_reply(msg)
        else:
            self.table.count("malformed")
        self.table.notify()

    def _on_error(self, msg: ErrorReply) -> None:
        self._observe(msg.instance, msg.gen)
        if msg.code == ErrorCode.NEED_HELLO:
            self._need_hello(resend=True)
        fatal = self.table.on_error(msg, retry_after_s=min(BACKOFF_MAX_S, self.heartbeat_s))
        if fatal is not None:
            self._fatal, self._state = fatal, "fatal"
            self.table.fail_all(fatal)

    def _on_control_reply(self, msg: Message) -> None:
        if isinstance(msg, (Pong, StatusOk)):
            self._observe(msg.instance, msg.gen)
        elif isinstance(msg, ReloadOk) and self.identity is not None:
            self._observe(self.identity[0], msg.gen)
        self.table.on_control_reply(msg)
