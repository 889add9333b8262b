"""Several teachers for one student: which teacher (and adapter) scores each environment.

A mixture of environments (``environments:``) can route each environment's episodes to
its own teacher (docs/several-teachers.md):

- ``teachers:`` names several teachers, each a teacher section as ``teacher:`` is one
  (a model launched by ``up``, an ``mvl-score/1`` endpoint, an engine server), and each
  environment names its own with ``teacher: NAME``;
- one teacher section's ``adapters:`` names several PEFT adapters on one base model,
  served by one process, and each environment names its own with ``adapter: NAME``;

the two combine (a teacher of ``teachers:`` with ``adapters:``). A *route* is one
``(teacher, adapter)`` pair: the student keeps one connection, one version binding and
one set of counters per route, named ``teacher`` or ``teacher/adapter``.

:func:`routing_issues` holds the recipe's rules (``Recipe`` calls it, so ``miniverl
validate`` reports a bad route before any process starts); :func:`routes` reads a valid
recipe's routes. This module does not connect to teachers (``student/train/teacher/routed.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .names import name_problem
from .qualification import TeacherNotQualified, require_qualified
from .recipe_sections import EnvironmentConfig

# The name a single ``teacher:`` section's routes go by.
SINGLE = "teacher"
# Modes whose episodes are routed: strict on-policy distillation scores each fresh
# episode once, by its own environment's teacher; sft with train.fixed_set: teacher
# (SeqKD) trains on each environment's teacher's own episodes (the recipe checks that
# sft routes only with it).
ROUTED_MODES = frozenset({"opd", "sft"})
# Settings that hold one teacher's view of the run, so a routed teacher cannot have them.
# (min_success and min_recovery gate each route on each of its environments' records:
# require_route_qualified; mode privileged_context views each episode through its own
# environment's privileged context: student/train/teacher/connect.py route_views; tokenizer:
# other renders each episode with its own environment's tools: xvocab_targets.py.)
ONE_ENVIRONMENT_SETTINGS = (
    ("memory", "moves one teacher's weights around the student's update; several "
     "teachers stay resident", lambda t: t.memory if t.memory == "swap" else None),
)


@dataclass(frozen=True)
class Route:
    """One teacher (and adapter) that scores some environments' episodes."""

    name: str  # "calc", or "specialists/sql" for an adapter of teacher "specialists"
    teacher: str  # the key of teachers: (SINGLE for a teacher: section)
    adapter: str | None
    config: Any  # the TeacherConfig
    environments: tuple[str, ...]


def route_name(teacher: str, adapter: str | None) -> str:
    """``teacher`` or ``teacher/adapter``."""
    return teacher if adapter is None else f"{teacher}/{adapter}"


def is_routed(teacher: Any, teachers: dict[str, Any] | None) -> bool:
    """True when episodes go to several routes: ``teachers:`` or a teacher's ``adapters:``."""
    return teachers is not None or (teacher is not None and teacher.adapters is not None)


def routing_issues(run: Any, teacher: Any, teachers: dict[str, Any] | None,
                   mixture: list[Any] | None) -> list[tuple[tuple[str | int, ...], str]]:
    """Every problem with how ``mixture``'s environments reach their teachers, located
    under ``environments``, as ``(path, message)`` pairs."""
    issues: list[tuple[tuple[str | int, ...], str]] = []
    named = teachers if teachers is not None else ({SINGLE: teacher} if teacher else {})
    if not is_routed(teacher, teachers):
        for i, member in enumerate(mixture or ()):
            for field in ("teacher", "adapter"):
                if getattr(member, field) is not None:
                    issues.append(((i, field), (
                        f"{member.name!r} names {field} {getattr(member, field)!r}, but the "
                        f"recipe has {'no teacher' if teacher is None else 'one teacher'} "
                        f"to route to; name several teachers (teachers:) or adapters "
                        f"(teacher.adapters), or drop {field}")))
        return issues
    if mixture is None:
        what = "teachers:" if teachers is not None else "teacher.adapters"
        return [((), (f"{what} routes each environment of a mixture to its own teacher, and "
                      "this recipe has one environment: name them in environments: (a list "
                      "of {name, weight, teacher, adapter}), or use one teacher: section"))]
    if run is not None and run.mode not in ROUTED_MODES:
        issues.append(((), (
            f"several teachers score the fresh episodes of opd, or play SeqKD's (sft with "
            f"train.fixed_set: teacher); mode {run.mode!r} is not routed; use run.mode: opd "
            "or sft, or one teacher: section")))
    for name, config in named.items():
        where = "teacher" if teachers is None else f"teachers.{name}"
        for gate in ("min_success", "min_recovery"):
            if config.adapters is not None and getattr(config, gate) is not None:
                issues.append(((), (
                    f"{where}.{gate} {getattr(config, gate)!r} would gate each adapter of "
                    "that process, and qualify-teacher measures one model, not one adapter "
                    "of several; remove it, or serve each specialist as a teacher of "
                    "teachers: (each gated on its own environments)")))
        for field, why, value_of in ONE_ENVIRONMENT_SETTINGS:
            if value_of(config) is not None:
                issues.append(((), (
                    f"{where}.{field} {value_of(config)!r} {why}, so a routed teacher cannot "
                    "have it; remove it")))
    used: set[str] = set()
    for i, member in enumerate(mixture):
        if teachers is None:
            target = SINGLE
            if member.teacher is not None:
                issues.append(((i, "teacher"), (
                    f"{member.name!r} names teacher {member.teacher!r}, but the recipe has one "
                    "teacher: section; name its adapter (adapter:) or name several "
                    "teachers under teachers:")))
                continue
        else:
            target = member.teacher
            if target is None or target not in teachers:
                said = "no teacher" if target is None else f"teacher {target!r}, not one of teachers:"
                issues.append(((i, "teacher"), (
                    f"{member.name!r} is routed to {said}; set environments[{i}].teacher to "
                    f"one of {', '.join(sorted(teachers))}")))
                continue
        used.add(target)
        served = named[target].adapters
        if served is None and member.adapter is not None:
            issues.append(((i, "adapter"), (
                f"{member.name!r} names adapter {member.adapter!r}, but teacher {target!r} "
                "serves no adapters; list it in that teacher's adapters: or drop adapter")))
        elif served is not None and member.adapter not in served:
            said = ("no adapter" if member.adapter is None
                    else f"adapter {member.adapter!r}, which teacher {target!r} does not serve")
            issues.append(((i, "adapter"), (
                f"{member.name!r} names {said}; set environments[{i}].adapter to one of "
                f"{', '.join(sorted(served))}")))
    unrouted = any(path[-1:] == ("teacher",) for path, _ in issues)
    for name in sorted(set(named) - used):
        if teachers is not None and not unrouted:  # a mistyped route says it first
            issues.append(((), (
                f"teachers.{name} scores no environment; route one to it (environments[]."
                f"teacher: {name}) or remove it")))
    return issues


def routes(recipe: Any) -> dict[str, Route]:
    """The recipe's routes by name, in the order its environments first name them; empty
    for a recipe that routes nothing (one teacher, no adapters)."""
    if not is_routed(recipe.teacher, recipe.teachers):
        return {}
    named = recipe.teachers if recipe.teachers is not None else {SINGLE: recipe.teacher}
    out: dict[str, list[str]] = {}
    keys: dict[str, tuple[str, str | None]] = {}
    for member in recipe.environments:
        teacher = member.teacher or SINGLE
        name = route_name(teacher, member.adapter)
        out.setdefault(name, []).append(member.name)
        keys[name] = (teacher, member.adapter)
    return {name: Route(name, keys[name][0], keys[name][1], named[keys[name][0]], tuple(envs))
            for name, envs in out.items()}


def teacher_flags(values: list[str] | str | None) -> tuple[str | None, dict[str, str]]:
    """``--teacher`` values: ``(ENDPOINT, {NAME: ENDPOINT})``. A plain endpoint names the
    run's one teacher; ``NAME=ENDPOINT`` (repeatable) one of several. Raises
    ``ConfigError`` for two plain endpoints or a name given twice."""
    if values is None or isinstance(values, str):
        return values, {}
    plain, named = None, {}
    for value in values:
        name, sep, endpoint = value.partition("=")
        if sep and "://" not in name:
            problem = name_problem(name, "teacher")
            if problem is not None:
                raise ConfigError(f"--teacher {value[:200]}: {problem}")
            if name in named:
                raise ConfigError(f"--teacher {value}: teacher {name!r} is named twice; give "
                                  "each teacher one endpoint")
            named[name] = endpoint
        elif plain is not None:
            raise ConfigError(f"--teacher {value}: a second endpoint without a name; name "
                              "each teacher of teachers: as --teacher NAME=ENDPOINT")
        else:
            plain = value
    return plain, named


def route_of_environment(recipe: Any) -> dict[str, str]:
    """Environment name -> route name (empty for a recipe that routes nothing)."""
    return {env: route.name for route in routes(recipe).values() for env in route.environments}


def route_view(recipe: Any, route: Route, environment: str) -> Any:
    """The one-environment, one-teacher recipe that ``route``'s gate reads for
    ``environment`` (one of its environments): the route's teacher section as
    ``teacher:`` and that environment as ``environment:``. Its qualification records
    are those ``miniverl qualify-teacher`` writes for such a recipe."""
    return environment_view(recipe, environment, route.config)


def environment_view(recipe: Any, environment: str, teacher: Any) -> Any:
    """``recipe`` with one environment of its mixture as ``environment:`` and ``teacher``
    as its one teacher (no ``teachers:``, no ``environments:``)."""
    member = next(m for m in recipe.environments if m.name == environment)
    section = EnvironmentConfig(**member.model_dump(include=set(EnvironmentConfig.model_fields)))
    return recipe.model_copy(update={"teacher": teacher, "teachers": None,
                                     "environments": None, "environment": section})


def teacher_of_environment(recipe: Any) -> dict[str, Any]:
    """Environment name -> the teacher section that plays or scores its episodes: its
    route's, or the one ``teacher:`` of a mixture that routes nothing."""
    found = routes(recipe)
    if not found:
        return {member.name: recipe.teacher for member in recipe.environments}
    return {env: route.config for route in found.values() for env in route.environments}


def require_route_qualified(recipe: Any, route: Route,
                            identity: dict[str, Any]) -> list[dict[str, Any]]:
    """The competence gate of one route (its teacher's ``min_success`` /
    ``min_recovery``): the teacher ``identity`` must be qualified on each environment
    the route scores. Returns the records (empty when the route has no gate); raises
    ``TeacherNotQualified`` naming the route and the environment."""
    config = route.config
    if config is None or (config.min_success is None and config.min_recovery is None):
        return []
    records = []
    for environment in route.environments:
        try:
            record = require_qualified(route_view(recipe, route, environment), identity)
        except TeacherNotQualified as exc:
            raise TeacherNotQualified(
                f"route {route.name}, environment {environment}: {exc} (for a teacher of "
                "teachers:, qualify-teacher takes a recipe of that one environment with that "
                "teacher as teacher:; docs/several-teachers.md, \"Gates\")") from None
        if record is not None:  # always, for a route with a gate
            records.append(record)
    return records
