"""The batcher: accepted ``SCORE`` jobs → coalesced batches on the backend → replies.

Admission (``server.py``) appends jobs to ``srv.queue`` and sets ``srv.work``;
:func:`dispatch_loop` takes queued jobs in arrival order, coalescing them up to
``batch_tokens`` packed tokens per forward pass, fails those whose ``deadline_ms``
passed in the queue with a retryable ``DEADLINE_EXCEEDED``, runs the rest on the
worker thread and sends one ``SCORE_OK`` (or the backend's per-job ``ERROR``) per job.
A ``deterministic`` job is never coalesced: it runs alone, so its reply does not depend
on which other requests happened to be queued with it. A batch holds the jobs of one
adapter (``ScoreJob.adapter``, a teacher serving ``--adapters``): jobs asking for
another are passed over, keeping their place, and go in a later batch. A reply holding a NaN or an
infinity the protocol does not allow (``protocol/checks.py``, ``nonfinite_report``) is
never sent: that job gets ``ERROR INTERNAL`` naming what was non-finite, whichever
backend computed it. This is the teacher's one finite-targets check (docs/protocol.md,
"Where each check runs").
A parked teacher is woken first (``implicit_wake``). A job aborted meanwhile (by a
``RELOAD abort`` or a ``SHUTDOWN``) gets no reply from here.

This module does not decode messages or change the lifecycle beyond that wake.
"""

from __future__ import annotations

import asyncio
import time
import traceback

from miniverl.protocol import messages as m
from miniverl.protocol.checks import nonfinite_report
from miniverl.protocol.codec import encode
from miniverl.protocol.messages import ErrorCode, TeacherState
from miniverl.teacher_server.backend import BackendError, ScoreJob
from miniverl.teacher_server.lifecycle import WAKE_TRIES, implicit_wake
from miniverl.teacher_server.server_state import (
    ServerState,
    close_job,
    describe,
    log,
    remember,
    run_compute,
    send,
    send_error,
)


async def dispatch_loop(srv: ServerState) -> None:
    """Run queued jobs batch by batch whenever ``srv.work`` is set; never dies on an error."""
    while True:
        await srv.work.wait()
        srv.work.clear()
        while srv.queue and srv.backend is not None:
            try:
                async with srv.compute:
                    if not srv.queue:
                        break
                    if srv.state == TeacherState.PARKED:
                        log(srv, "info", "implicit_wake", reason="SCORE while parked")
                        error = await implicit_wake(srv)
                        if error is not None:
                            await _refuse_queued(srv, error)
                            break
                    await run_batch(srv, take_batch(srv))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log(
                    srv,
                    "error",
                    "dispatch_error",
                    error=describe(exc),
                    trace=traceback.format_exc(limit=6),
                )


async def _refuse_queued(srv: ServerState, error: Exception) -> None:
    """Answer every queued job ``ERROR`` after an implicit wake failed its tries; the
    teacher stays PARKED (a later SCORE or WAKE tries again)."""
    jobs = list(srv.queue)
    srv.queue.clear()
    for job in jobs:
        close_job(srv, job)
        await send_error(
            srv, job.client, job.id, ErrorCode.INTERNAL,
            f"the parked teacher could not be woken ({WAKE_TRIES} tries): {describe(error)}; "
            "resend to try again, or restart the teacher",
            retryable=True,
        )


def take_batch(srv: ServerState) -> list[ScoreJob]:
    """The oldest job plus the following ones of its adapter while their tokens fit
    ``batch_tokens``; a deterministic job alone. Jobs of another adapter are passed over
    and keep their place: one forward pass runs one adapter's weights."""
    queue = srv.queue
    first = queue.popleft()
    if first.deterministic:
        return [first]
    batch, passed = [first], []
    tokens = first.tokens_N.shape[0]
    while queue:
        if queue[0].adapter != first.adapter:
            passed.append(queue.popleft())
            continue
        if queue[0].deterministic or tokens + queue[0].tokens_N.shape[0] > srv.config.batch_tokens:
            break
        job = queue.popleft()
        tokens += job.tokens_N.shape[0]
        batch.append(job)
    queue.extendleft(reversed(passed))
    return batch


async def run_batch(srv: ServerState, batch: list[ScoreJob]) -> None:
    """Score ``batch`` in one backend call (worker thread) and answer every live job."""
    now = time.monotonic()
    live = []
    for job in batch:
        if job.deadline is not None and now > job.deadline:
            close_job(srv, job)
            await send_error(
                srv,
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
    srv.computing = live
    srv.last_progress = now
    gen, backend = srv.gen, srv.backend
    try:
        results = await run_compute(srv, backend.score_batch, live)
        if len(results) != len(live):
            raise RuntimeError(f"backend returned {len(results)} results for {len(live)} jobs")
    except Exception as exc:
        log(
            srv,
            "error",
            "score_failed",
            error=describe(exc),
            jobs=len(live),
            trace=traceback.format_exc(limit=6),
        )
        results = [
            BackendError(ErrorCode.INTERNAL, f"scoring failed: {describe(exc)}", retryable=True)
        ] * len(live)
    finally:
        srv.computing = []
    done = time.monotonic()
    srv.last_progress = done
    compute_ms = 1000 * (done - now)
    stats = backend.stats()  # the built-in backend's: its prefix cache
    log(
        srv,
        "debug",
        "batch",
        jobs=len(live),
        compute_ms=round(compute_ms, 3),
        tokens=sum(j.tokens_N.shape[0] for j in live),
        **({"backend": stats} if stats else {}),
    )
    for job, result in zip(live, results, strict=True):
        if job.aborted:
            continue
        close_job(srv, job)
        if not isinstance(result, BackendError):
            result = _finite_or_error(srv, job, result, backend.vocab_size)
        if isinstance(result, BackendError):
            await send_error(
                srv, job.client, job.id, result.code, str(result),
                retryable=result.retryable, cache=True,
            )
            continue
        plan = job.xvocab  # an xvocab request: the backend scored its top-k job
        header = m.ScoreOk(
            id=job.id,
            student_version=job.student_version,
            instance=srv.instance,
            gen=gen,
            kind="xvocab" if plan is not None else job.kind,
            k=job.k,
            timing=m.Timing(
                queue_ms=round(1000 * (now - job.received), 3), compute_ms=round(compute_ms, 3)
            ),
            **({"episode_sha256": plan.episode_sha256,
                "alignment_sha256": plan.alignment_sha256} if plan is not None else {}),
        )
        names = m.TOPK_ARRAYS if job.kind == "topk" else m.EXACT_ARRAYS
        out = {name: result[name] for name in names}
        if plan is not None:
            out = {"teacher_ids": plan.teacher_ids, "groups": plan.groups,
                   "positions": plan.positions, **out}
        frames = encode(header, out)
        srv.counters["positions"] += int(job.positions_P.shape[0])
        remember(srv, (job.client, job.id), frames)
        await send(srv, job.client, frames)


def _finite_or_error(srv: ServerState, job: ScoreJob, result: dict, vocab_size: int):
    """``result``, or an ``INTERNAL`` error when it holds a value the protocol forbids."""
    problem = nonfinite_report(result, kind=job.kind, k=job.k, vocab_size=vocab_size)
    if problem is None:
        return result
    log(srv, "error", "nonfinite_reply", id=job.id, problem=problem)
    return BackendError(
        ErrorCode.INTERNAL,
        f"the teacher computed non-finite values ({problem}); nothing was sent; "
        "check the teacher's weights and dtype",
    )
