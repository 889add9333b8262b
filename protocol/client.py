"""The student's side of ``mvl-score/1``: the async scoring client.

:class:`TeacherClient` (anyio, asyncio backend) keeps several SCORE requests in flight
over one connection. It is made of three parts, each with its own job:

- this module turns calls into messages: it checks a SCORE before it is sent
  (``checks.validate_score``), encodes it and files it, and sends the admin calls
  (STATUS, PARK, WAKE, RELOAD, SHUTDOWN: one round trip each) with their ``auth``;
- the pending table (``pending.py``) owns every request in flight, the student's
  version, the allowed lag and the bound teacher, and decides once per SCORE_OK
  whether it may be trained on (THE staleness rule, docs/protocol.md "Staleness rule");
- the link (``link.py``) keeps the socket up: HELLO, heartbeat, reconnect, resend.

The staleness rule: a SCORE_OK is accepted only if its id is pending, its echoed
``student_version`` equals the pending one, the current version minus it is within
``lag`` and, once :meth:`TeacherClient.bind` tied the update to a teacher, it
comes from that ``(instance, gen)``. Everything else is dropped and counted in
``stale_dropped``. A new ``instance``/``gen`` seen while bound means the update cannot
complete: :meth:`TeacherClient.wait` raises :class:`TeacherChanged`.

The blocking facade is ``sync_client.py``; the methods the training side relies on are
the :class:`~miniverl.protocol.scoring_client.ScoringClient` protocol. This module does
not compute losses, cache targets or serve anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np

from miniverl.common.errors import ProtocolError
from miniverl.protocol.checks import validate_score
from miniverl.protocol.codec import encode
from miniverl.protocol.endpoints import default_admin_token_file, read_admin_token
from miniverl.protocol.link import Link, LinkSettings
from miniverl.protocol.messages import (
    TEMPERATURE_MAX,
    TEMPERATURE_MIN,
    HelloOk,
    Kind,
    Mode,
    ParkOk,
    Ping,
    Pong,
    Reload,
    ReloadOk,
    Score,
    Shutdown,
    ShutdownOk,
    WakeOk,
)
from miniverl.protocol.messages import Park as ParkMsg
from miniverl.protocol.messages import Status as StatusMsg
from miniverl.protocol.messages import Wake as WakeMsg
from miniverl.protocol.pending import PendingTable
from miniverl.protocol.scoring_client import Identity, ScoreResult, ScoreTimeout, TeacherChanged
from miniverl.protocol.xvocab import request_digest

__all__ = ["ScoreResult", "ScoreTimeout", "TeacherChanged", "TeacherClient"]


def _check_temperature(temperature: float) -> None:
    """A SCORE's temperature, checked before anything is sent."""
    if not TEMPERATURE_MIN <= temperature <= TEMPERATURE_MAX:
        raise ProtocolError(f"temperature={temperature} is outside [{TEMPERATURE_MIN}, "
                            f"{TEMPERATURE_MAX}]; pick one inside (docs/protocol.md)")


class TeacherClient:
    """Async client of one teacher endpoint; use as ``async with TeacherClient(...) as c``.

    Keyword settings are :class:`~miniverl.protocol.link.LinkSettings` fields:
    ``tokenizer_fp`` and ``vocab_size`` (required; ``tokenizer_fp=None`` makes an
    admin-only client: status/park/wake/reload/shutdown, no HELLO, no SCORE),
    ``client_name``, ``heartbeat_ms``, ``request_timeout_s``, ``unavailable_timeout_s``,
    ``curve``, ``transport_factory``, ``limits``, ``admin_token``, ``admin_token_file``,
    ``xvocab``, ``adapter`` (the named adapter every SCORE asks for; docs/protocol.md,
    "Adapters").
    """

    def __init__(self, endpoint: str, **settings: Any):
        self._table = PendingTable()
        self._link = Link(LinkSettings(endpoint, **settings), self._table)

    # ----------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> TeacherClient:
        await self._link.__aenter__()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool | None:
        return await self._link.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Close the connection; pending requests fail with :class:`TeacherUnavailable`."""
        await self._link.aclose()

    @property
    def endpoint(self) -> str:
        return self._link.endpoint

    @property
    def hello(self) -> HelloOk | None:
        return self._link.hello

    @property
    def counters(self) -> dict[str, int]:
        """sent, received, stale_dropped, retries, reconnects, bytes_sent,
        bytes_received (all frames, resends and PINGs included), malformed (top-k ids
        outside the vocabulary among them: dropped, a TeacherError), nonfinite_replies
        (SCORE_OKs holding a forbidden NaN/inf: dropped, a TeacherError),
        late_control_replies."""
        return self._table.counters()

    @property
    def bound(self) -> Identity | None:
        return self._table.bound

    @property
    def connected(self) -> bool:
        """The link is up: handshake validated, no heartbeat missed past the limit."""
        return self._link.up

    # ----------------------------------------------------------------- scoring
    async def connect(self, timeout_s: float | None = None) -> HelloOk | None:
        """Open the link and handshake; returns the validated ``HELLO_OK``.

        Raises :class:`TokenizerMismatch` (fatal) or :class:`TeacherUnavailable`.
        """
        return await self._link.connect(timeout_s)

    def set_version(self, version: int, lag: int = 0) -> None:
        """Set the student's current parameter version and the lag replies may have.

        Pending requests that fall outside the lag can never be accepted and are
        failed with :class:`StaleTargetError` (their late replies count as stale).
        """
        self._table.set_version(version, lag)

    async def bind(self) -> Identity:
        """Tie the current update to the teacher ``(instance, gen)`` now connected.

        Requests bound to an earlier teacher are dropped (their replies count as stale).
        """
        identity = await self._link.settled_identity()
        self._table.bind(identity, retargeting=self._link.retargeting)
        return identity

    def unbind(self) -> None:
        """Stop requiring a particular teacher for new requests."""
        self._table.unbind()

    async def submit(self, tokens_N: Any, cu_seqlens_B1: Any, positions_P: Any, *,
                     kind: Kind = "topk", k: int = 16, temperature: float = 1.0,
                     deadline_ms: int | None = None, deterministic: bool = False) -> int:
        """Queue one SCORE for the current version and binding; returns its id.

        Arrays are checked here, once, before anything is sent (:class:`ProtocolError`
        for a bad request; ``checks.validate_score`` against the negotiated limits).
        ``deterministic`` asks the teacher to score it alone (bit-reproducible replies).
        """
        link = self._link
        link.require_started()
        link.raise_fatal()
        if link.tokenizer_fp is None:
            raise ProtocolError("this client has no tokenizer_fp (admin only); it cannot SCORE")
        if kind == "xvocab":
            raise ProtocolError("an xvocab SCORE carries an episode, not token ids; "
                                "use submit_xvocab")
        _check_temperature(temperature)
        arrays = {
            "tokens": _int32(tokens_N, "tokens_N"),
            "cu_seqlens": _int32(cu_seqlens_B1, "cu_seqlens_B1"),
            "positions": _int32(positions_P, "positions_P"),
        }
        rid = self._table.new_id()
        msg = Score(
            id=rid,
            student_version=self._table.version,
            kind=kind,
            k=k if kind == "topk" else 0,
            temperature=temperature,
            deadline_ms=deadline_ms,
            deterministic=deterministic,
            adapter=link.settings.adapter,
        )
        hello = link.hello
        if hello is not None and (hello.tokenizer_fp, hello.vocab_size) != (
                link.tokenizer_fp, link.vocab_size):
            raise ProtocolError(
                f"the teacher's tokenizer {hello.tokenizer_fp} is not this client's "
                f"{link.tokenizer_fp}: its {kind} targets would index another vocabulary; "
                "ask for kind='xvocab' (submit_xvocab)")
        validate_score(msg, arrays, link.vocab_size, link.limits)
        self._table.file_score(encode(msg, arrays), rid=rid, kind=msg.kind, k=msg.k,
                               positions=len(arrays["positions"]))
        await link.pump()
        return rid

    async def submit_xvocab(self, episode: Any, student_cuts: Any, student_pieces: Any, *,
                            k: int = 16, temperature: float = 1.0,
                            deadline_ms: int | None = None,
                            deterministic: bool = False) -> int:
        """Queue one xvocab SCORE (docs/protocol.md, "xvocab"); returns its id.

        ``episode`` is ``xvocab.episode_bytes(messages, tools, text)`` (``u1``),
        ``student_cuts`` the byte cuts ``[T+1]`` of the student's tokens over ``text``,
        ``student_pieces`` ``[C, 3]`` (start, end, offset) of each content in it
        (``common/alignment.py``'s ``Rendering``). The connection must have negotiated
        the kind (``LinkSettings.xvocab`` and the teacher's HELLO_OK).
        """
        link = self._link
        link.require_started()
        link.raise_fatal()
        if not link.settings.xvocab:
            raise ProtocolError("this client did not announce xvocab in HELLO; make it with "
                                "xvocab=True")
        _check_temperature(temperature)
        arrays = {
            "episode": np.ascontiguousarray(episode, dtype=np.uint8).reshape(-1),
            "student_cuts": _int32(student_cuts, "student_cuts"),
            "student_pieces": np.asarray(student_pieces, dtype=np.int32).reshape(-1, 3),
        }
        rid = self._table.new_id()
        msg = Score(id=rid, student_version=self._table.version, kind="xvocab", k=k,
                    temperature=temperature, deadline_ms=deadline_ms,
                    deterministic=deterministic, adapter=link.settings.adapter)
        validate_score(msg, arrays, link.vocab_size, link.limits)
        self._table.file_score(encode(msg, arrays), rid=rid, kind="xvocab", k=k,
                               positions=len(arrays["student_cuts"]) - 1,
                               digest=request_digest(arrays))
        await link.pump()
        return rid

    def forget(self, ids: Iterable[int]) -> None:
        """Drop these SCOREs' rows: never sent again, a late reply counts as stale."""
        for rid in ids:
            self._table.take(rid)

    async def wait(
        self, ids: Iterable[int], timeout_s: float | None = None
    ) -> dict[int, ScoreResult]:
        """Wait until every id has an accepted reply; returns ``{id: ScoreResult}``.

        Raises :class:`TeacherChanged`, :class:`TeacherError` (a non-retryable ERROR),
        :class:`StaleTargetError`, :class:`TokenizerMismatch`,
        :class:`TeacherUnavailable`, or :class:`ScoreTimeout` after ``timeout_s``.
        """
        return await self._table.collect(ids, timeout_s, tick=self._link.tick,
                                         raise_fatal=self._link.raise_fatal)

    async def score(self, tokens_N: Any, cu_seqlens_B1: Any, positions_P: Any, **kw: Any):
        """``submit`` then ``wait`` for one request."""
        rid = await self.submit(tokens_N, cu_seqlens_B1, positions_P, **kw)
        return (await self.wait([rid]))[rid]

    async def retarget(self, endpoint: str) -> HelloOk:
        """Handshake with ``endpoint``; only if it validates, switch this client to it."""
        link = self._link
        link.require_started()
        # The probe shares this client's settings and socket factory; only the endpoint differs.
        settings = replace(link.settings, endpoint=endpoint, transport_factory=link.factory)
        async with TeacherClient(**vars(settings)) as probe:
            await probe.connect()
        return await link.switch(endpoint)

    # ----------------------------------------------------------------- admin
    async def ping(self) -> Pong:
        return await self._link.call(Ping(id=self._table.new_id()))

    async def status(self) -> dict[str, Any]:
        reply = await self._link.call(StatusMsg(id=self._table.new_id()))
        return reply.model_dump(mode="json")

    def _auth(self) -> str | None:
        """The admin token admin messages carry (``auth``): the setting, else the file
        it names (re-read: a restarted teacher writes a new one), else the file a teacher
        at this endpoint writes by default; None over CURVE (the key is the proof)."""
        settings = self._link.settings
        if settings.admin_token is not None:
            return settings.admin_token
        found: str | os.PathLike | None = settings.admin_token_file
        if found is None and settings.curve is None:
            found = default_admin_token_file(self._link.endpoint)
        return read_admin_token(found) if found is not None else None

    async def park(self) -> ParkOk:
        return await self._link.call(ParkMsg(id=self._table.new_id(), auth=self._auth()))

    async def wake(self) -> WakeOk:
        return await self._link.call(WakeMsg(id=self._table.new_id(), auth=self._auth()))

    async def reload(
        self,
        model: str,
        revision: str | None = None,
        adapter: str | None = None,
        mode: Mode = "drain",
        timeout_s: float = 600.0,
        adapter_revision: str | None = None,
    ) -> ReloadOk:
        msg = Reload(id=self._table.new_id(), model=model, revision=revision, adapter=adapter,
                     adapter_revision=adapter_revision, mode=mode, auth=self._auth())
        return await self._link.call(msg, timeout_s=timeout_s)

    async def shutdown(self, mode: Mode = "drain", timeout_s: float | None = None) -> ShutdownOk:
        msg = Shutdown(id=self._table.new_id(), mode=mode, timeout_s=timeout_s,
                       auth=self._auth())
        wait_s = max(self._link.request_timeout_s, (timeout_s or 0.0) + self._link.request_timeout_s)
        return await self._link.call(msg, timeout_s=wait_s)


def _int32(value: Any, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ProtocolError(f"{name} must be a 1-D integer array, got {arr.dtype}{list(arr.shape)}")
    if arr.size and (int(arr.min()) < -(2**31) or int(arr.max()) >= 2**31):
        raise ProtocolError(f"{name} holds values outside int32")
    return arr.astype("<i4", copy=False)
