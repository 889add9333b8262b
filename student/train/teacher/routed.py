"""Several teachers for one student: each environment's episodes scored by its own route.

A recipe that routes (``teachers:``, or a teacher's ``adapters:``; common/teacher_routes.py,
docs/several-teachers.md) gets one :class:`RouteSide` per route: its own client (its own
connection, HELLO, version binding and staleness rule, counters), and its own
:class:`~miniverl.student.train.teacher.link.TeacherLink`. :class:`RoutedLink` is the
run's link then: the OPD cycle calls it exactly as it calls a plain link
(``begin_update``, ``submit`` per episode, ``collect``), and it hands each episode to the
link of the route its environment names, and gives the replies back in the order the
episodes were submitted. A route whose teacher restarts rebinds and re-sends its own
episodes only (``TeacherLink.collect``); the others' replies wait in their clients. A
route whose teacher is down holds back its own episodes only, and the update trains on
the others' (:class:`RoutedLink`, event ``route_held_back``).

:func:`connect_routes` connects every route; a teacher the run would refuse (a tokenizer
its route's ``tokenizer`` rule refuses, an adapter it does not serve) stops the run
before the first rollout.
``miniverl teacher use NAME ENDPOINT`` retargets one route at an update boundary
(:func:`apply_route_retarget`), gated like a new teacher; a refusal keeps the old one.

This module does not compute losses or choose what a request holds (``link.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from miniverl.common.errors import ConfigError, TeacherRefusing, TeacherUnavailable
from miniverl.common.manifest import record_teacher
from miniverl.common.recipe import Recipe
from miniverl.common.teacher_routes import (
    SINGLE,
    Route,
    require_route_qualified,
    route_of_environment,
    routes,
)
from miniverl.common.trajectory import Trajectory
from miniverl.protocol.scoring_client import ScoreTimeout, ScoringClient
from miniverl.student.train.state import TrainState
from miniverl.student.train.teacher.link import (
    RouteSide,
    Scored,
    TeacherLink,
    TeacherSide,
    teacher_identity,
)

# Counters summed over routes into the run's own (the metrics row reads these).
SUMMED = ("sent", "received", "stale_dropped", "nonfinite_replies", "retries", "reconnects",
          "bytes_sent", "bytes_received", "held_back")
# ... and those of the routes whose teacher has another tokenizer, when some route's does.
XVOCAB_SUMMED = ("xvocab_sent", "xvocab_unaligned", "xvocab_too_large", "xvocab_exact_groups",
                 "xvocab_uld_groups")
# How often RoutedLink.collect looks again at each route while it waits (seconds).
POLL_S = 0.2


@dataclass
class RoutedLink:
    """The run's link when episodes are routed: one :class:`RouteSide` per route name,
    and the route of each environment.

    A route whose teacher fails holds back its own episodes only: a route whose client
    is not connected when the update begins, or that stops answering while the update's
    other routes have answered, is *held back* for this update. Its episodes of the
    update were played and stay in ``trajectories.jsonl``; they are not trained on, now
    or later (their requests are forgotten, so a restarted teacher is not asked for
    them), and ``on_held(route, episodes, why)`` records them. The update trains on the
    other routes' episodes. When no other route has an episode to train on, the update
    waits for the teacher as a single-teacher run does.
    """

    sides: dict[str, RouteSide]
    route_of: dict[str, str]  # environment name -> route name
    on_held: Callable[[str, int, str], None] | None = None
    wait_s: float = 0.0
    _order: list[str] = field(default_factory=list)
    # This update's routes held since it began: their episodes, kept unsent.
    _held: dict[str, list[tuple[Trajectory, np.ndarray]]] = field(default_factory=dict)
    _bound_to: tuple[int, int] = (0, 0)  # this update's (version, lag)

    @property
    def keeps_positions(self) -> bool:
        """Every route's link keeps its episodes' positions (a route held back in an
        update still returns none of its episodes: ``updates.EarlyForward.covers``)."""
        return all(_link(side).keeps_positions for side in self.sides.values())

    def begin_update(self, version: int, lag: int = 0) -> None:
        """Bind every route whose teacher is connected to ``version`` and its live
        teacher; a route whose teacher is not (while some other route's is) keeps its
        episodes unsent. With no teacher connected, every route binds (and waits)."""
        up = {name for name, side in self.sides.items() if _client(side).connected}
        self._held = {name: [] for name in self.sides if up and name not in up}
        self._bound_to = (version, lag)
        for name, side in self.sides.items():
            if name not in self._held:
                _link(side).begin_update(version, lag)
        self._order = []
        self.wait_s = 0.0

    def submit(self, traj: Trajectory, positions_P: np.ndarray) -> None:
        """Send ``traj`` to its environment's route now (a held route keeps it unsent)."""
        name = self.route_of[traj.environment]
        self._order.append(name)
        if name in self._held:
            self._held[name].append((traj, positions_P))
        else:
            _link(self.sides[name]).submit(traj, positions_P)

    def collect(self) -> list[Scored]:
        """Every answering route's replies, in the order their episodes were submitted;
        a route whose teacher fails is held back while another route has episodes."""
        t0 = time.perf_counter()
        for name in list(self._held):
            if self._others_have(name):
                self._hold(name, "its teacher was not connected when the update began")
            else:  # nothing else to train on: wait for it, as a run of one teacher does
                self._send_held(name)
        by_route: dict[str, list[Scored]] = {}
        waiting = [name for name in self.sides if name not in self._held]
        bound = list(waiting)  # the routes whose links began this update
        while waiting:
            for name in list(waiting):
                # No other route's episodes to train on: wait for this one as a run of one
                # teacher does (its link outlasts refusals, link.Patience).
                poll = POLL_S if self._others_have(name) else None
                try:
                    by_route[name] = _link(self.sides[name]).collect(timeout_s=poll)
                except ScoreTimeout:
                    continue  # not answered yet: look at the others, then again
                except TeacherUnavailable as exc:
                    if not self._others_have(name):
                        raise
                    # A teacher refusing SCOREs (TeacherRefusing) is unavailable to its
                    # route, not a protocol error that ends the run (issue 53).
                    self._hold(name, f"its teacher refused its SCOREs ({exc})"
                               if isinstance(exc, TeacherRefusing)
                               else "its teacher stopped answering")
                waiting.remove(name)
            down = [name for name in waiting if not _client(self.sides[name]).connected]
            if waiting and len(down) == len(waiting) and any(by_route.values()):
                for name in down:  # only failed teachers left to wait for
                    self._hold(name, "its teacher went down while scoring")
                waiting = []
        for name in bound:
            self.sides[name].wait_s += _link(self.sides[name]).wait_s
        self.wait_s = time.perf_counter() - t0
        taken = dict.fromkeys(by_route, 0)
        out = []
        for name in self._order:
            if name not in by_route:
                continue  # held back
            scored = by_route[name][taken[name]]
            taken[name] += 1
            side = self.sides[name]
            side.positions_scored += len(scored.positions_P)
            side.episodes += 1
            out.append(scored)
        self._order, self._held = [], {}
        return out

    def _others_have(self, name: str) -> bool:
        """Some other route, not held back, has episodes in this update."""
        return any(other != name and other not in self._held for other in self._order)

    def _send_held(self, name: str) -> None:
        """Bind ``name`` now (waiting for its teacher) and send the episodes it kept."""
        kept = self._held.pop(name)
        link = _link(self.sides[name])
        link.begin_update(*self._bound_to)
        for traj, positions_P in kept:
            link.submit(traj, positions_P)

    def _hold(self, name: str, why: str) -> None:
        side = self.sides[name]
        if name in self._held:
            held = [traj for traj, _ in self._held[name]]
        else:
            held = _link(side).hold_back()
            self._held[name] = []
        side.held_back += len(held)
        if held and self.on_held is not None:
            self.on_held(name, len(held), why)

    def counters(self) -> dict[str, Any]:
        """The counters summed over routes, and each route's under ``by_teacher``."""
        by_teacher = {name: side.counters() for name, side in self.sides.items()}
        keys = [*SUMMED, *(k for k in XVOCAB_SUMMED if any(k in c for c in by_teacher.values()))]
        out: dict[str, Any] = {key: sum(int(c.get(key, 0)) for c in by_teacher.values())
                               for key in keys}
        out["by_teacher"] = by_teacher
        return out

    def identity(self) -> dict[str, Any]:
        """Who scores each route now (the run's teacher identity when routed)."""
        return {"name": "+".join(self.sides), "routes": {
            name: dict(side.identity) for name, side in self.sides.items()}}


def _link(side: RouteSide) -> TeacherLink:
    """The route's link: bound by :func:`connect_routes`, before the run routes anything."""
    assert side.link is not None, f"route {side.route.name} is not connected"
    return side.link


def _client(side: RouteSide) -> ScoringClient:
    """The route's client: made or handed in by :func:`connect_routes` at the latest."""
    assert side.client is not None, f"route {side.route.name} is not connected"
    return side.client


def route_sides(recipe: Recipe, endpoints: dict[str, str] | None,
                clients: dict[str, ScoringClient] | None) -> dict[str, RouteSide]:
    """A :class:`RouteSide` per route of ``recipe``: its endpoint (``endpoints`` by
    teacher name, given by ``up`` or ``--teacher NAME=ENDPOINT``, else the teacher
    section's own) or a client handed in (tests: ``clients`` by route name)."""
    out = {}
    for name, route in routes(recipe).items():
        endpoint = (endpoints or {}).get(route.teacher) or route.config.endpoint
        out[name] = RouteSide(route, endpoint, client=(clients or {}).get(name))
    return out


def routed_side(recipe: Recipe, endpoint: str | None, endpoints: dict[str, str] | None,
                clients: dict[str, ScoringClient] | None,
                curve: tuple[str, str] | None) -> TeacherSide:
    """The run's :class:`TeacherSide` when it routes: no client of its own, one
    :class:`RouteSide` per route. ``endpoint`` (``--teacher``) names the one teacher of
    a teacher section with adapters; several teachers are named one by one
    (``endpoints``: ``--teacher NAME=ENDPOINT``). Raises ``ConfigError`` for a teacher
    no one says how to reach."""
    names = sorted(recipe.teachers or [SINGLE])
    if endpoint is not None:
        if len(names) > 1:
            raise ConfigError(
                f"--teacher {endpoint} names one teacher, and this recipe routes to "
                f"{len(names)} ({', '.join(names)}); name each: --teacher NAME=ENDPOINT")
        endpoints = {**(endpoints or {}), names[0]: endpoint}
    unknown = sorted(set(endpoints or {}) - set(names))
    if unknown:
        raise ConfigError(f"--teacher {unknown[0]}=... names no teacher of this recipe; "
                          f"name one of {', '.join(names)}")
    sides = route_sides(recipe, endpoints, clients)
    missing = sorted({s.route.teacher for s in sides.values()
                      if s.client is None and s.endpoint is None})
    if missing:
        raise ConfigError(
            f"teacher {missing[0]!r} has no endpoint: set teachers.{missing[0]}.endpoint, "
            f"pass --teacher {missing[0]}=ENDPOINT, or start the processes with `miniverl up`")
    return TeacherSide(curve=curve, routes=sides)


def connect_routes(state: TrainState, make_client: Callable[..., ScoringClient],
                   make_link: Callable[[ScoringClient, Callable, Route], TeacherLink]
                   ) -> RoutedLink:
    """Connect every route's teacher (``make_client(route_side)`` builds a client;
    ``make_link(client, changed, route)`` the route's own link), record each one, and
    return the run's link."""
    sides = state.teacher.routes
    assert sides is not None  # a routing recipe's side (routed_side)
    for name, side in sides.items():
        if side.client is None:
            side.client = make_client(side)
        side.client.connect(state.recipe.runtime.teacher_startup_timeout_s)
        side.identity = teacher_identity(side.client)
        gate_route(state, side, side.identity)
        side.link = make_link(side.client, _on_changed(state, side), side.route)
        state.run.event("teacher_connected", teacher=side.identity, version=state.version,
                        endpoint=side.endpoint, route=name,
                        environments=list(side.route.environments))
        record_teacher(state.run, state.version, side.identity, how="connect", route=name)
    def held(route: str, episodes: int, why: str) -> None:
        state.run.event("route_held_back", route=route, episodes=episodes, why=why,
                        version=state.version)

    return RoutedLink(sides, route_of_environment(state.recipe), on_held=held)


def gate_route(state: TrainState, side: RouteSide, identity: dict[str, Any]) -> None:
    """The route's competence gate (its teacher's ``min_success`` / ``min_recovery``, on
    each of its environments): raises ``TeacherNotQualified``; records what passed."""
    for record in require_route_qualified(state.recipe, side.route, identity):
        config = side.route.config
        state.run.event("teacher_qualified", teacher=identity, route=side.route.name,
                        environment=record["environment"]["name"], success=record["success"],
                        split=record["split"], n=record["n"], date=record["date"],
                        min_success=config.min_success, version=state.version,
                        **({"recovery": record.get("recovery"),
                            "min_recovery": config.min_recovery}
                           if config.min_recovery is not None else {}))


def _on_changed(state: TrainState, side: RouteSide) -> Callable[[dict, int, str], None]:
    def changed(new: dict, version: int, how: str) -> None:
        if new == side.identity:
            return
        gate_route(state, side, new)  # a restarted or reloaded teacher is gated again
        old, side.identity = side.identity, new
        state.run.event("teacher_changed", how=how, old=old, new=new, version=version,
                        route=side.route.name)
        record_teacher(state.run, version, new, how=how, route=side.route.name)
    return changed


def apply_route_retarget(state: TrainState, side: RouteSide,
                         vet: Callable[[RouteSide, str], object]) -> None:
    """``teacher use NAME ENDPOINT``: move one route to another teacher at this update
    boundary; ``vet(side, endpoint)`` raises for a teacher the run would refuse, and a
    refusal keeps the old one (event ``teacher_swap_refused``)."""
    endpoint, side.pending_endpoint = side.pending_endpoint, None
    if endpoint is None:
        return
    old = dict(side.identity)
    try:
        vet(side, endpoint)
        _client(side).retarget(endpoint)
    except Exception as exc:  # a refused swap keeps training on the old teacher
        state.run.event("teacher_swap_refused", endpoint=endpoint, reason=str(exc),
                        version=state.version, route=side.route.name)
        return
    side.endpoint = endpoint
    _link(side).binding = None
    side.identity = teacher_identity(_client(side))
    state.run.event("teacher_changed", how="retarget", old=old, new=side.identity,
                    version=state.version, endpoint=endpoint, route=side.route.name)
    record_teacher(state.run, state.version, side.identity, how="retarget",
                   route=side.route.name)
