"""Server transport of ``mvl-score/1``: one ZeroMQ ROUTER in front of a scoring backend.

:class:`TeacherServer` owns the socket and the request lifecycle; the model lives in a
*backend* object (see :class:`Backend`) that a loader callable builds, so this module
stays torch-free. Socket I/O runs on an asyncio loop; every piece of compute (loading,
scoring, park/wake) runs on one worker thread, so ``PING`` is answered while a batch
computes.

What the transport guarantees (DESIGN §3):

- binds *before* loading (state ``LOADING``; ``PING`` is answered, ``HELLO`` waits for
  the model, ``SCORE`` gets a retryable ``ERROR RELOADING``);
- every malformed message gets ``ERROR`` with the request's id (``BAD_REQUEST``,
  ``VERSION_MISMATCH``, ``TOO_LARGE``...) or is dropped when no header parses; the
  loop body is wrapped so nothing a client sends can stop the loop;
- ``SCORE`` before ``HELLO`` (to this instance) → ``NEED_HELLO``; ``HELLO`` with another
  tokenizer fingerprint or vocabulary → ``TOKENIZER_MISMATCH`` naming both;
- per client at most ``max_inflight`` open requests (``OVERLOADED``); a resent id that
  is still open is not computed twice, a resent id answered in the last
  ``dedup_ttl_s`` gets the cached reply;
- queued ``SCORE`` requests are coalesced up to ``batch_tokens`` into one forward pass;
- ``RELOAD`` (drain|abort) loads and validates the new teacher before it replaces the
  old one (which keeps serving on failure) and bumps ``gen``; ``PARK``/``WAKE`` call the
  backend; a ``SCORE`` that arrives while parked wakes the teacher implicitly;
  ``SHUTDOWN`` drain|abort (SIGTERM = drain, see :func:`run_server`).

It does not know how scoring is computed, and it never imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import traceback
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import zmq
import zmq.asyncio

from miniverl.common.errors import MiniverlError, TokenizerMismatch
from miniverl.protocol import messages as m
from miniverl.protocol.codec import decode, decode_header_only, encode
from miniverl.protocol.endpoints import (
    DEFAULT_TCP_ENDPOINT,
    apply_curve_server,
    check_bind_endpoint,
    load_curve_server_keys,
    start_curve_authenticator,
)
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import ErrorCode, ProtocolViolation, TeacherState

SERVER_VERSION = "miniverl-teacher/1"

LogFn = Callable[..., None]  # log(level, event, **fields)


class BackendError(MiniverlError, RuntimeError):
    """A per-request failure a backend reports instead of a result."""

    def __init__(self, code: ErrorCode | str, message: str, retryable: bool = False):
        super().__init__(message)
        self.code = ErrorCode(code)
        self.retryable = retryable


@dataclass
class ScoreJob:
    """One accepted SCORE: the arrays a backend scores plus the transport's bookkeeping.

    ``tokens_N``, ``cu_seqlens_B1``, ``positions_P``, ``kind``, ``k`` and ``temperature``
    are all a backend reads.
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


class Backend(Protocol):
    """What the transport needs from a teacher. All methods run on the worker thread.

    Optionally ``stats() -> dict``: counters of its own, logged with each batch.
    """

    info: dict[str, Any]  # HELLO_OK ``teacher``: name, model, revision, adapter_sha256
    tokenizer_fp: str
    vocab_size: int

    def score_batch(self, jobs: list[ScoreJob]) -> list[dict[str, np.ndarray] | BackendError]:
        """Score coalesced jobs; one result (arrays) or :class:`BackendError` per job."""

    def park(self) -> None:
        """Move the weights off the accelerator."""

    def wake(self) -> None:
        """Move the weights back onto the accelerator."""

    def memory(self) -> dict[str, Any]:
        """``{device, allocated_bytes, reserved_bytes, total_bytes}``."""

    def close(self) -> None:
        """Release the weights (called after a successful reload and at shutdown)."""


# loader(None) builds the initial teacher; loader({"model", "revision", "adapter",
# "adapter_revision"}) a reload.
Loader = Callable[[dict[str, Any] | None], Backend]


@dataclass
class ServerConfig:
    """Transport settings; ``limits`` are advertised in ``HELLO_OK`` and enforced."""

    endpoint: str = DEFAULT_TCP_ENDPOINT
    limits: Limits = field(default_factory=Limits)
    heartbeat_ms: int = 1000
    batch_tokens: int = 16384  # coalescing budget: packed tokens per forward pass
    dedup_ttl_s: float = 30.0
    dedup_max_bytes: int = 256 << 20
    curve_secret_key: str | None = None
    curve_authorized_dir: str | None = None
    linger_ms: int = 2000
    server_version: str = SERVER_VERSION


def _frame_bytes(frames: list) -> int:
    return sum(len(f) if not isinstance(f, memoryview) else f.nbytes for f in frames)


class TeacherServer:
    """One ROUTER, one worker thread, one backend at a time. ``await serve()`` runs it."""

    def __init__(
        self,
        config: ServerConfig,
        loader: Loader,
        *,
        log: LogFn | None = None,
        context: zmq.asyncio.Context | None = None,
    ):
        self.config = config
        self.limits = config.limits
        self.instance = uuid.uuid4().hex
        self.gen = 0
        self.state = TeacherState.LOADING
        self.endpoint: str | None = None  # the bound endpoint (tcp port resolved)
        self.exit_code = 0
        self._loader = loader
        self._log_fn = log
        self._context = context
        self._backend: Backend | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="teacher-compute")
        self._compute = asyncio.Lock()
        self._send_lock = asyncio.Lock()
        self._queue: deque[ScoreJob] = deque()
        self._computing: list[ScoreJob] = []
        self._inflight: dict[tuple[bytes, int], ScoreJob] = {}
        self._per_client: Counter[bytes] = Counter()
        self._answered: OrderedDict[tuple[bytes, int], tuple[float, list, int]] = OrderedDict()
        self._answered_bytes = 0
        self._hello: dict[bytes, str] = {}
        self._held_hellos: list[tuple[bytes, m.Hello]] = []
        self._last_progress = time.monotonic()
        self._work = asyncio.Event()
        self._stopped = asyncio.Event()
        self._started = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._sock: zmq.asyncio.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._auth = None
        self.counters: dict[str, Any] = {
            "requests": 0,
            "positions": 0,
            "errors": Counter(),
            "bytes_received": 0,
            "bytes_sent": 0,
        }

    # -- lifecycle ------------------------------------------------------------------

    def _log(self, level: str, event: str, /, **fields: Any) -> None:
        if self._log_fn is not None:
            with contextlib.suppress(Exception):
                self._log_fn(level, event, **fields)

    def _open_socket(self) -> zmq.asyncio.Socket:
        cfg = self.config
        curve = None
        if cfg.curve_secret_key or cfg.curve_authorized_dir:
            curve = load_curve_server_keys(
                cfg.curve_secret_key or "", cfg.curve_authorized_dir or ""
            )
        check_bind_endpoint(cfg.endpoint, curve_configured=curve is not None)
        ctx = self._context or zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        lim = self.limits
        largest = max(
            lim.max_header_bytes,
            4 * lim.max_tokens,
            4 * lim.max_positions,
            4 * (lim.max_sequences + 1),
        )
        # A frame beyond this cannot be a valid request; ZeroMQ drops the peer before
        # buffering it, so a hostile client cannot make the teacher allocate gigabytes.
        sock.setsockopt(zmq.MAXMSGSIZE, largest + 1024)
        sock.setsockopt(zmq.LINGER, cfg.linger_ms)
        if curve is not None:
            self._auth = start_curve_authenticator(ctx, curve)
            apply_curve_server(sock, curve)
        try:
            sock.bind(cfg.endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise MiniverlError(
                f"cannot bind {cfg.endpoint}: {exc}; is another teacher serving there? "
                "pick another --bind or stop it with `miniverl teacher shutdown`"
            ) from None
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return sock

    async def serve(self) -> int:
        """Bind, load in the background, answer until shut down; returns the exit code."""
        self._loop = asyncio.get_running_loop()
        self._sock = self._open_socket()
        self._log("info", "bound", endpoint=self.endpoint, instance=self.instance)
        self._started.set()
        for coro in (self._recv_loop(), self._dispatch_loop(), self._initial_load()):
            self._spawn(coro)
        try:
            await self._stopped.wait()
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._sock.close(self.config.linger_ms)
            if self._auth is not None:
                self._auth.stop()
            backend, self._backend = self._backend, None
            if backend is not None:
                with contextlib.suppress(Exception):
                    backend.close()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._log("info", "stopped", exit_code=self.exit_code)
        return self.exit_code

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def shutdown_threadsafe(self, mode: str = "drain") -> None:
        """Begin a shutdown from any thread (tests, embedding)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.request_shutdown, mode)

    def request_shutdown(self, mode: str = "drain") -> None:
        """Begin a shutdown from the event loop's thread (SIGTERM handler)."""
        if self.state != TeacherState.DRAINING:
            self.state = TeacherState.DRAINING
            self._spawn(self._shutdown(None, m.Shutdown(id=0, mode=mode)))

    async def _initial_load(self) -> None:
        loop = asyncio.get_running_loop()
        async with self._compute:
            t0 = time.monotonic()
            try:
                backend = await loop.run_in_executor(self._executor, self._loader, None)
            except Exception as exc:
                self._log("error", "load_failed", error=_describe(exc))
                for ident, hello in self._held_hellos:
                    await self._error(
                        ident,
                        hello.id,
                        ErrorCode.TEACHER_DEAD,
                        f"teacher failed to load: {_describe(exc)}",
                    )
                self.exit_code = 1
                self._stopped.set()
                return
            self._backend = backend
            if self.state == TeacherState.LOADING:
                self.state = TeacherState.READY
            self._last_progress = time.monotonic()
        self._log(
            "info",
            "ready",
            teacher=backend.info,
            vocab_size=backend.vocab_size,
            tokenizer_fp=backend.tokenizer_fp,
            load_s=round(time.monotonic() - t0, 3),
        )
        held, self._held_hellos = self._held_hellos, []
        for ident, hello in held:
            await self._on_hello(ident, hello)

    # -- receive side ---------------------------------------------------------------

    async def _recv_loop(self) -> None:
        sock = self._sock
        while True:
            frames = await sock.recv_multipart(copy=False)
            try:
                await self._on_frames(frames)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never a dead loop: log and keep serving
                self._log(
                    "error", "loop_error", error=_describe(exc), trace=traceback.format_exc(limit=6)
                )

    async def _on_frames(self, frames: list) -> None:
        if len(frames) < 2:
            return
        ident = frames[0].bytes
        body = frames[1:]
        self.counters["bytes_received"] += _frame_bytes(body)
        try:
            msg, arrays = decode(body, self.limits)
        except ProtocolViolation as exc:
            try:
                decode_header_only(body[0], self.limits)
            except ProtocolViolation:
                self._log("warning", "dropped", reason=str(exc)[:200])
                return
            await self._error(ident, exc.ref_id, exc.code, str(exc))
            return
        handler = self._HANDLERS.get(msg.t)
        if handler is None:
            await self._error(
                ident, msg.id, ErrorCode.BAD_REQUEST, f"{msg.t} is not a request a teacher accepts"
            )
            return
        await handler(self, ident, msg, arrays)

    async def _on_hello(self, ident: bytes, msg: m.Hello, arrays: Any = None) -> None:
        backend = self._backend
        if backend is None:  # still loading: answer once the model is there
            self._held_hellos.append((ident, msg))
            return
        if msg.tokenizer_fp != backend.tokenizer_fp or msg.vocab_size != backend.vocab_size:
            await self._error(
                ident,
                msg.id,
                ErrorCode.TOKENIZER_MISMATCH,
                f"tokenizer mismatch: client {msg.client!r} has {msg.tokenizer_fp} "
                f"(V={msg.vocab_size}), teacher has {backend.tokenizer_fp} "
                f"(V={backend.vocab_size}); cross-tokenizer distillation is refused",
            )
            return
        self._hello[ident] = msg.client
        lim = self.limits
        exact = (
            m.ExactKind(max_vocab=lim.max_exact_vocab)
            if backend.vocab_size <= lim.max_exact_vocab
            else None
        )
        reply = m.HelloOk(
            id=msg.id,
            teacher=m.TeacherInfo(**backend.info),
            instance=self.instance,
            gen=self.gen,
            tokenizer_fp=backend.tokenizer_fp,
            vocab_size=backend.vocab_size,
            kinds=m.Kinds(topk=m.TopkKind(k_max=min(lim.max_k, backend.vocab_size)), exact=exact),
            limits=m.ServerLimits(
                max_tokens=lim.max_tokens,
                max_positions=lim.max_positions,
                max_inflight=lim.max_inflight,
            ),
            heartbeat_ms=self.config.heartbeat_ms,
            server_version=self.config.server_version,
        )
        self._log("info", "hello", client=msg.client, gen=self.gen)
        await self._send(ident, encode(reply))

    async def _on_score(self, ident: bytes, msg: m.Score, arrays: dict) -> None:
        key = (ident, msg.id)
        if self.state == TeacherState.LOADING:  # nobody can have said HELLO yet
            await self._error(
                ident,
                msg.id,
                ErrorCode.RELOADING,
                "teacher is still loading its model; retry later",
                retryable=True,
            )
            return
        if ident not in self._hello:
            await self._error(
                ident,
                msg.id,
                ErrorCode.NEED_HELLO,
                f"say HELLO to teacher instance {self.instance} before SCORE",
                retryable=True,
            )
            return
        if key in self._inflight:  # a resend of an open request: its reply will come
            self._log("debug", "duplicate_inflight", id=msg.id)
            return
        cached = self._answered.get(key)
        if cached is not None and cached[0] > time.monotonic():
            self._log("debug", "duplicate_answered", id=msg.id)
            await self._send(ident, cached[1])
            return
        refusal = {
            TeacherState.RELOADING: (ErrorCode.RELOADING, "teacher is reloading"),
            TeacherState.DRAINING: (ErrorCode.SHUTTING_DOWN, "teacher is shutting down"),
        }.get(self.state)
        if refusal is not None:
            await self._error(
                ident, msg.id, refusal[0], refusal[1] + "; retry later", retryable=True
            )
            return
        if self._per_client[ident] >= self.limits.max_inflight:
            await self._error(
                ident,
                msg.id,
                ErrorCode.OVERLOADED,
                f"client has {self._per_client[ident]} requests open; the limit "
                f"is max_inflight={self.limits.max_inflight}",
                retryable=True,
            )
            return
        try:
            m.validate_score(msg, arrays, self._backend.vocab_size, self.limits)
        except ProtocolViolation as exc:
            await self._error(ident, msg.id, exc.code, str(exc))
            return
        n_pos = int(arrays["positions"].shape[0])
        if (
            msg.kind == "exact"
            and 4 * n_pos * self._backend.vocab_size > self.limits.max_array_bytes
        ):
            await self._error(
                ident,
                msg.id,
                ErrorCode.TOO_LARGE,
                f"an exact reply for {n_pos} positions x V={self._backend.vocab_size} "
                f"exceeds {self.limits.max_array_bytes} bytes; send fewer positions",
            )
            return
        now = time.monotonic()
        job = ScoreJob(
            tokens_N=arrays["tokens"],
            cu_seqlens_B1=arrays["cu_seqlens"],
            positions_P=arrays["positions"],
            kind=msg.kind,
            k=msg.k,
            temperature=msg.temperature,
            client=ident,
            id=msg.id,
            student_version=msg.student_version,
            received=now,
            deadline=now + msg.deadline_ms / 1000 if msg.deadline_ms else None,
        )
        self.counters["requests"] += 1
        self._inflight[key] = job
        self._per_client[ident] += 1
        self._queue.append(job)
        self._work.set()

    async def _on_ping(self, ident: bytes, msg: m.Ping, arrays: Any = None) -> None:
        await self._send(ident, encode(m.Pong(id=msg.id, **self._liveness())))

    async def _on_status(self, ident: bytes, msg: m.Status, arrays: Any = None) -> None:
        backend = self._backend
        memory = None
        if backend is not None:
            with contextlib.suppress(Exception):
                memory = m.DeviceMemory(**backend.memory())
        c = self.counters
        reply = m.StatusOk(
            id=msg.id,
            **self._liveness(),
            teacher=m.TeacherInfo(**backend.info) if backend is not None else None,
            counters=m.Counters(
                requests=c["requests"],
                positions=c["positions"],
                errors=dict(c["errors"]),
                bytes_received=c["bytes_received"],
                bytes_sent=c["bytes_sent"],
            ),
            memory=memory,
        )
        await self._send(ident, encode(reply))

    def _liveness(self) -> dict[str, Any]:
        busy = bool(self._inflight)
        idle_ms = (time.monotonic() - self._last_progress) * 1000 if busy else 0.0
        return {
            "instance": self.instance,
            "gen": self.gen,
            "state": self.state,
            "inflight": len(self._inflight),
            "queue_depth": len(self._queue),
            "last_progress_ms": round(idle_ms, 3),
        }

    # -- control --------------------------------------------------------------------

    async def _on_control(self, ident: bytes, msg: m.Message, arrays: Any = None) -> None:
        busy = (TeacherState.LOADING, TeacherState.RELOADING, TeacherState.DRAINING)
        if msg.t == "SHUTDOWN":  # allowed while loading or reloading, once
            busy = (TeacherState.DRAINING,)
        if self.state in busy:
            await self._error(
                ident,
                msg.id,
                ErrorCode.RELOADING,
                f"teacher is {self.state.value}; {msg.t} must wait; retry later",
                retryable=True,
            )
            return
        # State changes happen here, before the next message is read: a SCORE that
        # arrives right behind a SHUTDOWN or RELOAD must already see the new state.
        if msg.t == "RELOAD":
            previous, self.state = self.state, TeacherState.RELOADING
            self._spawn(self._reload(ident, msg, previous))
        elif msg.t == "SHUTDOWN":
            self.state = TeacherState.DRAINING
            self._spawn(self._shutdown(ident, msg))
        else:
            self._spawn((self._park if msg.t == "PARK" else self._wake)(ident, msg))

    async def _park(self, ident: bytes, msg: m.Park) -> None:
        async with self._compute:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._backend.park)
            if self.state == TeacherState.READY:
                self.state = TeacherState.PARKED
        self._log("info", "parked")
        await self._send(ident, encode(m.ParkOk(id=msg.id, state=self.state)))

    async def _wake(self, ident: bytes, msg: m.Wake) -> None:
        async with self._compute:
            await self._wake_locked()
        await self._send(ident, encode(m.WakeOk(id=msg.id, state=self.state)))

    async def _wake_locked(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._backend.wake)
        if self.state == TeacherState.PARKED:
            self.state = TeacherState.READY
        self._log("info", "woken")

    async def _drained(self, timeout_s: float | None = None) -> bool:
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while self._queue or self._computing:
            if end is not None and time.monotonic() > end:
                return False
            await asyncio.sleep(0.005)
        return True

    def _abort_all(self, code: ErrorCode, message: str) -> list[ScoreJob]:
        """Drop every open job; returns them so the caller can send the ERRORs."""
        jobs = list(self._queue) + [j for j in self._computing if not j.aborted]
        self._queue.clear()
        for job in jobs:
            job.aborted = True
            self._close_job(job)
        self._log("info", "aborted", jobs=len(jobs), code=code.value, reason=message)
        return jobs

    async def _reload(self, ident: bytes, msg: m.Reload, previous: TeacherState) -> None:
        self._log(
            "info",
            "reload_started",
            model=msg.model,
            revision=msg.revision,
            adapter=msg.adapter,
            adapter_revision=msg.adapter_revision,
            mode=msg.mode,
        )
        loop = asyncio.get_running_loop()
        try:
            if msg.mode == "abort":
                for job in self._abort_all(ErrorCode.RELOADING, "reload (abort)"):
                    await self._error(
                        job.client,
                        job.id,
                        ErrorCode.RELOADING,
                        "aborted by RELOAD; resend after the reload",
                        retryable=True,
                    )
            else:
                await self._drained()
            async with self._compute:
                old = self._backend
                request = {"model": msg.model, "revision": msg.revision, "adapter": msg.adapter,
                           "adapter_revision": msg.adapter_revision}
                # Free the accelerator for the newcomer; the old teacher comes back on failure.
                await loop.run_in_executor(self._executor, old.park)
                try:
                    new = await loop.run_in_executor(self._executor, self._loader, request)
                    if new.tokenizer_fp != old.tokenizer_fp or new.vocab_size != old.vocab_size:
                        await loop.run_in_executor(self._executor, new.close)
                        raise TokenizerMismatch(
                            f"new teacher's tokenizer {new.tokenizer_fp} (V={new.vocab_size}) "
                            f"differs from the served one {old.tokenizer_fp} (V={old.vocab_size})"
                        )
                except Exception:
                    if previous != TeacherState.PARKED:
                        await loop.run_in_executor(self._executor, old.wake)
                    raise
                await loop.run_in_executor(self._executor, old.close)
                self._backend = new
                self.gen += 1
                previous = TeacherState.READY
        except Exception as exc:
            code = (
                ErrorCode.TOKENIZER_MISMATCH
                if isinstance(exc, TokenizerMismatch)
                else (
                    ErrorCode.BAD_REQUEST if isinstance(exc, MiniverlError) else ErrorCode.INTERNAL
                )
            )
            self._log("error", "reload_failed", error=_describe(exc), gen=self.gen)
            await self._error(
                ident,
                msg.id,
                code,
                f"reload refused: {_describe(exc)}; the previous teacher keeps "
                f"serving (gen {self.gen})",
            )
            return
        finally:
            if self.state == TeacherState.RELOADING:  # a SHUTDOWN may have come meanwhile
                self.state = previous
            self._work.set()
        self._log("info", "reloaded", gen=self.gen, teacher=self._backend.info)
        reply = m.ReloadOk(id=msg.id, gen=self.gen, teacher=m.TeacherInfo(**self._backend.info))
        await self._send(ident, encode(reply))

    async def _shutdown(self, ident: bytes | None, msg: m.Shutdown) -> None:
        self._log("info", "shutdown_started", mode=msg.mode, timeout_s=msg.timeout_s)
        drained = msg.mode == "drain" and await self._drained(msg.timeout_s)
        if not drained:
            for job in self._abort_all(ErrorCode.SHUTTING_DOWN, f"shutdown ({msg.mode})"):
                await self._error(
                    job.client,
                    job.id,
                    ErrorCode.SHUTTING_DOWN,
                    "teacher shut down before this request finished",
                    retryable=True,
                )
        if ident is not None:
            await self._send(ident, encode(m.ShutdownOk(id=msg.id)))
        self._stopped.set()

    # -- compute side ---------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            await self._work.wait()
            self._work.clear()
            while self._queue and self._backend is not None:
                try:
                    async with self._compute:
                        if not self._queue:
                            break
                        if self.state == TeacherState.PARKED:
                            self._log("info", "implicit_wake", reason="SCORE while parked")
                            await self._wake_locked()
                        await self._run_batch(self._take_batch())
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._log(
                        "error",
                        "dispatch_error",
                        error=_describe(exc),
                        trace=traceback.format_exc(limit=6),
                    )

    def _take_batch(self) -> list[ScoreJob]:
        batch = [self._queue.popleft()]
        tokens = batch[0].tokens_N.shape[0]
        while self._queue and tokens + self._queue[0].tokens_N.shape[0] <= self.config.batch_tokens:
            job = self._queue.popleft()
            tokens += job.tokens_N.shape[0]
            batch.append(job)
        return batch

    async def _run_batch(self, batch: list[ScoreJob]) -> None:
        now = time.monotonic()
        live = []
        for job in batch:
            if job.deadline is not None and now > job.deadline:
                self._close_job(job)
                await self._error(
                    job.client,
                    job.id,
                    ErrorCode.DEADLINE_EXCEEDED,
                    f"waited {1000 * (now - job.received):.0f} ms in the queue, past deadline_ms",
                    retryable=True,
                )
            else:
                live.append(job)
        if not live:
            return
        self._computing = live
        self._last_progress = now
        gen, backend = self.gen, self._backend
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self._executor, backend.score_batch, live
            )
            if len(results) != len(live):
                raise RuntimeError(f"backend returned {len(results)} results for {len(live)} jobs")
        except Exception as exc:
            self._log(
                "error",
                "score_failed",
                error=_describe(exc),
                jobs=len(live),
                trace=traceback.format_exc(limit=6),
            )
            results = [
                BackendError(
                    ErrorCode.INTERNAL, f"scoring failed: {_describe(exc)}", retryable=True
                )
            ] * len(live)
        finally:
            self._computing = []
        done = time.monotonic()
        self._last_progress = done
        compute_ms = 1000 * (done - now)
        self._log(
            "debug",
            "batch",
            jobs=len(live),
            compute_ms=round(compute_ms, 3),
            tokens=sum(j.tokens_N.shape[0] for j in live),
            # A backend may report its own counters (the built-in one: its prefix cache).
            **({"backend": backend.stats()} if hasattr(backend, "stats") else {}),
        )
        for job, result in zip(live, results, strict=True):
            if job.aborted:
                continue
            self._close_job(job)
            if isinstance(result, BackendError):
                await self._error(
                    job.client,
                    job.id,
                    result.code,
                    str(result),
                    retryable=result.retryable,
                    cache=True,
                )
                continue
            header = m.ScoreOk(
                id=job.id,
                student_version=job.student_version,
                instance=self.instance,
                gen=gen,
                kind=job.kind,
                k=job.k,
                timing=m.Timing(
                    queue_ms=round(1000 * (now - job.received), 3), compute_ms=round(compute_ms, 3)
                ),
            )
            names = m.TOPK_ARRAYS if job.kind == "topk" else m.EXACT_ARRAYS
            frames = encode(header, {name: result[name] for name in names})
            self.counters["positions"] += int(job.positions_P.shape[0])
            self._remember((job.client, job.id), frames)
            await self._send(job.client, frames)

    def _close_job(self, job: ScoreJob) -> None:
        if self._inflight.pop((job.client, job.id), None) is not None:
            self._per_client[job.client] -= 1
            if self._per_client[job.client] <= 0:
                del self._per_client[job.client]

    def _remember(self, key: tuple[bytes, int], frames: list) -> None:
        now = time.monotonic()
        size = _frame_bytes(frames)
        while self._answered:
            k0, (expires, _, n0) = next(iter(self._answered.items()))
            if expires > now and self._answered_bytes + size <= self.config.dedup_max_bytes:
                break
            del self._answered[k0]
            self._answered_bytes -= n0
        if size <= self.config.dedup_max_bytes:
            self._answered[key] = (now + self.config.dedup_ttl_s, frames, size)
            self._answered_bytes += size

    # -- send side ------------------------------------------------------------------

    async def _send(self, ident: bytes, frames: list) -> None:
        try:
            async with self._send_lock:
                await self._sock.send_multipart([ident, *frames], copy=False)
            self.counters["bytes_sent"] += _frame_bytes(frames)
        except zmq.ZMQError as exc:  # EHOSTUNREACH under ROUTER_MANDATORY: the peer left
            self._log("warning", "send_failed", error=str(exc))

    async def _error(
        self,
        ident: bytes,
        rid: int | None,
        code: ErrorCode,
        message: str,
        *,
        retryable: bool = False,
        cache: bool = False,
    ) -> None:
        code = ErrorCode(code)
        self.counters["errors"][code.value] += 1
        reply = m.ErrorReply(
            id=rid,
            ref_id=rid,
            code=code,
            message=message[:8000],
            retryable=retryable,
            instance=self.instance,
            gen=self.gen,
        )
        frames = encode(reply)
        if cache and rid is not None:
            self._remember((ident, rid), frames)
        self._log("info", "error_reply", code=code.value, id=rid, message=message[:200])
        await self._send(ident, frames)

    _HANDLERS: dict[str, Callable] = {
        "HELLO": _on_hello,
        "SCORE": _on_score,
        "PING": _on_ping,
        "STATUS": _on_status,
        "RELOAD": _on_control,
        "PARK": _on_control,
        "WAKE": _on_control,
        "SHUTDOWN": _on_control,
    }


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return text if isinstance(exc, MiniverlError) else f"{type(exc).__name__}: {text}"


def run_server(server: TeacherServer) -> int:
    """Run ``server`` on a fresh event loop; SIGTERM and SIGINT mean ``SHUTDOWN drain``."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, server.request_shutdown, "drain")
        return await server.serve()

    return asyncio.run(main())
