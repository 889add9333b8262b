"""The student's side of ``mvl-score/1``: the async scoring client and the staleness rule.

:class:`TeacherClient` (anyio, asyncio backend) keeps several SCORE requests in flight
over one :class:`~miniverl.protocol.link.Link` (connection, HELLO, heartbeat,
reconnect, resend), matched by ``id`` in the pending table (``pending.py``).

The staleness rule (DESIGN §3, :func:`~miniverl.protocol.pending.accept_reply`): a
SCORE_OK is accepted only if its id is pending, its echoed ``student_version`` equals
the pending one, the current version minus it is within ``allowed_lag`` and — once
:meth:`TeacherClient.bind` tied the update to a teacher — it comes from that
``(instance, gen)``. Everything else is dropped and counted in ``stale_dropped``. A new
``instance``/``gen`` seen while bound means the update cannot complete:
:meth:`TeacherClient.wait` raises :class:`TeacherChanged`. Admin calls (STATUS, PARK,
WAKE, RELOAD, SHUTDOWN) are one round trip each through :meth:`Link.call`.

The blocking facade is ``sync_client.py``. This module does not compute losses, cache
targets or serve anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import anyio
import numpy as np

from miniverl.common.errors import (
    MiniverlError,
    ProtocolError,
    StaleTargetError,
    TeacherError,
    TeacherUnavailable,
)
from miniverl.protocol.checks import validate_score
from miniverl.protocol.codec import encode
from miniverl.protocol.endpoints import default_admin_token_file, read_admin_token
from miniverl.protocol.finite import nonfinite_report
from miniverl.protocol.link import Link, LinkSettings
from miniverl.protocol.messages import (
    TEMPERATURE_MAX,
    TEMPERATURE_MIN,
    HelloOk,
    ParkOk,
    Ping,
    Pong,
    Reload,
    ReloadOk,
    Score,
    ScoreOk,
    Shutdown,
    ShutdownOk,
    WakeOk,
)
from miniverl.protocol.messages import Park as ParkMsg
from miniverl.protocol.messages import Status as StatusMsg
from miniverl.protocol.messages import Wake as WakeMsg
from miniverl.protocol.pending import Identity, Request, accept_reply, within_lag


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

    @classmethod
    def from_reply(cls, msg: ScoreOk, arrays: dict[str, np.ndarray]) -> ScoreResult:
        fields = msg.model_dump(include={"id", "student_version", "instance", "gen", "kind", "k"})
        return cls(**fields, arrays=arrays, timing=msg.timing.model_dump())


class TeacherClient:
    """Async client of one teacher endpoint; use as ``async with TeacherClient(...) as c``.

    Keyword settings are :class:`~miniverl.protocol.link.LinkSettings` fields:
    ``tokenizer_fp`` and ``vocab_size`` (required; ``tokenizer_fp=None`` makes an
    admin-only client: status/park/wake/reload/shutdown, no HELLO, no SCORE),
    ``client_name``, ``heartbeat_ms``, ``request_timeout_s``, ``unavailable_timeout_s``,
    ``curve``, ``transport_factory``, ``limits``, ``admin_token``, ``admin_token_file``.
    """

    def __init__(self, endpoint: str, **settings: Any):
        self.link = Link(
            LinkSettings(endpoint, **settings),
            on_score_ok=self._on_score_ok,
            on_identity=self._on_identity,
        )
        self._version = 0
        self._allowed_lag = 0
        self._bound: Identity | None = None
        self._changed: TeacherChanged | None = None

    # ----------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> TeacherClient:
        await self.link.__aenter__()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool | None:
        return await self.link.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Close the connection; pending requests fail with :class:`TeacherUnavailable`."""
        await self.link.aclose()

    @property
    def endpoint(self) -> str:
        return self.link.endpoint

    @property
    def hello(self) -> HelloOk | None:
        return self.link.hello

    @property
    def counters(self) -> dict[str, int]:
        """sent, received, stale_dropped, retries, reconnects, bytes_sent,
        bytes_received (all frames, resends and PINGs included), malformed (top-k ids
        outside the vocabulary among them: dropped, a TeacherError), nonfinite_replies
        (SCORE_OKs holding a forbidden NaN/inf: dropped, a TeacherError)."""
        return dict(self.link.table.counts)

    @property
    def bound(self) -> Identity | None:
        return self._bound

    @property
    def version(self) -> int:
        return self._version

    # ----------------------------------------------------------------- scoring
    async def connect(self, timeout_s: float | None = None) -> HelloOk | None:
        """Open the link and handshake; returns the validated ``HELLO_OK``.

        Raises :class:`TokenizerMismatch` (fatal) or :class:`TeacherUnavailable`.
        """
        return await self.link.connect(timeout_s)

    def set_version(self, version: int, allowed_lag: int = 0) -> None:
        """Set the student's current parameter version and the lag replies may have.

        Pending requests that fall outside the lag can never be accepted and are
        failed with :class:`StaleTargetError` (their late replies count as stale).
        """
        if version < 0 or allowed_lag < 0:
            raise ValueError(f"version={version}, allowed_lag={allowed_lag} must be >= 0")
        self._version, self._allowed_lag = version, allowed_lag
        for req in list(self.link.table.rows.values()):
            if req.t == "SCORE" and not within_lag(version, req.student_version, allowed_lag):
                self.link.table.drop(
                    req,
                    StaleTargetError(
                        f"request {req.id} was sent for student version {req.student_version}, "
                        f"now {version} with allowed lag {allowed_lag}; re-submit it"
                    ),
                )
        self.link.table.notify()

    async def bind(self) -> Identity:
        """Tie the current update to the teacher ``(instance, gen)`` now connected.

        Requests bound to an earlier teacher are dropped (their replies count as stale).
        """
        await self.link.until_up(None)
        identity = (self.hello.instance, self.hello.gen)
        if self.link.identity is not None and self.link.identity != identity:
            await self.link.rehello()
            identity = (self.hello.instance, self.hello.gen)
        self._bound, self._changed = identity, None
        for req in list(self.link.table.rows.values()):
            if req.binding is not None and req.binding != identity:
                self.link.table.drop(req, self._changed_error(req.binding, identity))
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
        deterministic: bool = False,
    ) -> int:
        """Queue one SCORE for the current version and binding; returns its id.

        Arrays are checked locally first (:class:`ProtocolError` for a bad request).
        ``deterministic`` asks the teacher to score it alone (bit-reproducible replies).
        """
        self.link.require_started()
        self.link.raise_fatal()
        if self.link.tokenizer_fp is None:
            raise ProtocolError("this client has no tokenizer_fp (admin only); it cannot SCORE")
        if not TEMPERATURE_MIN <= temperature <= TEMPERATURE_MAX:
            raise ProtocolError(f"temperature={temperature} is outside [{TEMPERATURE_MIN}, "
                                f"{TEMPERATURE_MAX}]; pick one inside (docs/protocol.md)")
        arrays = {
            "tokens": _int32(tokens_N, "tokens_N"),
            "cu_seqlens": _int32(cu_seqlens_B1, "cu_seqlens_B1"),
            "positions": _int32(positions_P, "positions_P"),
        }
        rid = self.link.table.new_id()
        msg = Score(
            id=rid,
            student_version=self._version,
            kind=kind,
            k=k if kind == "topk" else 0,
            temperature=temperature,
            deadline_ms=deadline_ms,
            deterministic=deterministic,
        )
        validate_score(msg, arrays, self.link.vocab_size, self.link.limits)
        req = Request(
            id=rid,
            t="SCORE",
            frames=encode(msg, arrays),
            student_version=self._version,
            binding=self._bound,
            kind=msg.kind,
            k=msg.k,
            positions=len(arrays["positions"]),
        )
        self.link.table.rows[rid] = req
        await self.link.pump()
        return rid

    async def wait(
        self, ids: Iterable[int], timeout_s: float | None = None
    ) -> dict[int, ScoreResult]:
        """Wait until every id has an accepted reply; returns ``{id: ScoreResult}``.

        Raises :class:`TeacherChanged`, :class:`TeacherError` (a non-retryable ERROR),
        :class:`StaleTargetError`, :class:`TokenizerMismatch`,
        :class:`TeacherUnavailable`, or :class:`ScoreTimeout` after ``timeout_s``.
        """
        table = self.link.table
        wanted = list(ids)
        reqs = []
        for rid in wanted:
            req = table.rows.get(rid)
            if req is None or req.t != "SCORE":
                raise StaleTargetError(
                    f"request id {rid} is not pending (already collected, or dropped by "
                    "set_version/bind); re-submit it"
                )
            reqs.append(req)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            progress = table.progress
            for req in reqs:
                if req.error is not None:
                    table.rows.pop(req.id, None)
                    raise req.error
            if all(req.result is not None for req in reqs):
                for rid in wanted:
                    table.rows.pop(rid, None)
                return {req.id: req.result for req in reqs}
            self.link.raise_fatal()
            if self._changed is not None and any(req.binding is not None for req in reqs):
                raise self._changed
            if deadline is not None and time.monotonic() >= deadline:
                left = [req.id for req in reqs if req.result is None]
                raise ScoreTimeout(f"no accepted reply for ids {left} within {timeout_s} s")
            with anyio.move_on_after(self.link.tick):
                await progress.wait()

    async def score(self, tokens_N: Any, cu_seqlens_B1: Any, positions_P: Any, **kw: Any):
        """``submit`` then ``wait`` for one request."""
        rid = await self.submit(tokens_N, cu_seqlens_B1, positions_P, **kw)
        return (await self.wait([rid]))[rid]

    async def retarget(self, endpoint: str) -> HelloOk:
        """Handshake with ``endpoint``; only if it validates, switch this client to it."""
        self.link.require_started()
        # The probe shares this client's settings and socket factory; only the endpoint differs.
        settings = replace(self.link.settings, endpoint=endpoint, transport_factory=self.link.factory)
        async with TeacherClient(**vars(settings)) as probe:
            await probe.connect()
        return await self.link.switch(endpoint)

    # ----------------------------------------------------------------- admin
    async def ping(self) -> Pong:
        return await self.link.call(Ping(id=self.link.table.new_id()))

    async def status(self) -> dict[str, Any]:
        reply = await self.link.call(StatusMsg(id=self.link.table.new_id()))
        return reply.model_dump(mode="json")

    def _auth(self) -> str | None:
        """The admin token admin messages carry (``auth``): the setting, else the file
        it names (re-read: a restarted teacher writes a new one), else the file a teacher
        at this endpoint writes by default; None over CURVE (the key is the proof)."""
        settings = self.link.settings
        if settings.admin_token is not None:
            return settings.admin_token
        found = settings.admin_token_file
        if found is None and settings.curve is None:
            found = default_admin_token_file(self.link.endpoint)
        return read_admin_token(found) if found is not None else None

    async def park(self) -> ParkOk:
        return await self.link.call(ParkMsg(id=self.link.table.new_id(), auth=self._auth()))

    async def wake(self) -> WakeOk:
        return await self.link.call(WakeMsg(id=self.link.table.new_id(), auth=self._auth()))

    async def reload(
        self,
        model: str,
        revision: str | None = None,
        adapter: str | None = None,
        mode: str = "drain",
        timeout_s: float = 600.0,
        adapter_revision: str | None = None,
    ) -> ReloadOk:
        msg = Reload(id=self.link.table.new_id(), model=model, revision=revision, adapter=adapter,
                     adapter_revision=adapter_revision, mode=mode, auth=self._auth())
        return await self.link.call(msg, timeout_s=timeout_s)

    async def shutdown(self, mode: str = "drain", timeout_s: float | None = None) -> ShutdownOk:
        msg = Shutdown(id=self.link.table.new_id(), mode=mode, timeout_s=timeout_s,
                       auth=self._auth())
        wait_s = max(self.link.request_timeout_s, (timeout_s or 0.0) + self.link.request_timeout_s)
        return await self.link.call(msg, timeout_s=wait_s)

    # ----------------------------------------------------------------- the staleness rule
    def _on_score_ok(self, msg: ScoreOk, arrays: dict[str, np.ndarray]) -> None:
        table = self.link.table
        req = table.rows.get(msg.id)
        reason = accept_reply(
            req.pending if req is not None else None,
            msg,
            current_version=self._version,
            max_lag=self._allowed_lag,
            bound_teacher=self._bound,
        )
        if reason is not None:
            table.counts["stale_dropped"] += 1
            if reason == "lag":
                table.drop(req, StaleTargetError(f"reply {msg.id} is outside the allowed lag"))
        elif not self._reply_matches(req, msg, arrays):
            table.counts["malformed"] += 1
        elif problem := nonfinite_report(arrays, kind=msg.kind, k=msg.k,
                                         vocab_size=self.link.vocab_size):
            table.counts["nonfinite_replies"] += 1  # never trained on: a teacher error
            table.drop(req, TeacherError(
                f"teacher sent non-finite targets for SCORE {msg.id} ({problem}); the "
                "reply was dropped; check the teacher's weights, dtype and temperature"))
        elif (outside := _ids_outside(arrays, self.link.vocab_size)) is not None:
            # An id past the vocabulary indexes out of bounds in the loss's gather (a
            # device-side assert on CUDA): never trained on, a teacher error.
            table.counts["malformed"] += 1
            table.drop(req, TeacherError(
                f"teacher sent token ids outside [0, {self.link.vocab_size}) for SCORE "
                f"{msg.id} (e.g. {outside}); the reply was dropped; check the teacher's "
                "vocabulary and top-k"))
        else:
            req.finish(result=ScoreResult.from_reply(msg, arrays))

    def _reply_matches(self, req: Request, msg: ScoreOk, arrays: dict[str, np.ndarray]) -> bool:
        if msg.kind != req.kind or (req.kind == "topk" and msg.k != req.k):
            return False
        if arrays["target_logprobs"].shape[0] != req.positions:
            return False
        return req.kind == "topk" or arrays["logprobs"].shape[1] == self.link.vocab_size

    def _on_identity(self, new: Identity) -> None:
        """A teacher other than the bound one answered: the bound update cannot finish."""
        if self._bound is not None and new != self._bound and self._changed is None:
            self._changed = self._changed_error(self._bound, new)
            self.link.table.notify()

    def _changed_error(self, old: Identity, new: Identity) -> TeacherChanged:
        if self.link.retargeting:
            how = "retarget"
        elif old[0] != new[0]:
            how = "restart"
        else:
            how = "reload"
        return TeacherChanged(old, new, how)


def _int32(value: Any, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ProtocolError(f"{name} must be a 1-D integer array, got {arr.dtype}{list(arr.shape)}")
    if arr.size and (int(arr.min()) < -(2**31) or int(arr.max()) >= 2**31):
        raise ProtocolError(f"{name} holds values outside int32")
    return arr.astype("<i4", copy=False)


def _ids_outside(arrays: dict[str, np.ndarray], vocab_size: int) -> int | None:
    """A top-k ``ids`` value outside ``[0, vocab_size)``, or None when all are inside."""
    ids = arrays.get("ids")
    if ids is None or ids.size == 0:
        return None
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    return int(bad.flat[0]) if bad.size else None
