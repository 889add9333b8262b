"""Several teachers for one student: each environment's episodes scored by its own route.

A recipe that routes (``teachers:``, or a teacher's ``adapters:``; common/teacher_routes.py,
docs/several-teachers.md) gets one :class:`RouteSide` per route: its own client (its own
connection, HELLO, version binding and staleness rule, counters), and its own
:class:`~miniverl.student.train.teacher_link.TeacherLink`. :class:`RoutedLink` is the
run's link then: the OPD cycle calls it exactly as it calls a plain link
(``begin_update``, ``submit`` per episode, ``collect``), and it hands each episode to the
link of the route its environment names, and gives the replies back in the order the
episodes were submitted. A route whose teacher restarts rebinds and re-sends its own
episodes only (``TeacherLink.collect``); the others' replies wait in their clients.

:func:`connect_routes` connects every route; a teacher the run would refuse (another
tokenizer, an adapter it does not serve) stops the run before the first rollout.
``miniverl teacher use NAME ENDPOINT`` retargets one route at an update boundary
(:func:`apply_route_retarget`), gated like a new teacher; a refusal keeps the old one.

This module does not compute losses or choose what a request holds (``teacher_link.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from miniverl.common.errors import ConfigError
from miniverl.common.manifest import record_teacher
from miniverl.common.teacher_routes import SINGLE, Route, route_of_environment, routes
from miniverl.common.trajectory import Trajectory
from miniverl.protocol.scoring_client import ScoringClient
from miniverl.student.train.teacher_link import Scored, TeacherLink, TeacherSide, teacher_identity

# Counters summed over routes into the run's own (the metrics row reads these).
SUMMED = ("sent", "received", "stale_dropped", "nonfinite_replies", "retries", "reconnects",
          "bytes_sent", "bytes_received")


@dataclass
class RouteSide:
    """One route's teacher: where it is, its client and link, who it is, what it did."""

    route: Route
    endpoint: str | None
    client: ScoringClient | None = None
    link: TeacherLink | None = None
    identity: dict[str, Any] = field(default_factory=dict)
    pending_endpoint: str | None = None  # `teacher use NAME`, taken at an update boundary
    positions_scored: int = 0
    episodes: int = 0
    wait_s: float = 0.0

    def counters(self) -> dict[str, Any]:
        """The client's counters and what this route scored."""
        out = dict(self.client.counters) if self.client is not None else {}
        out.update(positions_scored=self.positions_scored, episodes=self.episodes,
                   wait_s=round(self.wait_s, 4))
        return out


@dataclass
class RoutedLink:
    """The run's link when episodes are routed: one :class:`RouteSide` per route name,
    and the route of each environment."""

    sides: dict[str, RouteSide]
    route_of: dict[str, str]  # environment name -> route name
    wait_s: float = 0.0
    _order: list[str] = field(default_factory=list)

    def begin_update(self, version: int, allowed_lag: int = 0) -> None:
        """Bind every route's next update to ``version`` and its live teacher."""
        for side in self.sides.values():
            side.link.begin_update(version, allowed_lag)
        self._order = []
        self.wait_s = 0.0

    def submit(self, traj: Trajectory, positions_P: np.ndarray) -> None:
        """Send ``traj`` to its environment's route now."""
        name = self.route_of[traj.environment]
        self.sides[name].link.submit(traj, positions_P)
        self._order.append(name)

    def collect(self) -> list[Scored]:
        """Every route's replies, in the order their episodes were submitted."""
        t0 = time.perf_counter()
        by_route: dict[str, list[Scored]] = {}
        for name, side in self.sides.items():
            by_route[name] = side.link.collect()
            side.wait_s += side.link.wait_s
        self.wait_s = time.perf_counter() - t0
        taken = dict.fromkeys(by_route, 0)
        out = []
        for name in self._order:
            scored = by_route[name][taken[name]]
            taken[name] += 1
            side = self.sides[name]
            side.positions_scored += len(scored.positions_P)
            side.episodes += 1
            out.append(scored)
        self._order = []
        return out

    def counters(self) -> dict[str, Any]:
        """The counters summed over routes, and each route's under ``by_teacher``."""
        by_teacher = {name: side.counters() for name, side in self.sides.items()}
        out: dict[str, Any] = {key: sum(int(c.get(key, 0)) for c in by_teacher.values())
                               for key in SUMMED}
        out["by_teacher"] = by_teacher
        return out

    def identity(self) -> dict[str, Any]:
        """Who scores each route now (the run's teacher identity when routed)."""
        return {"name": "+".join(self.sides), "routes": {
            name: dict(side.identity) for name, side in self.sides.items()}}


def route_sides(recipe: Any, endpoints: dict[str, str] | None,
                clients: dict[str, ScoringClient] | None) -> dict[str, RouteSide]:
    """A :class:`RouteSide` per route of ``recipe``: its endpoint (``endpoints`` by
    teacher name, given by ``up`` or ``--teacher NAME=ENDPOINT``, else the teacher
    section's own) or a client handed in (tests: ``clients`` by route name)."""
    out = {}
    for name, route in routes(recipe).items():
        endpoint = (endpoints or {}).get(route.teacher) or route.config.endpoint
        out[name] = RouteSide(route, endpoint, client=(clients or {}).get(name))
    return out


def routed_side(recipe: Any, endpoint: str | None, endpoints: dict[str, str] | None,
                clients: dict[str, ScoringClient] | None,
                curve: tuple[str, str] | None) -> TeacherSide:
    """The run's :class:`TeacherSide` when it routes: no client of its own, one
    :class:`RouteSide` per route. ``endpoint`` (``--teacher``) names the one teacher of
    a teacher section with adapters; several teachers are named one by one
    (``endpoints``: ``--teacher NAME=ENDPOINT``). Raises ``ConfigError`` for a teacher
    no one says how to reach."""
    names = sorted(recipe.teachers or {SINGLE: None})
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


def connect_routes(state: Any, make_client: Callable[..., ScoringClient],
                   make_link: Callable[[ScoringClient, Callable], TeacherLink]) -> RoutedLink:
    """Connect every route's teacher (``make_client(route_side)`` builds a client;
    ``make_link(client, changed)`` the plain link), record each one, and return the run's
    link."""
    sides: dict[str, RouteSide] = state.teacher.routes
    for name, side in sides.items():
        if side.client is None:
            side.client = make_client(side)
        side.client.connect(state.recipe.runtime.teacher_startup_timeout_s)
        side.identity = teacher_identity(side.client)
        side.link = make_link(side.client, _on_changed(state, side))
        state.run.event("teacher_connected", teacher=side.identity, version=state.version,
                        endpoint=side.endpoint, route=name,
                        environments=list(side.route.environments))
        record_teacher(state.run, state.version, side.identity, how="connect", route=name)
    return RoutedLink(sides, route_of_environment(state.recipe))


def _on_changed(state: Any, side: RouteSide) -> Callable[[dict, int, str], None]:
    def changed(new: dict, version: int, how: str) -> None:
        if new == side.identity:
            return
        old, side.identity = side.identity, new
        state.run.event("teacher_changed", how=how, old=old, new=new, version=version,
                        route=side.route.name)
        record_teacher(state.run, version, new, how=how, route=side.route.name)
    return changed


def apply_route_retarget(state: Any, side: RouteSide, vet: Callable[[RouteSide, str], None],
                         ) -> None:
    """``teacher use NAME ENDPOINT``: move one route to another teacher at this update
    boundary; ``vet(side, endpoint)`` raises for a teacher the run would refuse, and a
    refusal keeps the old one (event ``teacher_swap_refused``)."""
    endpoint, side.pending_endpoint = side.pending_endpoint, None
    if endpoint is None:
        return
    old = dict(side.identity)
    try:
        vet(side, endpoint)
        side.client.retarget(endpoint)
    except Exception as exc:  # a refused swap keeps training on the old teacher
        state.run.event("teacher_swap_refused", endpoint=endpoint, reason=str(exc),
                        version=state.version, route=side.route.name)
        return
    side.endpoint = endpoint
    side.link.binding = None
    side.identity = teacher_identity(side.client)
    state.run.event("teacher_changed", how="retarget", old=old, new=side.identity,
                    version=state.version, endpoint=endpoint, route=side.route.name)
    record_teacher(state.run, state.version, side.identity, how="retarget",
                   route=side.route.name)
