"""The student's side of scoring: one SCORE per trajectory, replies kept only if fresh.

An update is *bound* to one teacher ``(instance, gen)`` and one student version. Each
trajectory that should be trained on goes out as one ``SCORE`` as soon as it exists
(pipelined: while other episodes still sample). :meth:`TeacherLink.collect` waits for
the replies the client's staleness rule accepted. If the bound teacher disappears (a
restart gives a new ``instance``, a reload a new ``gen``), the client raises
``TeacherChanged``; the link then rebinds, records a ``teacher_changed`` event and
re-sends the whole update, so one update never mixes teacher generations. In a run of
one teacher, a teacher that refuses the update's SCOREs (a non-retryable ``ERROR``; an
engine's request that still fails after the client's retries) is waited out the same way: the update sends them again after a backoff, for up to
``runtime.unavailable_timeout_s`` (:class:`Patience`), and only then ends the run.

``Scored.student_version`` is the wire's ``student_version``: the version the targets
were requested for (the version that sampled the trajectory, or 0 for a fixed set).

The client is a :class:`~miniverl.protocol.scoring_client.ScoringClient`: the ZeroMQ
``SyncTeacherClient``, the HTTP ``EngineTeacherClient`` (a vLLM or SGLang server), or
the in-process ``FakeTeacherClient`` of ``miniverl.testing``.

What a trajectory's request holds is a strategy picked when the run connects
(``connect.py``): :class:`TeacherLink` sends the trajectory's own tokens;
:class:`PrivilegedLink` the privileged teacher's view of them (``teacher.mode:
privileged_context``, ``rollout/privileged.py``); ``xvocab.XvocabLink`` the
rendered messages of a teacher with another tokenizer. A plain run runs none of the
other two.
Its :meth:`~ScoringClient.wait` returns only replies its staleness rule accepted for the
version and teacher this update bound, so this module does not check them again.

This module does not compute losses, connect or qualify a teacher (``connect.py``) and
does not know how replies travel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn, Protocol

import numpy as np

from miniverl.common.errors import TeacherRefusing, TeacherUnavailable
from miniverl.common.teacher_routes import Route
from miniverl.common.trajectory import Trajectory
from miniverl.protocol.scoring_client import Identity, ScoringClient, TeacherChanged


@dataclass
class Scored:
    """A trajectory, the positions that were scored, and the accepted reply's arrays."""

    traj: Trajectory
    positions_P: np.ndarray
    arrays: dict[str, np.ndarray]
    student_version: int
    teacher: dict[str, Any]
    # The targets' kind, set by the link that scored them ("topk", "exact", "xvocab"): a
    # run of routed teachers of both tokenizers trains each by its own (by_kind.py).
    kind: str | None = None
    # What the teacher was shown (teacher.mode): a privileged view's targets are another
    # cache entry than the same teacher's of the plain episode (targets_entries.py).
    mode: str = "standard"


@dataclass
class _Job:
    traj: Trajectory
    positions_P: np.ndarray
    request_id: int | None = None


@dataclass(frozen=True)
class Patience:
    """How an update of a run of one teacher outlasts a teacher that refuses its SCOREs
    (docs/training.md, "A teacher that fails"): it sends them again after a backoff that
    doubles from ``first_s`` to ``most_s``, for up to ``budget_s`` from the first refusal
    (``runtime.unavailable_timeout_s``). ``event(name, **fields)`` records
    ``teacher_refusing`` at the first refusal and ``teacher_unavailable`` when the update
    gives up; ``stop`` set (a stop request) ends a backoff at once."""

    budget_s: float
    event: Callable[..., None]
    stop: threading.Event
    first_s: float = 0.25
    most_s: float = 2.0


@dataclass
class _Waiting:
    """One update's wait for a refusing teacher: its jobs, since when, the next backoff."""

    jobs: list[_Job]
    since: float
    delay_s: float
    resent: int = 0


class Link(Protocol):
    """What one update asks of its teacher link, whichever the run picked when it
    connected: the plain :class:`TeacherLink`, :class:`PrivilegedLink`,
    ``xvocab.XvocabLink`` (a teacher with another tokenizer) or
    ``routed.RoutedLink`` (several teachers, each route with one of the other three).

    :meth:`begin_update` binds the update to one student version (replies up to ``lag``
    versions older accepted) and the teacher now live; :meth:`submit` sends one episode
    with the positions it trains on; :meth:`collect` waits for the update's targets,
    one :class:`Scored` per episode it trains on, in the order they were submitted;
    ``wait_s`` is the seconds the last collect waited; :meth:`counters` the link's own
    counters beside its client's. ``keeps_positions``: every submitted episode comes
    back, with exactly the positions it was submitted with (a link that re-aligns
    positions, or may hold episodes back, says False; the early forward then waits)."""

    wait_s: float

    @property
    def keeps_positions(self) -> bool: ...

    def begin_update(self, version: int, lag: int = 0) -> None: ...

    def submit(self, traj: Trajectory, positions_P: np.ndarray) -> None: ...

    def collect(self) -> list[Scored]: ...

    def counters(self) -> dict[str, Any]: ...


def _not_connected(*_: object) -> NoReturn:
    """What a run asks of its teacher before ``connect.py`` has connected it."""
    raise RuntimeError("the teacher is not connected yet: teacher/connect.py connects it, "
                       "and binds the run's link, park and wake, before the first update")


class Unconnected:
    """The link of a run whose teacher has not connected yet (:class:`TeacherSide` until
    ``connect.py`` binds the real one): it counts nothing, and scoring through it is an
    error."""

    wait_s: float = 0.0
    keeps_positions: ClassVar[bool] = True

    def begin_update(self, version: int, lag: int = 0) -> None:
        _not_connected()

    def submit(self, traj: Trajectory, positions_P: np.ndarray) -> None:
        _not_connected()

    def collect(self) -> list[Scored]:
        _not_connected()

    def counters(self) -> dict[str, Any]:
        return {}


def teacher_identity(client: ScoringClient) -> dict[str, Any]:
    """``{name, model, revision, adapter_sha256, instance, gen}`` of the client's teacher."""
    hello = client.hello or _not_connected()
    return {**hello.teacher.model_dump(), "instance": hello.instance, "gen": int(hello.gen)}


@dataclass
class RouteSide:
    """One route's teacher (several teachers, ``routed.py``): where it is, its client and
    link, who it is, what it did."""

    route: Route
    endpoint: str | None
    client: ScoringClient | None = None
    link: TeacherLink | None = None
    identity: dict[str, Any] = field(default_factory=dict)
    pending_endpoint: str | None = None  # `teacher use NAME`, taken at an update boundary
    positions_scored: int = 0
    episodes: int = 0
    held_back: int = 0  # episodes played and not trained on: the teacher was down
    wait_s: float = 0.0

    def counters(self) -> dict[str, Any]:
        """The client's counters, the link's own (a teacher with another tokenizer:
        ``xvocab_sent``, ...) and what this route scored."""
        out: dict[str, Any] = dict(self.client.counters) if self.client is not None else {}
        if self.link is not None:
            out.update(self.link.counters())
        out.update(positions_scored=self.positions_scored, episodes=self.episodes,
                   held_back=self.held_back, wait_s=round(self.wait_s, 4))
        return out


@dataclass
class TeacherSide:
    """What a run knows about its teacher: the client (the real ``SyncTeacherClient``,
    made at connect, or one handed in, such as ``miniverl.testing.FakeTeacherClient``),
    where it is, the link an update scores through, who it is, how memory is shared
    (``connect.py`` changes it)."""

    client: ScoringClient | None = None
    endpoint: str | None = None
    link: Link = field(default_factory=Unconnected)  # bound by teacher.connect
    identity: dict[str, Any] = field(default_factory=dict)
    memory: str = "resident"
    # memory swap: move the teacher's weights off the device once an update's targets
    # are in, and back before the next update's scoring (teacher.py park / wake, bound
    # to the run when it connects).
    park: Callable[[], None] = _not_connected
    wake: Callable[[], None] = _not_connected
    # How to prove who we are: (CURVE secret key file, server public key file) for a
    # remote teacher (else the recipe's teacher.curve_*), and the admin token file that
    # lets swap PARK/WAKE (else the default beside the teacher's socket; teacher.py).
    curve: tuple[str, str] | None = None
    admin_token_file: str | None = None
    # A RETARGET asked for (control socket); teacher.apply_retarget takes it at the
    # next update boundary.
    pending_endpoint: str | None = None
    # Several teachers (docs/several-teachers.md): route name -> its RouteSide, each with
    # its own client and link; ``link`` is then a routed.RoutedLink. None: one teacher.
    routes: dict[str, RouteSide] | None = None

    @property
    def connected(self) -> bool:
        """Whether ``connect.py`` has bound the link an update scores through."""
        return not isinstance(self.link, Unconnected)

    def counters(self) -> dict[str, Any]:
        """The client's counters (sent, stale_dropped, bytes, ...) and the link's own
        (:meth:`TeacherLink.counters`); empty without a client."""
        out: dict[str, Any] = dict(self.client.counters) if self.client is not None else {}
        out.update(self.link.counters())
        return out


@dataclass
class TeacherLink:
    """Scores one update's trajectories through ``client``, bound to one version and
    one teacher ``(instance, gen)``: :meth:`begin_update`, :meth:`submit` per
    trajectory, :meth:`collect`."""

    mode: ClassVar[str] = "standard"  # what the teacher is shown: the episode's own tokens
    keeps_positions: ClassVar[bool] = True
    client: ScoringClient
    kind: str
    k: int
    temperature: float
    on_teacher_changed: Callable[[dict, int, str], None] | None = None
    # run.deterministic: ask the teacher to score each SCORE alone (never coalesced, no
    # prefix cache), so pipelined scoring gives the same bits however replies race.
    deterministic: bool = False
    # A run of one teacher: how an update outlasts a teacher that refuses its SCOREs
    # (connect.py sets it; None: a refusal is raised, and a routed run holds the route back).
    patience: Patience | None = None
    version: int = 0
    binding: Identity | None = None
    wait_s: float = 0.0
    _jobs: list[_Job] = field(default_factory=list)
    _waiting: _Waiting | None = None

    def __post_init__(self) -> None:
        # What every SCORE of this run adds to its request (the default is omitted).
        self._flags = {"deterministic": True} if self.deterministic else {}

    def begin_update(self, version: int, lag: int = 0) -> None:
        """Bind the next update to ``version`` and the teacher ``(instance, gen)`` now live."""
        self.version = version
        self.client.set_version(version, lag)
        previous, self.binding = self.binding, self.client.bind()
        if previous is not None and self.binding != previous and self.on_teacher_changed:
            # A reload or restart that lands between updates (while the student updates
            # or evaluates) drops no reply, so no TeacherChanged is raised; without this
            # the run never recorded it and the manifest named the old teacher.
            how = "reload" if self.binding[0] == previous[0] else "restart"
            self.on_teacher_changed(teacher_identity(self.client), version, how)
        self._jobs = []
        self.wait_s = 0.0

    def submit(self, traj: Trajectory, positions_P: np.ndarray) -> None:
        """Send one trajectory's positions now (the pipelined-scoring hook)."""
        job = _Job(traj, np.asarray(positions_P, dtype=np.int32))
        job.request_id = self._request(job) if len(job.positions_P) else None
        self._jobs.append(job)

    def collect(self, timeout_s: float | None = None) -> list[Scored]:
        """Wait for every submitted job, in the order they were submitted; rebind and
        re-send the update if the teacher changed. ``timeout_s``: raise ``ScoreTimeout``
        after it, the jobs kept for another call (a routed run polls each route)."""
        t0 = time.perf_counter()
        try:
            while True:
                ids = [j.request_id for j in self._jobs if j.request_id is not None]
                try:
                    replies: dict[Any, Any] = self.client.wait(ids, timeout_s) if ids else {}
                    break
                except (TeacherChanged, TeacherUnavailable) as failure:
                    self._recover(failure, timeout_s)
        finally:
            self.wait_s += time.perf_counter() - t0
        identity = teacher_identity(self.client)
        # A reply is accepted once, by the client; a job never sent has nothing to score.
        out = [self._scored(job, replies.get(job.request_id), identity) for job in self._jobs]
        self._jobs = []
        return out

    def _recover(self, failure: TeacherChanged | TeacherUnavailable,
                 timeout_s: float | None) -> None:
        """:meth:`collect`'s failure path: re-send the update's SCOREs after rebinding to a
        teacher that changed, or after a backoff while the teacher of a run of one
        refuses them (:meth:`_outlast`); anything else is raised again (a run of several
        teachers holds that route back, ``routed.py``)."""
        if isinstance(failure, TeacherChanged):
            self.binding = self.client.bind()
            if self.on_teacher_changed is not None:
                self.on_teacher_changed(teacher_identity(self.client), self.version, failure.how)
        else:
            self._outlast(failure, timeout_s)
        for job in self._jobs:
            job.request_id = self._request(job) if len(job.positions_P) else None

    def _outlast(self, failure: TeacherUnavailable, timeout_s: float | None) -> None:
        """Wait out one refusal of this update's SCOREs (``patience``: a run of one
        teacher, a wait without ``timeout_s``), their requests forgotten, so that
        :meth:`_recover` sends them again; or raise the failure that ends the run, in
        one line, once ``patience.budget_s`` has passed since the first refusal, or when
        the teacher is gone rather than refusing (the client has already waited
        ``unavailable_timeout_s`` for it)."""
        patience = self.patience
        if patience is None or timeout_s is not None:
            raise failure
        if not isinstance(failure, TeacherRefusing):
            patience.event("teacher_unavailable", why=str(failure), version=self.version)
            raise failure
        wait = self._waiting
        # One wait per update: begin_update and collect give each update its own list.
        if wait is None or wait.jobs is not self._jobs:
            wait = self._waiting = _Waiting(self._jobs, time.monotonic(), patience.first_s)
            patience.event("teacher_refusing", why=str(failure), version=self.version,
                           episodes=len(self._jobs), budget_s=patience.budget_s)
        waited = time.monotonic() - wait.since
        if waited + wait.delay_s > patience.budget_s:
            patience.event("teacher_unavailable", why=str(failure), version=self.version,
                           waited_s=round(waited, 3), resent=wait.resent)
            raise TeacherRefusing(
                f"the teacher refused this update's SCOREs for {waited:.1f} s "
                f"({wait.resent} re-sends, runtime.unavailable_timeout_s="
                f"{patience.budget_s:g}; last: {' '.join(str(failure).split())}); check it "
                "with `miniverl teacher status ENDPOINT` (an engine: its server's log), then "
                "continue the run with `miniverl up RECIPE --resume --run-id ID` (--teacher "
                "ENDPOINT for another)") from None
        self.client.forget([j.request_id for j in self._jobs if j.request_id is not None])
        patience.stop.wait(wait.delay_s)
        wait.resent += 1
        wait.delay_s = min(2 * wait.delay_s, patience.most_s)

    def hold_back(self) -> list[Trajectory]:
        """Give up this update's jobs (their teacher is down): the client forgets their
        requests, so none is sent again to a restarted teacher; their trajectories."""
        self.client.forget([j.request_id for j in self._jobs if j.request_id is not None])
        held, self._jobs = [j.traj for j in self._jobs], []
        return held

    def counters(self) -> dict[str, Any]:
        """Counters of this link's own (none for the plain link)."""
        return {}

    def _request(self, job: _Job) -> int | None:
        """Send ``job``'s SCORE; its request id (None: nothing was sent)."""
        return self._submit(np.asarray(job.traj.tokens, dtype=np.int32), job.positions_P)

    def _submit(self, tokens_N: np.ndarray, positions_P: np.ndarray) -> int:
        cu_seqlens = np.array([0, len(tokens_N)], dtype=np.int32)
        return self.client.submit(tokens_N, cu_seqlens, positions_P, kind=self.kind, k=self.k,
                                  temperature=self.temperature, **self._flags)

    def _scored(self, job: _Job, reply: Any, identity: dict[str, Any]) -> Scored:
        """What ``job`` trains on: the reply's arrays, or none when it was not sent."""
        if reply is None:
            return Scored(job.traj, job.positions_P, empty_arrays(self.kind, self.k),
                          self.version, identity, self.kind, self.mode)
        return Scored(job.traj, job.positions_P, reply.arrays, reply.student_version, identity,
                      self.kind, self.mode)


@dataclass
class PrivilegedLink(TeacherLink):
    """``teacher.mode: privileged_context``: each SCORE carries the teacher's view of the
    trajectory, ``view(traj, positions_P) -> (tokens_N, positions_P)``
    (``rollout/privileged.py``). Reply rows follow the request's positions, so they stay
    aligned with the trajectory's own ``positions_P``."""

    mode: ClassVar[str] = "privileged_context"
    view: Callable[[Trajectory, np.ndarray], tuple[np.ndarray, np.ndarray]] = field(kw_only=True)

    def _request(self, job: _Job) -> int | None:
        return self._submit(*self.view(job.traj, job.positions_P))


def empty_arrays(kind: str, k: int) -> dict[str, np.ndarray]:
    """The arrays of a reply with no positions (a trajectory with nothing to score)."""
    if kind == "xvocab":
        return {"target_logprobs": np.zeros(0, np.float32), "group_first": np.zeros(0, np.int32)}
    if kind == "topk":
        return {
            "ids": np.zeros((0, k), np.int32),
            "logprobs": np.zeros((0, k), np.float32),
            "tail_logmass": np.zeros(0, np.float32),
            "target_logprobs": np.zeros(0, np.float32),
        }
    return {"logprobs": np.zeros((0, 0), np.float32), "target_logprobs": np.zeros(0, np.float32)}
