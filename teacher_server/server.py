"""The teacher's server: one ZeroMQ ROUTER, admission, and the loop that dispatches.

:class:`TeacherServer` binds the socket (CURVE when configured) *before* the model
loads, reads every message on an asyncio loop, and admits or refuses it (docs/protocol.md, "ERROR"):

- every malformed message gets ``ERROR`` with the request's id (``BAD_REQUEST``,
  ``VERSION_MISMATCH``, ``TOO_LARGE``...) or is dropped when no header parses; the
  loop body is wrapped so nothing a client sends can stop the loop;
- ``HELLO`` waits for the model while ``LOADING``; another tokenizer fingerprint or
  vocabulary → ``TOKENIZER_MISMATCH`` naming both, unless the client announced
  ``xvocab`` and the backend has a tokenizer (``xvocab.py``): then ``HELLO_OK``
  advertises the kind, and that connection may ask for xvocab alone; a teacher serving
  named adapters lists them in ``HELLO_OK``, and a ``HELLO`` naming one gets that
  adapter's identity (one it does not serve → ``UNSUPPORTED``);
- ``SCORE`` while loading → retryable ``RELOADING``; before ``HELLO`` (to this
  instance) → ``NEED_HELLO``; per client at most ``max_inflight`` open requests
  (``OVERLOADED``); a resent id that is still open is not computed twice, a resent id
  answered in the last ``dedup_ttl_s`` gets the cached reply; a ``SCORE`` must name the
  adapter its connection's ``HELLO`` named, one the teacher serves, and must name one
  when the teacher serves named adapters (else ``UNSUPPORTED``); an accepted one is
  queued for the batcher (``batcher.py``);
- ``PING``/``STATUS`` are answered at once, even while a batch computes;
- a reply is sent without waiting: one to a client whose queue of unread replies is
  full is dropped and counted (``replies_dropped``), so a client that never reads
  cannot hold up the others (``server_state.send``);
- ``RELOAD``/``PARK``/``WAKE``/``SHUTDOWN`` need admin proof (``roles.py``: an admin
  CURVE key or the admin token), checked before anything else, else ``UNAUTHORIZED``;
  then they go to the lifecycle (``lifecycle.py``).

The model lives in a backend (``backend.py``) that a loader builds on the worker
thread, so this module never imports torch and does not know how scoring is computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import zmq
import zmq.asyncio

from miniverl.common.errors import MiniverlError
from miniverl.protocol import messages as m
from miniverl.protocol.checks import check_score
from miniverl.protocol.codec import decode, decode_header_only, encode
from miniverl.protocol.endpoints import (
    apply_curve_server,
    check_bind_endpoint,
    load_curve_server_keys,
    start_curve_authenticator,
)
from miniverl.protocol.messages import ErrorCode, ProtocolViolation, TeacherState
from miniverl.protocol.socket_files import bound_file, remove_bound_file
from miniverl.protocol.xvocab import parse_xvocab_score
from miniverl.teacher_server import lifecycle, roles
from miniverl.teacher_server.backend import Loader, ScoreJob, served_adapters
from miniverl.teacher_server.batcher import dispatch_loop
from miniverl.teacher_server.server_state import (
    LogFn,
    ServerConfig,
    ServerState,
    describe,
    frame_bytes,
    log,
    send,
    send_error,
    spawn,
)
from miniverl.teacher_server.xvocab import plan_xvocab, serves_xvocab


class TeacherServer:
    """One ROUTER, one worker thread, one backend at a time. ``await serve()`` runs it."""

    def __init__(
        self,
        config: ServerConfig,
        loader: Loader,
        *,
        log: LogFn | None = None,
        context: zmq.asyncio.Context | None = None,
        open_socket: Callable[[ServerState], Any] | None = None,
    ):
        """``open_socket(srv)`` replaces the ZeroMQ bind: it sets ``srv.endpoint`` and
        ``srv.admin`` and returns the ROUTER (async ``recv_multipart``/``send_multipart``,
        ``close``); ``miniverl.testing`` passes an in-memory one."""
        self.srv = ServerState(config=config, loader=loader, log_fn=log, context=context)
        self._open_socket = open_socket or _open_socket

    @property
    def endpoint(self) -> str | None:
        """The bound endpoint (a tcp port resolved), None until bound."""
        return self.srv.endpoint

    @property
    def instance(self) -> str:
        return self.srv.instance

    async def serve(self) -> int:
        """Bind, load in the background, answer until shut down; returns the exit code."""
        srv = self.srv
        srv.loop = asyncio.get_running_loop()
        srv.sock = self._open_socket(srv)
        sock_file = bound_file(srv.endpoint)  # removed on the way out, whatever the way
        log(srv, "info", "bound", endpoint=srv.endpoint, instance=srv.instance)
        for coro in (_recv_loop(srv), dispatch_loop(srv), _load_then_answer_hellos(srv)):
            spawn(srv, coro)
        try:
            await srv.stopped.wait()
        finally:
            for task in list(srv.tasks):
                task.cancel()
            await asyncio.gather(*srv.tasks, return_exceptions=True)
            srv.sock.close(srv.config.linger_ms)
            remove_bound_file(sock_file)
            if srv.auth is not None:
                srv.auth.stop()
            roles.close(srv.admin)
            backend, srv.backend = srv.backend, None
            if backend is not None:
                with contextlib.suppress(Exception):
                    backend.close()
            srv.executor.shutdown(wait=False, cancel_futures=True)
            srv.planner.shutdown(wait=False, cancel_futures=True)
            log(srv, "info", "stopped", exit_code=srv.exit_code)
        return srv.exit_code

    def shutdown_threadsafe(self, mode: str = "drain") -> None:
        """Begin a shutdown from any thread (tests, embedding)."""
        if self.srv.loop is not None:
            self.srv.loop.call_soon_threadsafe(self.request_shutdown, mode)

    def request_shutdown(self, mode: str = "drain") -> None:
        """Begin a shutdown from the event loop's thread (SIGTERM handler)."""
        lifecycle.request_shutdown(self.srv, mode)


def run_server(server: TeacherServer) -> int:
    """Run ``server`` on a fresh event loop; SIGTERM and SIGINT mean ``SHUTDOWN drain``."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, server.request_shutdown, "drain")
        return await server.serve()

    return asyncio.run(main())


def _open_socket(srv: ServerState) -> zmq.asyncio.Socket:
    cfg = srv.config
    curve = None
    if cfg.curve_secret_key or cfg.curve_authorized_dir or cfg.curve_admin_dir:
        curve = load_curve_server_keys(
            cfg.curve_secret_key or "", cfg.curve_authorized_dir or "", cfg.curve_admin_dir
        )
    check_bind_endpoint(cfg.endpoint, curve_configured=curve is not None)
    ctx = srv.context or zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # Frames up to the socket's cap are read, and one over a limit is answered
    # ERROR TOO_LARGE naming that limit (the server checks after reading the header);
    # beyond the cap ZeroMQ drops the peer before buffering the frame, so a hostile
    # client cannot make the teacher allocate gigabytes (docs/protocol.md, "`xvocab`: a
    # teacher with another tokenizer").
    # The cap once sat just above the largest legal frame, so a 10 MB episode got no
    # reply at all and its client waited out its timeout (issue 53).
    sock.setsockopt(zmq.MAXMSGSIZE, socket_cap(srv.limits))
    # Per client, at most this many messages wait unread (ZeroMQ's default is 1000, a
    # thousand frames of up to the cap each); past it that client's sends wait.
    sock.setsockopt(zmq.RCVHWM, srv.limits.receive_hwm())
    # And at most as many replies wait for a client to read them: past it a reply to that
    # client is dropped (server_state.send sends without waiting), never the others'
    # held up behind it, and the teacher buffers no more than this for a client.
    sock.setsockopt(zmq.SNDHWM, srv.limits.receive_hwm())
    sock.setsockopt(zmq.LINGER, cfg.linger_ms)
    if curve is not None:
        srv.auth = start_curve_authenticator(ctx, curve)
        apply_curve_server(sock, curve)
    try:
        sock.bind(cfg.endpoint)
    except zmq.ZMQError as exc:
        sock.close(0)
        raise MiniverlError(
            f"cannot bind {cfg.endpoint}: {exc}; is another teacher serving there? "
            "pick another --bind or stop it with `miniverl teacher shutdown`"
        ) from None
    srv.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    try:
        srv.admin = roles.setup(srv, curve)
    except OSError as exc:
        sock.close(0)
        raise MiniverlError(
            f"cannot write the admin token beside {srv.endpoint}: {exc}; bind a directory "
            "you can write to"
        ) from None
    return sock


# The least frame size a teacher's socket reads before refusing it (docs/protocol.md).
SOCKET_CAP_FLOOR = 64 << 20


def socket_cap(lim: Any) -> int:
    """The largest frame the socket reads: twice the largest legal request frame (an
    xvocab episode included), and at least :data:`SOCKET_CAP_FLOOR`."""
    largest = max(
        lim.max_header_bytes,
        4 * lim.max_tokens,
        4 * lim.max_positions,
        4 * (lim.max_sequences + 1),
        lim.max_episode_bytes,
        12 * (lim.max_tokens + 1),  # an xvocab SCORE's student cuts and pieces
    )
    return max(SOCKET_CAP_FLOOR, 2 * largest + 1024)


async def _load_then_answer_hellos(srv: ServerState) -> None:
    if not await lifecycle.initial_load(srv):
        return
    held, srv.held_hellos = srv.held_hellos, []
    for ident, hello in held:
        await _on_hello(srv, ident, hello)


async def _recv_loop(srv: ServerState) -> None:
    sock = srv.sock
    while True:
        frames = await sock.recv_multipart(copy=False)
        try:
            await _on_frames(srv, frames)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never a dead loop: log and keep serving
            log(srv, "error", "loop_error", error=describe(exc), trace=traceback.format_exc(limit=6))
        # A receive and a send that need not wait return without yielding: without this,
        # a client that keeps the socket busy held back the batches of every other
        # client's SCOREs until its own messages ran out.
        await asyncio.sleep(0)


def oversized_header_id(frame0: Any) -> int | None:
    """The ``id`` of a header map too large to decode whole, read key by key (every other
    value skipped, never copied out); None when there is none or the frame is no map."""
    view = frame0.buffer if hasattr(frame0, "buffer") else memoryview(frame0)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(view))
    try:
        unpacker.feed(view)
        for _ in range(min(unpacker.read_map_header(), 64)):
            key = unpacker.unpack() if unpacker.tell() < len(view) else None
            if key == "id":
                rid = unpacker.unpack()
                ok = isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid <= m.MAX_ID
                return rid if ok else None
            unpacker.skip()
    except Exception:  # not msgpack, not a map, cut short: nothing to answer under
        return None
    return None


async def _on_frames(srv: ServerState, frames: list) -> None:
    if len(frames) < 2:
        return
    ident = frames[0].bytes
    body = frames[1:]
    srv.counters["bytes_received"] += frame_bytes(body)
    try:
        msg, arrays = decode(body, srv.limits)
    except ProtocolViolation as exc:
        try:
            decode_header_only(body[0], srv.limits)
        except ProtocolViolation:
            # A header over max_header_bytes (a 1 MB adapter name) is still answered
            # TOO_LARGE under its id, read without unpacking the rest (issue 53).
            rid = oversized_header_id(body[0]) if exc.code == ErrorCode.TOO_LARGE else None
            if rid is None:
                log(srv, "warning", "dropped", reason=str(exc)[:200])
                return
            await send_error(srv, ident, rid, exc.code, str(exc))
            return
        await send_error(srv, ident, exc.ref_id, exc.code, str(exc))
        return
    handler = _HANDLERS.get(msg.t)
    if handler is None:
        await send_error(
            srv, ident, msg.id, ErrorCode.BAD_REQUEST, f"{msg.t} is not a request a teacher accepts"
        )
        return
    # Before any state check: a refused admin message must change and reveal nothing.
    refused = roles.refusal(srv.admin, msg, roles.user_id(body[0]))
    if refused is not None:
        await send_error(srv, ident, msg.id, ErrorCode.UNAUTHORIZED, refused)
        return
    await handler(srv, ident, msg, arrays)


async def _on_hello(srv: ServerState, ident: bytes, msg: m.Hello, arrays: Any = None) -> None:
    backend = srv.backend
    if backend is None:  # still loading: answer once the model is there
        srv.held_hellos.append((ident, msg))
        return
    other = msg.tokenizer_fp != backend.tokenizer_fp or msg.vocab_size != backend.vocab_size
    xvocab = "xvocab" in (msg.understands or ()) and serves_xvocab(backend)
    if other and not xvocab:
        await send_error(
            srv,
            ident,
            msg.id,
            ErrorCode.TOKENIZER_MISMATCH,
            f"tokenizer mismatch: client {msg.client!r} has {msg.tokenizer_fp} "
            f"(V={msg.vocab_size}), teacher has {backend.tokenizer_fp} "
            f"(V={backend.vocab_size}); cross-tokenizer distillation is refused unless the "
            "client announces xvocab to a teacher that serves it (recipe teacher.tokenizer: "
            "other; docs/cross-tokenizer.md)",
        )
        return
    served = served_adapters(backend)
    refused = _unserved("HELLO", msg.adapter, served)
    if refused is not None:
        await send_error(srv, ident, msg.id, ErrorCode.UNSUPPORTED, refused)
        return
    srv.hello[ident] = msg.client
    if xvocab:
        srv.xvocab[ident] = other
    else:
        srv.xvocab.pop(ident, None)
    if msg.adapter is not None:
        srv.hello_adapter[ident] = msg.adapter
    else:
        srv.hello_adapter.pop(ident, None)
    lim = srv.limits
    exact = (
        m.ExactKind(max_vocab=lim.max_exact_vocab)
        if backend.vocab_size <= lim.max_exact_vocab
        else None
    )
    reply = m.HelloOk(
        id=msg.id,
        teacher=_identity(backend.info, msg.adapter, served),
        instance=srv.instance,
        gen=srv.gen,
        tokenizer_fp=backend.tokenizer_fp,
        vocab_size=backend.vocab_size,
        kinds=m.Kinds(
            topk=m.TopkKind(k_max=min(lim.max_k, backend.vocab_size)), exact=exact,
            xvocab=m.XvocabKind(k_max=min(lim.max_k, backend.vocab_size),
                                max_episode_bytes=lim.max_episode_bytes) if xvocab else None,
        ),
        limits=m.ServerLimits(
            max_tokens=lim.max_tokens,
            max_positions=lim.max_positions,
            max_inflight=lim.max_inflight,
        ),
        heartbeat_ms=srv.config.heartbeat_ms,
        server_version=srv.config.server_version,
        adapters=_adapter_list(served),
    )
    log(srv, "info", "hello", client=msg.client, gen=srv.gen,
        **({"adapter": msg.adapter} if msg.adapter is not None else {}))
    await send(srv, ident, encode(reply))


async def _on_score(srv: ServerState, ident: bytes, msg: m.Score, arrays: dict) -> None:
    refusal = _score_refusal(srv, ident)
    if refusal is not None:
        code, message = refusal
        await send_error(srv, ident, msg.id, code, message, retryable=True)
        return
    key = (ident, msg.id)
    if key in srv.inflight or key in srv.planning:  # a resend of an open request
        log(srv, "debug", "duplicate_inflight", id=msg.id)
        return
    cached = srv.answered.get(key)
    if cached is not None and cached[0] > time.monotonic():
        log(srv, "debug", "duplicate_answered", id=msg.id)
        await send(srv, ident, cached[1])
        return
    refusal = _busy_refusal(srv, ident)
    if refusal is not None:
        code, message = refusal
        await send_error(srv, ident, msg.id, code, message, retryable=True)
        return
    refusal = _kind_refusal(srv, ident, msg.kind) or _adapter_refusal(srv, ident, msg.adapter)
    if refusal is not None:
        await send_error(srv, ident, msg.id, ErrorCode.UNSUPPORTED, refusal)
        return
    if msg.kind == "xvocab":  # its content rules run once, there
        await _on_xvocab(srv, ident, msg, arrays)
        return
    lim, vocab_size = srv.limits, srv.backend.vocab_size
    try:
        check_score(msg, arrays, vocab_size, lim)  # decode applied the size limits
    except ProtocolViolation as exc:
        await send_error(srv, ident, msg.id, exc.code, str(exc))
        return
    n_pos = int(arrays["positions"].shape[0])
    if msg.kind == "exact" and 4 * n_pos * vocab_size > lim.max_array_bytes:
        await send_error(
            srv,
            ident,
            msg.id,
            ErrorCode.TOO_LARGE,
            f"an exact reply for {n_pos} positions x V={vocab_size} "
            f"exceeds {lim.max_array_bytes} bytes; send fewer positions",
        )
        return
    now = time.monotonic()
    job = ScoreJob(
        tokens_N=arrays["tokens"], cu_seqlens_B1=arrays["cu_seqlens"],
        positions_P=arrays["positions"], kind=msg.kind, k=msg.k, temperature=msg.temperature,
        client=ident, id=msg.id, student_version=msg.student_version, received=now,
        deadline=now + msg.deadline_ms / 1000 if msg.deadline_ms else None,
        deterministic=msg.deterministic, adapter=msg.adapter,
    )
    srv.counters["requests"] += 1
    srv.inflight[key] = job
    srv.per_client[ident] += 1
    srv.queue.append(job)
    srv.work.set()


async def _on_xvocab(srv: ServerState, ident: bytes, msg: m.Score, arrays: dict) -> None:
    """Plan an xvocab SCORE (teacher_server/xvocab.py) off the loop and queue it as the
    top-k job over the teacher's own tokens it is; an episode that cannot be aligned is
    BAD_REQUEST. The loop returns at once: the planning (JSON, chat rendering,
    alignment: a cost the client controls) runs on ``srv.planner``, so every other
    client is answered meanwhile (docs/teacher-server.md, "Transport guarantees")."""
    key = (ident, msg.id)
    srv.planning.add(key)  # open from now: max_inflight counts it, a resend waits for it
    srv.per_client[ident] += 1
    spawn(srv, _plan_and_queue(srv, ident, msg, arrays))


def _plan(tokenizer: Any, msg: m.Score, arrays: dict) -> Any:
    """The xvocab plan of one SCORE (the planner thread); raises what it refuses."""
    episode = parse_xvocab_score(msg, arrays)  # checks.check_score's xvocab branch
    return plan_xvocab(tokenizer, episode, arrays)


async def _plan_and_queue(srv: ServerState, ident: bytes, msg: m.Score, arrays: dict) -> None:
    key, lim, backend = (ident, msg.id), srv.limits, srv.backend
    queued = False
    try:
        try:
            plan = await asyncio.get_running_loop().run_in_executor(
                srv.planner, _plan, backend.tokenizer, msg, arrays)
        except ProtocolViolation as exc:
            await send_error(srv, ident, msg.id, exc.code, str(exc))
            return
        except Exception as exc:  # a template's own error too (jinja's raise_exception)
            await send_error(srv, ident, msg.id, ErrorCode.BAD_REQUEST,
                             f"the xvocab episode cannot be aligned: {describe(exc)}"[:2000])
            return
        if srv.backend is not backend:  # reloaded while planning: another tokenizer
            await send_error(srv, ident, msg.id, ErrorCode.RELOADING,
                             "the teacher reloaded while this xvocab SCORE was planned; "
                             "send it again", retryable=True)
            return
        n = int(plan.teacher_ids.shape[0])
        longest = min(lim.max_tokens, lim.max_seq_len or lim.max_tokens)
        if n > longest or plan.positions.shape[0] > lim.max_positions:
            await send_error(srv, ident, msg.id, ErrorCode.TOO_LARGE,
                             f"the teacher's rendering of the episode has {n} tokens "
                             f"({plan.positions.shape[0]} to score); the limits are "
                             f"{longest} tokens and {lim.max_positions} positions; send a "
                             "shorter episode")
            return
        now = time.monotonic()
        job = ScoreJob(
            tokens_N=plan.teacher_ids, cu_seqlens_B1=np.array([0, n], np.int32),
            positions_P=plan.positions, kind="topk", k=msg.k, temperature=msg.temperature,
            client=ident, id=msg.id, student_version=msg.student_version, received=now,
            deadline=now + msg.deadline_ms / 1000 if msg.deadline_ms else None,
            deterministic=msg.deterministic, xvocab=plan, adapter=msg.adapter,
        )
        srv.counters["requests"] += 1
        srv.inflight[key] = job  # the job keeps the per_client count it was given
        srv.queue.append(job)
        srv.work.set()
        queued = True
    finally:
        srv.planning.discard(key)
        if not queued:
            srv.per_client[ident] -= 1


def _kind_refusal(srv: ServerState, ident: bytes, kind: str) -> str | None:
    """Why this connection may not ask for ``kind`` (``UNSUPPORTED``): xvocab it did not
    negotiate, or token-id targets for a student with another tokenizer."""
    if kind == "xvocab" and ident not in srv.xvocab:
        return ("kind 'xvocab' was not negotiated on this connection: say HELLO with "
                "understands: [xvocab] to a teacher whose HELLO_OK advertises it")
    if kind == "xvocab" and not serves_xvocab(srv.backend):  # a reload since the HELLO
        return ("this teacher's model has no tokenizer with a chat template since its last "
                "reload: it serves no xvocab; say HELLO again")
    if kind != "xvocab" and srv.xvocab.get(ident):
        return (f"this client's tokenizer is not the teacher's: {kind} targets would index "
                "the teacher's vocabulary; ask for kind 'xvocab'")
    return None


def _quoted(names) -> str:
    return ", ".join(repr(name) for name in names)


def _unserved(what: str, asked: str | None, served: dict[str, str]) -> str | None:
    """Why a ``what`` (HELLO or SCORE) naming adapter ``asked`` is refused: this teacher
    does not serve it (``UNSUPPORTED``); None when it does, or when none is named."""
    if asked is None or asked in served:
        return None
    if not served:
        return (f"{what} names adapter {asked!r}; this teacher serves no named adapters (one "
                "model, under no name); leave adapter out, or ask a teacher started with "
                f"--adapters {asked}=DIR")
    return (f"{what} names adapter {asked!r}, which this teacher does not serve; it serves "
            f"{_quoted(served)}; name one of them (SyncTeacherClient(adapter=NAME))")


def _adapter_refusal(srv: ServerState, ident: bytes, asked: str | None) -> str | None:
    """Why a ``SCORE`` naming adapter ``asked`` (or none) is refused (``UNSUPPORTED``):
    an adapter not served, none named to a teacher serving only named adapters, or
    another than its connection's HELLO named (that HELLO_OK's identity would not be
    the one that scored it)."""
    served = served_adapters(srv.backend)
    refused = _unserved("SCORE", asked, served)
    if refused is not None:
        return refused
    if asked is None and served:
        return (f"SCORE names no adapter; this teacher serves only named adapters "
                f"({_quoted(served)}), not its base model alone; say HELLO and SCORE with "
                "adapter: one of them (SyncTeacherClient(adapter=NAME))")
    said = srv.hello_adapter.get(ident)
    if asked != said:
        hello = f"with adapter {said!r}" if said is not None else "without an adapter"
        return (f"SCORE names adapter {asked!r} but this connection said HELLO {hello}, whose "
                f"HELLO_OK identity is not {asked!r}'s; say HELLO again with adapter {asked!r} "
                "before scoring with it")
    return None


def _identity(info: dict[str, Any], adapter: str | None, served: dict[str, str]) -> m.TeacherInfo:
    """HELLO_OK's ``teacher``: the model's identity, or a named adapter's (its digest, and
    the name ``{model name}/{adapter}``), so a client's version tags, qualification record
    and cache keys tell adapters apart."""
    if adapter is None:
        return m.TeacherInfo(**info)
    return m.TeacherInfo(**{**info, "name": f"{info['name']}/{adapter}",
                            "adapter_sha256": served[adapter]})


def _adapter_list(served: dict[str, str]) -> list[m.AdapterInfo] | None:
    """HELLO_OK's and STATUS_OK's ``adapters`` (None, off the wire, for one model)."""
    if not served:
        return None
    return [m.AdapterInfo(name=name, adapter_sha256=digest) for name, digest in served.items()]


def _score_refusal(srv: ServerState, ident: bytes) -> tuple[ErrorCode, str] | None:
    """Why a ``SCORE`` cannot be looked at yet (checked before the resend table)."""
    if srv.state == TeacherState.LOADING:  # nobody can have said HELLO yet
        return ErrorCode.RELOADING, "teacher is still loading its model; retry later"
    if ident not in srv.hello:
        return ErrorCode.NEED_HELLO, f"say HELLO to teacher instance {srv.instance} before SCORE"
    return None


def _busy_refusal(srv: ServerState, ident: bytes) -> tuple[ErrorCode, str] | None:
    """Why a new ``SCORE`` is refused now (reloading, shutting down, over the limit)."""
    if srv.state == TeacherState.RELOADING:
        return ErrorCode.RELOADING, "teacher is reloading; retry later"
    if srv.state == TeacherState.DRAINING:
        return ErrorCode.SHUTTING_DOWN, "teacher is shutting down; retry later"
    if srv.per_client[ident] >= srv.limits.max_inflight:
        return ErrorCode.OVERLOADED, (
            f"client has {srv.per_client[ident]} requests open; the limit "
            f"is max_inflight={srv.limits.max_inflight}"
        )
    return None


async def _on_ping(srv: ServerState, ident: bytes, msg: m.Ping, arrays: Any = None) -> None:
    await send(srv, ident, encode(m.Pong(id=msg.id, **_liveness(srv))))


async def _on_status(srv: ServerState, ident: bytes, msg: m.Status, arrays: Any = None) -> None:
    backend = srv.backend
    memory = None
    if backend is not None:
        with contextlib.suppress(Exception):
            memory = m.DeviceMemory(**backend.memory())
    c = srv.counters
    reply = m.StatusOk(
        id=msg.id,
        **_liveness(srv),
        teacher=m.TeacherInfo(**backend.info) if backend is not None else None,
        adapters=_adapter_list(served_adapters(backend)) if backend is not None else None,
        counters=m.Counters(
            requests=c["requests"],
            positions=c["positions"],
            errors=dict(c["errors"]),
            bytes_received=c["bytes_received"],
            bytes_sent=c["bytes_sent"],
            replies_dropped=c["replies_dropped"],
        ),
        memory=memory,
    )
    await send(srv, ident, encode(reply))


def _liveness(srv: ServerState) -> dict[str, Any]:
    busy = bool(srv.inflight)
    idle_ms = (time.monotonic() - srv.last_progress) * 1000 if busy else 0.0
    return {
        "instance": srv.instance,
        "gen": srv.gen,
        "state": srv.state,
        "inflight": len(srv.inflight),
        "queue_depth": len(srv.queue),
        "last_progress_ms": round(idle_ms, 3),
    }


_HANDLERS: dict[str, Callable] = {
    "HELLO": _on_hello,
    "SCORE": _on_score,
    "PING": _on_ping,
    "STATUS": _on_status,
    "RELOAD": lifecycle.on_control,
    "PARK": lifecycle.on_control,
    "WAKE": lifecycle.on_control,
    "SHUTDOWN": lifecycle.on_control,
}
