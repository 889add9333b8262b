"""Fake teachers: one that speaks ``mvl-score/1`` in memory, one with no wire at all.

:class:`FakeTeacher` answers what a client sends the way docs/protocol.md says a
teacher does — ``HELLO`` (checking the tokenizer), ``SCORE`` (``NEED_HELLO`` before a
``HELLO``), ``PING``, ``STATUS``, ``PARK``, ``WAKE``, ``RELOAD`` (``gen`` + 1) and
``SHUTDOWN`` — with every message encoded and decoded by the real codec, so the client
under test runs exactly its production code. What it does with each ``SCORE`` is
scripted with the steps of ``script.py`` (late, failing, lost, held, duplicated, stale
or foreign replies); given a ``tokenizer``, it serves ``xvocab`` to a client that
announces it, planned as the server plans it (``teacher_server/xvocab.py``). Between
requests a test may :meth:`~FakeTeacher.restart` it (a
new process at the same endpoint), :meth:`~FakeTeacher.reload` it, or make it
``silent`` (a hung teacher: nothing is answered, ``PING`` included).

Connect a client with ``transport_factory=teacher.transport_factory``, or get one
with :meth:`FakeTeacher.client`. The teacher's state may be changed from the test's
thread while the client runs on its own (the ``SyncTeacherClient`` case).

:class:`FakeTeacherClient` is the other fake: an in-process
:class:`~miniverl.protocol.scoring_client.ScoringClient` (the methods of
``SyncTeacherClient``, no messages, no sockets) that scores a torch model with
``teacher_server.scoring.score_positions``, the function the served teacher runs, so a
trainer under test sees real targets. It applies the client's staleness rule
(``protocol/pending.py``, ``accept_reply``) to its own pending requests and to replies a
test queues in ``injected`` (wrong version, unknown id, old generation), and counts what
it drops. miniverl's own trainer tests run on it.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from miniverl.common.errors import ProtocolError, TeacherUnavailable
from miniverl.protocol import messages as m
from miniverl.protocol.checks import check_score
from miniverl.protocol.client import TeacherClient
from miniverl.protocol.codec import decode, decode_header_only, encode
from miniverl.protocol.limits import Limits
from miniverl.protocol.pending import RETRYABLE_CODES, Pending, accept_reply
from miniverl.protocol.scoring_client import (
    Identity,
    ScoreResult,
    ScoreTimeout,
    StopRequested,
    TeacherChanged,
)
from miniverl.protocol.sync_client import SyncTeacherClient
from miniverl.protocol.xvocab import parse_xvocab_score
from miniverl.teacher_server.backend import BackendError, ScoreJob
from miniverl.teacher_server.scoring import score_positions
from miniverl.teacher_server.xvocab import plan_xvocab
from miniverl.testing.backends import FAKE_TOKENIZER_FP, FAKE_VOCAB, job_targets
from miniverl.testing.memory import MemoryTransport
from miniverl.testing.script import Received, Step, answer

FAST_SETTINGS: dict[str, Any] = {
    "heartbeat_ms": 50,
    "request_timeout_s": 0.5,
    "unavailable_timeout_s": 5.0,
}
"""Client timings for tests: a lost request is resent after 0.5 s, a silent teacher is
reconnected after three 50 ms heartbeats and declared unavailable after 5 s."""

Scorer = Callable[[ScoreJob], "dict[str, np.ndarray] | BackendError"]


class FakeTeacher:
    """An in-memory teacher; see the module docstring and ``docs/testing.md``.

    ``scorer(job) -> arrays`` computes honest replies (default: ``next_token_targets``);
    it may return a ``BackendError`` to answer that request with an ``ERROR``.
    Recorded: ``log`` (every decoded message received), ``scores`` (the ``SCORE`` s),
    ``held`` (requests kept by :func:`~miniverl.testing.script.hold`), ``transports``
    (every connection opened; a reconnect adds one).
    """

    def __init__(
        self,
        *,
        tokenizer_fp: str = FAKE_TOKENIZER_FP,
        vocab_size: int = FAKE_VOCAB,
        instance: str = "teacher-A",
        name: str = "fake",
        model: str = "fake/model",
        scorer: Scorer | None = None,
        k_max: int = 64,
        exact_max_vocab: int = 1024,
        max_tokens: int = 4096,
        max_positions: int = 4096,
        max_inflight: int = 8,
        heartbeat_ms: int = 1000,
        admin_token: str | None = None,
        endpoint: str = "inproc://fake-teacher",
        tokenizer: Any = None,
    ):
        self.tokenizer_fp, self.vocab_size = tokenizer_fp, vocab_size
        # A fast tokenizer with a chat template: the teacher then serves xvocab
        # (docs/protocol.md, "xvocab") to a client that announces it, over its ids.
        self.tokenizer = tokenizer
        self.instance, self.gen, self.name, self.model = instance, 0, name, model
        self.scorer = scorer
        # Advertised in HELLO_OK; the size limits are enforced on SCORE, as a teacher does.
        self.limits = Limits(max_k=k_max, max_exact_vocab=exact_max_vocab, max_tokens=max_tokens,
                             max_positions=max_positions, max_inflight=max_inflight)
        self.heartbeat_ms = heartbeat_ms
        self.admin_token = admin_token
        self.endpoint = endpoint
        self.state = m.TeacherState.READY
        self.silent = False  # a hung teacher: nothing is answered, PING included
        self.hello_error: m.ErrorCode | None = None  # answer every HELLO with this ERROR
        # False: HELLO_OK whatever tokenizer the client names (a teacher that does not
        # check), so a test can see the client's own check refuse it.
        self.checks_tokenizer = True
        self.default: Step = answer()
        self.log: list[m.Message] = []
        self.scores: list[m.Score] = []
        self.held: list[Received] = []
        self.transports: list[MemoryTransport] = []
        self._known: set[int] = set()  # id() of connections that said HELLO to this instance
        self._xvocab: dict[int, bool] = {}  # negotiated xvocab: id(conn) -> other tokenizer
        self._script: deque[Step] = deque()
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- connecting
    def transport_factory(self, endpoint: str) -> MemoryTransport:
        """Open a connection to this teacher (pass as ``transport_factory=``)."""
        conn = MemoryTransport(self, endpoint)
        with self._lock:
            self.transports.append(conn)
        return conn

    def client(self, endpoint: str | None = None, **settings: Any) -> SyncTeacherClient:
        """A blocking client of this teacher with :data:`FAST_SETTINGS` (not yet connected:
        ``with teacher.client() as client:`` connects); ``settings`` override them."""
        return SyncTeacherClient(endpoint or self.endpoint, **self._settings(settings))

    def async_client(self, endpoint: str | None = None, **settings: Any) -> TeacherClient:
        """An async client of this teacher (``async with teacher.async_client() as c:``)."""
        return TeacherClient(endpoint or self.endpoint, **self._settings(settings))

    def _settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        return {"tokenizer_fp": self.tokenizer_fp, "vocab_size": self.vocab_size,
                "transport_factory": self.transport_factory, **FAST_SETTINGS, **settings}

    # ----------------------------------------------------------------- scripting
    def script(self, *steps: Step) -> None:
        """Queue ``steps`` for the next ``SCORE`` s, one each (resends count)."""
        with self._lock:
            self._script.extend(steps)

    @property
    def scripted(self) -> int:
        """Steps still queued."""
        return len(self._script)

    def restart(self, instance: str | None = None) -> None:
        """A new process at the same endpoint: new ``instance``, ``gen`` 0, every client
        forgotten (their next ``SCORE`` gets ``NEED_HELLO``), held requests lost."""
        with self._lock:
            self.instance = instance or _next_instance(self.instance)
            self.gen, self.state = 0, m.TeacherState.READY
            self._known.clear()
            self.held.clear()

    def forget(self) -> None:
        """Forget every client's ``HELLO`` (their next ``SCORE`` gets ``NEED_HELLO``)."""
        with self._lock:
            self._known.clear()

    def reload(self, model: str | None = None) -> int:
        """Reload in place: ``gen`` + 1 (and the model name); returns the new ``gen``."""
        with self._lock:
            self.gen += 1
            self.model = model or self.model
            return self.gen

    def release(self, step: Step | None = None, *, reverse: bool = False) -> int:
        """Answer the held requests with ``step`` (default :func:`answer`), oldest first or
        ``reverse``; returns how many were released."""
        with self._lock:
            held, self.held = self.held, []
            for request in reversed(held) if reverse else held:
                (step or answer())(self, request)
            return len(held)

    def count(self, t: str) -> int:
        """How many messages of type ``t`` (``"SCORE"``, ``"HELLO"``...) were received."""
        return sum(1 for msg in self.log if msg.t == t)

    # ----------------------------------------------------------------- replies
    def send(self, conn: MemoryTransport, frames: list, delay_s: float = 0.0) -> None:
        """Send ``frames`` to ``conn`` (after ``delay_s``); what every step ends in."""
        conn.deliver(frames, delay_s)

    def targets(self, request: Received, scorer: Scorer | None = None) -> dict | BackendError:
        """The arrays an honest reply to ``request`` carries (or the scorer's error); an
        xvocab request is planned as the server plans it (``teacher_server/xvocab.py``)
        and scored as the top-k job over the teacher's own tokens it becomes."""
        msg, arrays = request.msg, request.arrays
        plan = None
        if msg.kind == "xvocab":
            plan = plan_xvocab(self.tokenizer, parse_xvocab_score(msg, arrays), arrays)
            n = plan.teacher_ids.shape[0]
            arrays = {"tokens": plan.teacher_ids, "cu_seqlens": np.array([0, n], np.int32),
                      "positions": plan.positions}
        job = ScoreJob(tokens_N=arrays["tokens"], cu_seqlens_B1=arrays["cu_seqlens"],
                       positions_P=arrays["positions"],
                       kind="topk" if plan is not None else msg.kind, k=msg.k,
                       temperature=msg.temperature, id=msg.id,
                       student_version=msg.student_version, deterministic=msg.deterministic,
                       xvocab=plan)
        scorer = scorer or self.scorer
        out = scorer(job) if scorer is not None else job_targets(job, self.vocab_size)
        if plan is None or isinstance(out, BackendError):
            return out
        return {"teacher_ids": plan.teacher_ids, "groups": plan.groups,
                "positions": plan.positions, **{name: out[name] for name in m.TOPK_ARRAYS},
                "episode_sha256": plan.episode_sha256, "alignment_sha256": plan.alignment_sha256}

    def reply(self, request: Received, scorer: Scorer | None = None, **header: Any) -> list:
        """The frames of the honest ``SCORE_OK`` to ``request`` (``header`` overrides fields)."""
        out = self.targets(request, scorer)
        msg = request.msg
        if isinstance(out, BackendError):
            return self.error(msg.id, out.code, retryable=out.retryable, message=str(out))
        fields = dict(id=msg.id, student_version=msg.student_version, instance=self.instance,
                      gen=self.gen, kind=msg.kind, k=msg.k,
                      timing={"queue_ms": 0.0, "compute_ms": 0.0})
        if msg.kind == "xvocab":
            fields.update(episode_sha256=out.pop("episode_sha256"),
                          alignment_sha256=out.pop("alignment_sha256"))
        fields.update(header)
        names = {"topk": m.TOPK_ARRAYS, "exact": m.EXACT_ARRAYS,
                 "xvocab": m.XVOCAB_ARRAYS}[msg.kind]
        return encode(m.ScoreOk(**fields), {name: out[name] for name in names})

    def error(self, rid: int | None, code: m.ErrorCode | str, *, retryable: bool | None = None,
              message: str | None = None) -> list:
        """The frames of an ``ERROR`` for request ``rid``."""
        code = m.ErrorCode(code)
        if retryable is None:
            retryable = code in RETRYABLE_CODES or code == m.ErrorCode.NEED_HELLO
        return encode(m.ErrorReply(id=rid, ref_id=rid, code=code, retryable=retryable,
                                   message=message or f"fake teacher: {code.value}",
                                   instance=self.instance, gen=self.gen))

    def teacher_info(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "revision": None}

    def liveness(self) -> dict[str, Any]:
        """The fields ``PONG`` and ``STATUS_OK`` share."""
        return dict(instance=self.instance, gen=self.gen, state=self.state, inflight=len(self.held),
                    queue_depth=0, last_progress_ms=0.0)

    def hello_ok(self, rid: int, xvocab: bool = False) -> list:
        return encode(m.HelloOk(id=rid, teacher=self.teacher_info(), instance=self.instance,
                                gen=self.gen, tokenizer_fp=self.tokenizer_fp,
                                vocab_size=self.vocab_size, kinds=self._kinds(xvocab),
                                limits={"max_tokens": self.limits.max_tokens,
                                        "max_positions": self.limits.max_positions,
                                        "max_inflight": self.limits.max_inflight},
                                heartbeat_ms=self.heartbeat_ms, server_version="fake-teacher/1"))

    def _kinds(self, xvocab: bool = False) -> dict[str, Any]:
        lim = self.limits
        served = self.vocab_size <= lim.max_exact_vocab
        exact = {"max_vocab": lim.max_exact_vocab} if served else None
        kinds = {"topk": {"k_max": min(lim.max_k, self.vocab_size)}, "exact": exact}
        if xvocab:
            kinds["xvocab"] = {"k_max": min(lim.max_k, self.vocab_size),
                               "max_episode_bytes": lim.max_episode_bytes}
        return kinds

    # ----------------------------------------------------------------- receiving
    def receive(self, conn: MemoryTransport, frames: list[bytes]) -> None:
        """One message from ``conn`` (the :class:`~miniverl.testing.memory.Peer` side)."""
        with self._lock:
            try:
                msg, arrays = decode(frames, self.limits)
            except m.ProtocolViolation as exc:
                try:
                    decode_header_only(frames[0], self.limits)
                except (m.ProtocolViolation, IndexError):
                    return  # no header parses: dropped, as a teacher does
                if not self.silent:
                    self.send(conn, self.error(exc.ref_id, exc.code, message=str(exc)))
                return
            self.log.append(msg)
            if self.silent:
                return
            self._answer(conn, msg, arrays)

    def disconnect(self, conn: MemoryTransport) -> None:
        with self._lock:
            self._known.discard(id(conn))
            self._xvocab.pop(id(conn), None)

    def _answer(self, conn: MemoryTransport, msg: m.Message, arrays: dict) -> None:
        if isinstance(msg, m.Hello):
            other = (msg.tokenizer_fp, msg.vocab_size) != (self.tokenizer_fp, self.vocab_size)
            xvocab = "xvocab" in (msg.understands or ()) and self.tokenizer is not None
            if self.hello_error is not None:
                self.send(conn, self.error(msg.id, self.hello_error))
            elif self.checks_tokenizer and other and not xvocab:
                self.send(conn, self.error(msg.id, m.ErrorCode.TOKENIZER_MISMATCH, message=(
                    f"tokenizer mismatch: client has {msg.tokenizer_fp} (V={msg.vocab_size}), "
                    f"teacher has {self.tokenizer_fp} (V={self.vocab_size})")))
            else:
                self._known.add(id(conn))
                if xvocab:
                    self._xvocab[id(conn)] = other
                else:
                    self._xvocab.pop(id(conn), None)
                self.send(conn, self.hello_ok(msg.id, xvocab))
        elif isinstance(msg, m.Score):
            self._on_score(conn, msg, arrays)
        elif isinstance(msg, m.Ping):
            self.send(conn, encode(m.Pong(id=msg.id, **self.liveness())))
        elif isinstance(msg, m.Status):
            self.send(conn, encode(m.StatusOk(id=msg.id, teacher=self.teacher_info(),
                                              **self.liveness())))
        elif isinstance(msg, m.AdminRequest):
            self._on_admin(conn, msg)
        else:
            self.send(conn, self.error(msg.id, m.ErrorCode.BAD_REQUEST,
                                       message=f"{msg.t} is not a request a teacher accepts"))

    def _on_score(self, conn: MemoryTransport, msg: m.Score, arrays: dict) -> None:
        self.scores.append(msg)
        if id(conn) not in self._known:
            self.send(conn, self.error(msg.id, m.ErrorCode.NEED_HELLO))
            return
        if msg.kind == "xvocab" and id(conn) not in self._xvocab:
            self.send(conn, self.error(msg.id, m.ErrorCode.UNSUPPORTED, message=(
                "kind 'xvocab' was not negotiated on this connection")))
            return
        if msg.kind != "xvocab" and self._xvocab.get(id(conn)):
            self.send(conn, self.error(msg.id, m.ErrorCode.UNSUPPORTED, message=(
                f"this client's tokenizer is not the teacher's; ask for kind 'xvocab', not "
                f"{msg.kind}")))
            return
        try:
            check_score(msg, arrays, self.vocab_size, self.limits)  # decode did the sizes
            if msg.kind == "xvocab":  # what the server checks before it queues one
                plan_xvocab(self.tokenizer, parse_xvocab_score(msg, arrays), arrays)
        except m.ProtocolViolation as exc:
            self.send(conn, self.error(msg.id, exc.code, message=str(exc)))
            return
        except Exception as exc:  # as the server: a template's own error too
            self.send(conn, self.error(msg.id, m.ErrorCode.BAD_REQUEST, message=(
                f"the xvocab episode cannot be aligned: {exc}"[:2000])))
            return
        step = self._script.popleft() if self._script else self.default
        step(self, Received(conn, msg, arrays))

    def _on_admin(self, conn: MemoryTransport, msg: m.AdminRequest) -> None:
        if self.admin_token is not None and msg.auth != self.admin_token:
            self.send(conn, self.error(msg.id, m.ErrorCode.UNAUTHORIZED, message=(
                f"{msg.t} needs the teacher's admin token; nothing was changed")))
            return
        if isinstance(msg, m.Park):
            self.state = m.TeacherState.PARKED
            reply: m.Message = m.ParkOk(id=msg.id, state=self.state)
        elif isinstance(msg, m.Wake):
            self.state = m.TeacherState.READY
            reply = m.WakeOk(id=msg.id, state=self.state)
        elif isinstance(msg, m.Reload):
            self.reload(msg.model)
            reply = m.ReloadOk(id=msg.id, gen=self.gen, teacher=self.teacher_info())
        else:  # SHUTDOWN: answered, then nothing more
            reply = m.ShutdownOk(id=msg.id)
            self.state = m.TeacherState.DRAINING
        self.send(conn, encode(reply))
        if isinstance(msg, m.Shutdown):
            self.silent = True


def _next_instance(instance: str) -> str:
    """``teacher-A`` → ``teacher-B`` (else a suffix): readable names for restarts."""
    stem, _, last = instance.rpartition("-")
    if stem and len(last) == 1 and "A" <= last < "Z":
        return f"{stem}-{chr(ord(last) + 1)}"
    return f"{instance}-restarted"


@dataclass
class FakeTeacherClient:
    """An in-process teacher client over a torch ``model`` (see the module docstring).

    Test hooks: ``scored_versions`` (the student version of every ``submit``, in order),
    ``reload_before_next_wait`` (the next :meth:`wait` meets a reload: ``gen`` + 1 and
    :class:`TeacherChanged`, as the real client raises it), ``injected`` (replies the
    next :meth:`wait` receives before its own; each is dropped unless the staleness rule
    accepts it, and counted in ``stale_dropped``).
    """

    model: Any
    tokenizer_fp: str
    vocab_size: int
    name: str = "toy-teacher"
    exact_max_vocab: int = 1 << 20
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)
    gen: int = 0
    counters: dict[str, int] = field(
        default_factory=lambda: dict(sent=0, received=0, stale_dropped=0, retries=0,
                                     reconnects=0, bytes_sent=0, bytes_received=0)
    )
    scored_versions: list[int] = field(default_factory=list)
    reload_before_next_wait: bool = False
    injected: list[ScoreResult] = field(default_factory=list)
    # The teacher's fast tokenizer with a chat template: it then serves xvocab
    # (:meth:`submit_xvocab`) to a student with another tokenizer.
    tokenizer: Any = None
    # False: the teacher is down (a test's kill): bind() and wait() raise
    # TeacherUnavailable, as the real client does once the link is down.
    connected: bool = True

    def __post_init__(self) -> None:
        self._kind_of: dict[int, str] = {}
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, Identity, dict[str, np.ndarray]]] = {}
        self._version = 0
        self._lag = 0
        self._bound: Identity | None = None
        self._stopped: str | None = None

    @property
    def hello(self) -> m.HelloOk:
        return m.HelloOk(
            id=0, teacher={"name": self.name, "model": "toy"}, instance=self.instance,
            gen=self.gen, tokenizer_fp=self.tokenizer_fp, vocab_size=self.vocab_size,
            kinds={"topk": {"k_max": self.vocab_size},
                   "exact": {"max_vocab": self.exact_max_vocab},
                   **({"xvocab": {"k_max": self.vocab_size, "max_episode_bytes": 1 << 20}}
                      if self.tokenizer is not None else {})},
            limits={"max_tokens": 1 << 20, "max_positions": 1 << 20, "max_inflight": 64},
            heartbeat_ms=1000, server_version="fake/1",
        )

    def connect(self, timeout_s: float | None = None) -> m.HelloOk:
        return self.hello

    def connect_soon(self, timeout_s: float | None = None) -> Future:
        """:meth:`connect`, already done (an in-process teacher answers at once)."""
        future: Future = Future()
        future.set_result(self.connect(timeout_s))
        return future

    def set_version(self, version: int, lag: int = 0) -> None:
        self._version, self._lag = version, lag

    def bind(self) -> Identity:
        if not self.connected:
            raise TeacherUnavailable(f"fake teacher {self.name} is down")
        self._bound = (self.instance, self.gen)
        return self._bound

    def submit(self, tokens_N: Any, cu_seqlens_B1: Any, positions_P: Any, *,
               kind: str = "topk", k: int = 16, temperature: float = 1.0,
               deadline_ms: int | None = None, deterministic: bool = False) -> int:
        # deterministic: in process, every request is scored alone anyway
        rid = next(self._ids)
        arrays = score_positions(self.model, tokens_N, cu_seqlens_B1, positions_P, kind=kind,
                                 k=k, temperature=temperature,
                                 exact_max_vocab=self.exact_max_vocab)
        self._pending[rid] = (self._version, (self.instance, self.gen), arrays)
        self.counters["sent"] += 1
        self.counters["bytes_sent"] += int(np.asarray(tokens_N).nbytes
                                           + np.asarray(positions_P).nbytes)
        self.scored_versions.append(self._version)
        return rid

    def submit_xvocab(self, episode: Any, student_cuts: Any, student_pieces: Any, *,
                      k: int = 16, temperature: float = 1.0, deadline_ms: int | None = None,
                      deterministic: bool = False) -> int:
        """An xvocab request (docs/protocol.md, "xvocab"), planned as the teacher server
        plans it and scored with ``score_positions`` over the teacher's own tokens."""
        if self.tokenizer is None:
            raise ProtocolError("this FakeTeacherClient has no tokenizer: it serves no xvocab")
        request = {"episode": np.ascontiguousarray(episode, dtype=np.uint8).reshape(-1),
                   "student_cuts": np.asarray(student_cuts, dtype=np.int32),
                   "student_pieces": np.asarray(student_pieces, dtype=np.int32).reshape(-1, 3)}
        header = m.Score(id=0, student_version=self._version, kind="xvocab", k=k,
                         temperature=temperature)
        plan = plan_xvocab(self.tokenizer, parse_xvocab_score(header, request), request)
        n = plan.teacher_ids.shape[0]
        scored = score_positions(self.model, plan.teacher_ids, np.array([0, n], np.int32),
                                 plan.positions, kind="topk", k=k, temperature=temperature,
                                 exact_max_vocab=self.exact_max_vocab)
        arrays = {"teacher_ids": plan.teacher_ids, "groups": plan.groups,
                  "positions": plan.positions, **scored}
        rid = next(self._ids)
        self._pending[rid] = (self._version, (self.instance, self.gen), arrays)
        self._kind_of[rid] = "xvocab"
        self.counters["sent"] += 1
        self.counters["bytes_sent"] += sum(a.nbytes for a in request.values())
        self.scored_versions.append(self._version)
        return rid

    def _accepted(self, rid: int, result: ScoreResult) -> bool:
        """The real client's rule, applied to this fake's pending requests."""
        version, identity, _ = self._pending.get(rid, (None, None, None))
        entry = None if version is None else Pending(version, identity)
        return accept_reply(entry, result, current_version=self._version, lag=self._lag,
                            bound_teacher=self._bound) is None

    def wait(self, ids: Iterable[int], timeout_s: float | None = None) -> dict[int, ScoreResult]:
        if self._stopped is not None:
            raise StopRequested(self._stopped)
        ids = list(ids)
        if not self.connected:  # no reply comes: the wait's own limit, else the link's
            if timeout_s is not None:
                raise ScoreTimeout(f"no accepted reply for ids {ids} within {timeout_s} s")
            raise TeacherUnavailable(f"fake teacher {self.name} is down")
        if self.reload_before_next_wait:
            self.reload_before_next_wait = False
            old = self._bound
            self.gen += 1
            raise TeacherChanged(old, (self.instance, self.gen), "reload")
        for bad in self.injected:
            if not self._accepted(bad.id, bad):
                self.counters["stale_dropped"] += 1
        self.injected.clear()
        out = {}
        for rid in ids:
            version, identity, arrays = self._pending[rid]
            kind = self._kind_of.pop(rid, "topk" if "ids" in arrays else "exact")
            result = ScoreResult(id=rid, student_version=version, instance=identity[0],
                                 gen=identity[1], kind=kind,
                                 k=arrays["ids"].shape[1] if "ids" in arrays else 0,
                                 arrays=arrays, timing={})
            if not self._accepted(rid, result):
                self.counters["stale_dropped"] += 1
                raise TeacherChanged(identity, (self.instance, self.gen), "reload")
            out[rid] = result
            self.counters["received"] += 1
            self.counters["bytes_received"] += sum(a.nbytes for a in arrays.values())
        for rid in ids:
            self._pending.pop(rid, None)
        return out

    def forget(self, ids: Iterable[int]) -> None:
        for rid in ids:
            self._pending.pop(rid, None)
            self._kind_of.pop(rid, None)

    def retarget(self, endpoint: str) -> m.HelloOk:
        self.instance = uuid.uuid4().hex
        self.gen = 0
        return self.hello

    def park(self) -> m.ParkOk:
        return m.ParkOk(id=0, state=m.TeacherState.PARKED)

    def wake(self) -> m.WakeOk:
        return m.WakeOk(id=0, state=m.TeacherState.READY)

    def interrupt(self, reason: str) -> None:
        """Every later :meth:`wait` raises ``StopRequested`` (nothing here blocks)."""
        self._stopped = reason

    def close(self) -> None:
        """Nothing to release: no connection was opened."""
