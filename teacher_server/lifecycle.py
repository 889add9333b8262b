"""The teacher's lifecycle: LOADING → READY ⇄ PARKED, RELOADING, DRAINING (docs/teacher-server.md, "States").

- the first load runs on the worker thread after the bind (``PING`` answers
  ``LOADING`` meanwhile); a failed load answers the held ``HELLO`` s with
  ``TEACHER_DEAD`` and stops the server with exit code 1;
- ``RELOAD`` (drain|abort) parks the old teacher, loads and validates the new one
  (same tokenizer and vocabulary, and the competence gate of the recipe the server
  was started with, if any), then closes the old one and bumps ``gen``; on any
  failure or refusal the old teacher wakes and keeps serving;
- ``PARK``/``WAKE`` move the weights through the backend (a ``SCORE`` while parked is
  woken by the batcher, :func:`implicit_wake`: tried ``WAKE_TRIES`` times with backoff,
  then its requests are answered ``ERROR``); a ``PARK`` or ``WAKE`` that raises is
  answered ``ERROR`` at once;
- ``SHUTDOWN`` drain|abort (SIGTERM means drain) answers or aborts what is open, then
  stops the server.

State changes that a following message must see happen in :func:`on_control`, before
the next message is read. This module does not read the socket or score.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from miniverl.common.errors import MiniverlError, TokenizerMismatch
from miniverl.protocol import messages as m
from miniverl.protocol.codec import encode
from miniverl.protocol.messages import ErrorCode, TeacherState
from miniverl.teacher_server.server_state import (
    ServerState,
    abort_all,
    describe,
    drained,
    log,
    run_compute,
    send,
    send_error,
    spawn,
)


async def initial_load(srv: ServerState) -> bool:
    """Build the first backend; True when it is serving (the held HELLOs are then due)."""
    async with srv.compute:
        t0 = time.monotonic()
        try:
            backend = await run_compute(srv, srv.loader, None)
        except Exception as exc:
            log(srv, "error", "load_failed", error=describe(exc))
            # With --log FILE the JSON line goes there; the exit still says why on stderr.
            print(f"error: teacher failed to load: {describe(exc)}", file=sys.stderr, flush=True)
            for ident, hello in srv.held_hellos:
                await send_error(
                    srv,
                    ident,
                    hello.id,
                    ErrorCode.TEACHER_DEAD,
                    f"teacher failed to load: {describe(exc)}",
                )
            srv.exit_code = 1
            srv.stopped.set()
            return False
        srv.backend = backend
        if srv.state == TeacherState.LOADING:
            srv.state = TeacherState.READY
        srv.last_progress = time.monotonic()
    log(
        srv,
        "info",
        "ready",
        teacher=backend.info,
        vocab_size=backend.vocab_size,
        tokenizer_fp=backend.tokenizer_fp,
        load_s=round(time.monotonic() - t0, 3),
    )
    return True


async def on_control(srv: ServerState, ident: bytes, msg: m.Message, arrays: Any = None) -> None:
    """``RELOAD``, ``PARK``, ``WAKE``, ``SHUTDOWN``: refuse while busy, else start the change."""
    busy = (TeacherState.LOADING, TeacherState.RELOADING, TeacherState.DRAINING)
    if msg.t == "SHUTDOWN":  # allowed while loading or reloading, once
        busy = (TeacherState.DRAINING,)
    if srv.state in busy:
        await send_error(
            srv,
            ident,
            msg.id,
            ErrorCode.RELOADING,
            f"teacher is {srv.state.value}; {msg.t} must wait; retry later",
            retryable=True,
        )
        return
    # State changes happen here, before the next message is read: a SCORE that
    # arrives right behind a SHUTDOWN or RELOAD must already see the new state.
    if msg.t == "RELOAD":
        previous, srv.state = srv.state, TeacherState.RELOADING
        spawn(srv, _reload(srv, ident, msg, previous))
    elif msg.t == "SHUTDOWN":
        srv.state = TeacherState.DRAINING
        spawn(srv, _shutdown(srv, ident, msg))
    else:
        spawn(srv, (_park if msg.t == "PARK" else _wake)(srv, ident, msg))


def request_shutdown(srv: ServerState, mode: str = "drain") -> None:
    """Begin a shutdown from the event loop's thread (SIGTERM handler)."""
    if srv.state != TeacherState.DRAINING:
        srv.state = TeacherState.DRAINING
        spawn(srv, _shutdown(srv, None, m.Shutdown(id=0, mode=mode)))


async def _park(srv: ServerState, ident: bytes, msg: m.Park) -> None:
    try:
        async with srv.compute:
            await run_compute(srv, srv.backend.park)
            if srv.state == TeacherState.READY:
                srv.state = TeacherState.PARKED
    except Exception as exc:
        # Answer at once: without a reply the student waited out its whole timeout.
        await _refuse_swap(srv, ident, msg, exc)
        return
    log(srv, "info", "parked")
    await send(srv, ident, encode(m.ParkOk(id=msg.id, state=srv.state)))


async def _wake(srv: ServerState, ident: bytes, msg: m.Wake) -> None:
    try:
        async with srv.compute:
            await wake_locked(srv)
    except Exception as exc:
        await _refuse_swap(srv, ident, msg, exc)
        return
    await send(srv, ident, encode(m.WakeOk(id=msg.id, state=srv.state)))


async def _refuse_swap(srv: ServerState, ident: bytes, msg: m.Message, exc: Exception) -> None:
    """A PARK or WAKE that raised: log it and answer ``ERROR`` (INTERNAL) naming the state
    the teacher is left in."""
    log(srv, "error", f"{msg.t.lower()}_failed", error=describe(exc), state=srv.state.value)
    await send_error(
        srv, ident, msg.id, ErrorCode.INTERNAL,
        f"{msg.t} failed: {describe(exc)}; the teacher is {srv.state.value}",
        retryable=True,
    )


# An implicit wake (a SCORE while parked) that fails is tried WAKE_TRIES times, waiting
# WAKE_BACKOFF_S, then twice that, between tries; it was retried at once, forever.
WAKE_TRIES = 3
WAKE_BACKOFF_S = 0.5


async def implicit_wake(srv: ServerState) -> Exception | None:
    """Wake for a queued ``SCORE`` (the caller holds ``srv.compute``); None once awake,
    else the last error after :data:`WAKE_TRIES` tries with backoff."""
    error: Exception | None = None
    for attempt in range(WAKE_TRIES):
        try:
            await wake_locked(srv)
            return None
        except Exception as exc:
            error = exc
            log(srv, "error", "wake_failed", attempt=attempt + 1, tries=WAKE_TRIES,
                error=describe(exc))
            if attempt + 1 < WAKE_TRIES:
                await asyncio.sleep(WAKE_BACKOFF_S * 2**attempt)
    return error


async def wake_locked(srv: ServerState) -> None:
    """Move the weights back (the caller holds ``srv.compute``); PARKED becomes READY."""
    await run_compute(srv, srv.backend.wake)
    if srv.state == TeacherState.PARKED:
        srv.state = TeacherState.READY
    log(srv, "info", "woken")


async def _reload(srv: ServerState, ident: bytes, msg: m.Reload, previous: TeacherState) -> None:
    request = {"model": msg.model, "revision": msg.revision, "adapter": msg.adapter,
               "adapter_revision": msg.adapter_revision}
    log(srv, "info", "reload_started", **request, mode=msg.mode)
    try:
        if msg.mode == "abort":
            for job in abort_all(srv, ErrorCode.RELOADING, "reload (abort)"):
                await send_error(
                    srv,
                    job.client,
                    job.id,
                    ErrorCode.RELOADING,
                    "aborted by RELOAD; resend after the reload",
                    retryable=True,
                )
        else:
            await drained(srv)
        async with srv.compute:
            old = srv.backend
            # Free the accelerator for the newcomer; the old teacher comes back on failure.
            await run_compute(srv, old.park)
            try:
                new = await run_compute(srv, srv.loader, request)
                try:
                    await _vet(srv, old, new)
                except Exception:
                    await run_compute(srv, new.close)
                    raise
            except Exception:
                if previous != TeacherState.PARKED:
                    await run_compute(srv, old.wake)
                raise
            await run_compute(srv, old.close)
            srv.backend = new
            srv.gen += 1
            previous = TeacherState.READY
    except Exception as exc:
        code = (
            ErrorCode.TOKENIZER_MISMATCH
            if isinstance(exc, TokenizerMismatch)
            else (ErrorCode.BAD_REQUEST if isinstance(exc, MiniverlError) else ErrorCode.INTERNAL)
        )
        log(srv, "error", "reload_failed", error=describe(exc), gen=srv.gen)
        await send_error(
            srv,
            ident,
            msg.id,
            code,
            f"reload refused: {describe(exc)}; the previous teacher keeps "
            f"serving (gen {srv.gen})",
        )
        return
    finally:
        if srv.state == TeacherState.RELOADING:  # a SHUTDOWN may have come meanwhile
            srv.state = previous
        srv.work.set()
    log(srv, "info", "reloaded", gen=srv.gen, teacher=srv.backend.info)
    reply = m.ReloadOk(id=msg.id, gen=srv.gen, teacher=m.TeacherInfo(**srv.backend.info))
    await send(srv, ident, encode(reply))


async def _vet(srv: ServerState, old: Any, new: Any) -> None:
    """Refuse a reload target before it serves: another tokenizer, or a teacher the
    served recipe's competence gate refuses (``ServerConfig.gate``)."""
    if new.tokenizer_fp != old.tokenizer_fp or new.vocab_size != old.vocab_size:
        raise TokenizerMismatch(
            f"new teacher's tokenizer {new.tokenizer_fp} (V={new.vocab_size}) "
            f"differs from the served one {old.tokenizer_fp} (V={old.vocab_size})"
        )
    if srv.config.gate is not None:
        # Hashing a model directory the first time can take a while: off the event loop.
        await run_compute(srv, srv.config.gate, dict(new.info))


async def _shutdown(srv: ServerState, ident: bytes | None, msg: m.Shutdown) -> None:
    log(srv, "info", "shutdown_started", mode=msg.mode, timeout_s=msg.timeout_s)
    finished = msg.mode == "drain" and await drained(srv, msg.timeout_s)
    if not finished:
        for job in abort_all(srv, ErrorCode.SHUTTING_DOWN, f"shutdown ({msg.mode})"):
            await send_error(
                srv,
                job.client,
                job.id,
                ErrorCode.SHUTTING_DOWN,
                "teacher shut down before this request finished",
                retryable=True,
            )
    if ident is not None:
        await send(srv, ident, encode(m.ShutdownOk(id=msg.id)))
    srv.stopped.set()
