"""The teacher server's state, and the few operations every part of the server shares.

:class:`ServerState` is one plain dataclass: identity (``instance``, ``gen``), the
lifecycle ``state``, the backend, the job table (queue, computing batch, open requests
per client, recently answered replies) and the socket. The jobs of the server are
modules of functions over it: admission in ``server.py``, the lifecycle in
``lifecycle.py``, batches in ``batcher.py``. What lives here is what all of them call:
logging, sending a reply or an ``ERROR``, remembering answered replies for resends,
closing and aborting jobs.

This module does not read the socket, decide what a message means or call the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from miniverl.common.errors import MiniverlError
from miniverl.protocol import messages as m
from miniverl.protocol.codec import encode
from miniverl.protocol.endpoints import DEFAULT_TCP_ENDPOINT
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import ErrorCode, TeacherState
from miniverl.teacher_server.backend import Backend, Loader, ScoreJob

SERVER_VERSION = "miniverl-teacher/1"

LogFn = Callable[..., None]  # log(level, event, **fields)


@dataclass
class ServerConfig:
    """Server settings; ``limits`` are advertised in ``HELLO_OK`` and enforced."""

    endpoint: str = DEFAULT_TCP_ENDPOINT
    limits: Limits = field(default_factory=Limits)
    heartbeat_ms: int = 1000
    batch_tokens: int = 16384  # coalescing budget: packed tokens per forward pass
    dedup_ttl_s: float = 30.0
    dedup_max_bytes: int = 256 << 20
    curve_secret_key: str | None = None
    curve_authorized_dir: str | None = None
    curve_admin_dir: str | None = None  # public keys that may send admin messages
    # Without CURVE: the admin token (None: a random one) and where it is written (None:
    # beside the socket, see protocol/endpoints.admin_token_path). roles.py decides.
    admin_token: str | None = None
    admin_token_file: str | None = None
    linger_ms: int = 2000
    server_version: str = SERVER_VERSION
    # The competence gate a RELOAD must pass before its weights serve: called with the
    # new teacher's identity {name, model, revision, adapter_sha256}, it raises to refuse
    # (a recipe's teacher.min_success, common/qualification.py). None: no gate.
    gate: Callable[[dict[str, Any]], Any] | None = None


def _new_counters() -> dict[str, Any]:
    return {
        "requests": 0,
        "positions": 0,
        "errors": Counter(),
        "bytes_received": 0,
        "bytes_sent": 0,
        "replies_dropped": 0,
    }


@dataclass
class ServerState:
    """Everything one teacher server knows. Touched only on its event loop's thread."""

    config: ServerConfig
    loader: Loader
    log_fn: LogFn | None = None
    context: zmq.asyncio.Context | None = None
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)
    gen: int = 0
    state: TeacherState = TeacherState.LOADING
    endpoint: str | None = None  # the bound endpoint (tcp port resolved)
    exit_code: int = 0
    backend: Backend | None = None
    # One worker thread runs every piece of compute (load, score, park, wake), so the
    # event loop keeps answering PING while a batch computes.
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="teacher-compute")
    )
    # Work whose cost a client controls (an xvocab episode's parsing, chat rendering and
    # alignment) runs on this thread, not on the loop that serves every client: a
    # 30,000-message episode once held every other client's SCORE for 6.6 s (issue 53).
    planner: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="teacher-xvocab")
    )
    # xvocab SCOREs being planned there: counted open (max_inflight, resends) until queued.
    planning: set[tuple[bytes, int]] = field(default_factory=set)
    compute: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: deque[ScoreJob] = field(default_factory=deque)
    computing: list[ScoreJob] = field(default_factory=list)
    inflight: dict[tuple[bytes, int], ScoreJob] = field(default_factory=dict)
    per_client: Counter[bytes] = field(default_factory=Counter)
    # (client, id) -> (expires, frames, size) of replies a resend gets again
    answered: OrderedDict[tuple[bytes, int], tuple[float, list, int]] = field(
        default_factory=OrderedDict
    )
    answered_bytes: int = 0
    hello: dict[bytes, str] = field(default_factory=dict)  # clients that said HELLO
    # Clients that negotiated xvocab (docs/protocol.md, "xvocab"): True when their
    # tokenizer is another than the teacher's (then xvocab is all they may ask for).
    xvocab: dict[bytes, bool] = field(default_factory=dict)
    held_hellos: list[tuple[bytes, m.Hello]] = field(default_factory=list)  # while LOADING
    # Clients whose HELLO named an adapter (docs/protocol.md, "Adapters"): their HELLO_OK
    # gave that adapter's identity, so each of their SCOREs must name it.
    hello_adapter: dict[bytes, str] = field(default_factory=dict)
    last_progress: float = field(default_factory=time.monotonic)
    work: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task] = field(default_factory=set)
    sock: zmq.asyncio.Socket | None = None
    loop: asyncio.AbstractEventLoop | None = None
    auth: Any = None
    admin: Any = None  # roles.AdminRule, set at bind: what admin messages must prove
    counters: dict[str, Any] = field(default_factory=_new_counters)
    # Replies dropped per client because its queue was full (it does not read them).
    dropped: Counter[bytes] = field(default_factory=Counter)
    # In-process clients (the OpenAI front end, openai_http.py): their replies go to this
    # sink instead of the socket.
    local_clients: dict[bytes, Callable[[list], None]] = field(default_factory=dict)

    @property
    def limits(self) -> Limits:
        # Bounded by the loaded model's context (a backend without ``context_len``: not).
        return self.config.limits.for_context(getattr(self.backend, "context_len", None))


def log(srv: ServerState, level: str, event: str, /, **fields: Any) -> None:
    """Log through the configured callable; a failing log never stops the server."""
    if srv.log_fn is not None:
        with contextlib.suppress(Exception):
            srv.log_fn(level, event, **fields)


def describe(exc: BaseException) -> str:
    text = str(exc)
    return text if isinstance(exc, MiniverlError) else f"{type(exc).__name__}: {text}"


def frame_bytes(frames: list) -> int:
    return sum(len(f) if not isinstance(f, memoryview) else f.nbytes for f in frames)


def spawn(srv: ServerState, coro) -> asyncio.Task:
    """Run ``coro`` as a task the server cancels when it stops."""
    task = asyncio.get_running_loop().create_task(coro)
    srv.tasks.add(task)
    task.add_done_callback(srv.tasks.discard)
    return task


def run_compute(srv: ServerState, fn: Callable, *args: Any) -> asyncio.Future:
    """Run ``fn(*args)`` on the worker thread."""
    return asyncio.get_running_loop().run_in_executor(srv.executor, fn, *args)


async def send(srv: ServerState, ident: bytes, frames: list) -> None:
    """Send a reply to ``ident`` without ever waiting: a client whose queue is full (it
    does not read its replies) loses this one (:func:`reply_dropped`), so it cannot hold
    up the replies to every other client; one that left loses it as well."""
    local = srv.local_clients.get(ident)
    if local is not None:
        local(frames)
        srv.counters["bytes_sent"] += frame_bytes(frames)
        return
    try:
        await srv.sock.send_multipart([ident, *frames], copy=False, flags=zmq.NOBLOCK)
        srv.counters["bytes_sent"] += frame_bytes(frames)
    except zmq.Again:  # its SNDHWM reached, under ROUTER_MANDATORY
        reply_dropped(srv, ident)
    except zmq.ZMQError as exc:  # EHOSTUNREACH under ROUTER_MANDATORY: the peer left
        log(srv, "warning", "send_failed", error=str(exc))


def reply_dropped(srv: ServerState, ident: bytes) -> None:
    """Count a reply dropped because ``ident``'s queue is full (``replies_dropped`` in
    ``STATUS_OK``), and log ``reply_dropped`` at that client's 1st, 2nd, 4th, 8th, ...
    drop, so a client that never reads cannot flood the log either. Its request is
    answered nowhere: the client's own deadline ends it."""
    srv.counters["replies_dropped"] += 1
    srv.dropped[ident] += 1
    n = srv.dropped[ident]
    if n & (n - 1) == 0:
        log(srv, "warning", "reply_dropped", client=srv.hello.get(ident, ident.hex()),
            dropped=n, queue_limit=srv.limits.receive_hwm())


async def send_error(
    srv: ServerState,
    ident: bytes,
    rid: int | None,
    code: ErrorCode,
    message: str,
    *,
    retryable: bool = False,
    cache: bool = False,
) -> None:
    """Send ``ERROR`` (``ref_id`` = ``rid``); ``cache`` keeps it for a resend of ``rid``."""
    code = ErrorCode(code)
    srv.counters["errors"][code.value] += 1
    reply = m.ErrorReply(
        id=rid,
        ref_id=rid,
        code=code,
        message=message[:8000],
        retryable=retryable,
        instance=srv.instance,
        gen=srv.gen,
    )
    frames = encode(reply)
    if cache and rid is not None:
        remember(srv, (ident, rid), frames)
    log(srv, "info", "error_reply", code=code.value, id=rid, message=message[:200])
    await send(srv, ident, frames)


def remember(srv: ServerState, key: tuple[bytes, int], frames: list) -> None:
    """Keep a reply for ``dedup_ttl_s`` (within ``dedup_max_bytes``) for resends of its id."""
    cfg = srv.config
    now = time.monotonic()
    size = frame_bytes(frames)
    while srv.answered:
        k0, (expires, _, n0) = next(iter(srv.answered.items()))
        if expires > now and srv.answered_bytes + size <= cfg.dedup_max_bytes:
            break
        del srv.answered[k0]
        srv.answered_bytes -= n0
    if size <= cfg.dedup_max_bytes:
        srv.answered[key] = (now + cfg.dedup_ttl_s, frames, size)
        srv.answered_bytes += size


def close_job(srv: ServerState, job: ScoreJob) -> None:
    """The job is answered or dropped: it no longer counts against its client's limit."""
    if srv.inflight.pop((job.client, job.id), None) is not None:
        srv.per_client[job.client] -= 1
        if srv.per_client[job.client] <= 0:
            del srv.per_client[job.client]


async def drained(srv: ServerState, timeout_s: float | None = None) -> bool:
    """Wait until no job is queued or computing; False when ``timeout_s`` passes first."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while srv.queue or srv.computing:
        if end is not None and time.monotonic() > end:
            return False
        await asyncio.sleep(0.005)
    return True


def abort_all(srv: ServerState, code: ErrorCode, message: str) -> list[ScoreJob]:
    """Drop every open job; returns them so the caller can send the ERRORs."""
    jobs = list(srv.queue) + [j for j in srv.computing if not j.aborted]
    srv.queue.clear()
    for job in jobs:
        job.aborted = True
        close_job(srv, job)
    log(srv, "info", "aborted", jobs=len(jobs), code=code.value, reason=message)
    return jobs
