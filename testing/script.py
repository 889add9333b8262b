"""What the fake teacher does with each ``SCORE``: small composable steps.

A :class:`Step` is a list of actions run on one received ``SCORE``; ``a + b`` runs
``a``'s then ``b``'s. :meth:`FakeTeacher.script(*steps)
<miniverl.testing.fake_teacher.FakeTeacher.script>` queues steps for the next
``SCORE`` s, one each, resends included; when the queue is empty the teacher's
``default`` step (:func:`answer`) runs. The steps:

- :func:`answer` — the honest reply (optionally late, or with header fields changed);
- :func:`error` — an ``ERROR`` with a code (retryable by the protocol's rule);
- :func:`drop` — the request is lost (the client resends it after ``request_timeout_s``);
- :func:`hold` — kept until :meth:`FakeTeacher.release` answers it;
- :func:`duplicate` — the honest reply, several times;
- :func:`stale` — a reply for another policy version (``student_version`` ± ``lag``);
- :func:`wrong_id` — a reply for an id nobody asked about;
- :func:`restart` — the teacher process restarts (new ``instance``, ``gen`` 0, every
  client forgotten) and the request is lost;
- :func:`reload` — the teacher reloads (``gen`` + 1) before whatever follows.

For example ``stale() + answer() + duplicate()`` sends a reply for the previous version,
then the honest reply, then two copies of it: the client must train on exactly one.
This module builds steps; the teacher that runs them is ``fake_teacher.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from miniverl.protocol.messages import ErrorCode, Score
from miniverl.testing.memory import MemoryTransport


class FakeTeacher(Protocol):
    """What a step does to the teacher it scripts (``fake_teacher.FakeTeacher`` is the
    one that runs them; named here so the two modules do not import each other)."""

    held: list[Received]

    def send(self, conn: MemoryTransport, frames: list, delay_s: float = 0.0) -> None: ...

    def reply(self, request: Received, scorer: Callable | None = None, **header: Any) -> list: ...

    def error(self, rid: int | None, code: ErrorCode | str, *, retryable: bool | None = None,
              message: str | None = None) -> list: ...

    def release(self, step: Step | None = None, *, reverse: bool = False) -> int: ...

    def reload(self, model: str | None = None) -> int: ...

    def restart(self, instance: str | None = None) -> None: ...


@dataclass(frozen=True)
class Received:
    """One ``SCORE`` as the fake teacher received it."""

    conn: MemoryTransport
    msg: Score
    arrays: dict[str, np.ndarray]


Action = Callable[["FakeTeacher", Received], None]


@dataclass(frozen=True)
class Step:
    """What the fake teacher does with one ``SCORE``; ``step_a + step_b`` does both."""

    name: str
    actions: tuple[Action, ...]

    def __add__(self, other: Step) -> Step:
        return Step(f"{self.name} + {other.name}", self.actions + other.actions)

    def __call__(self, teacher: FakeTeacher, request: Received) -> None:
        for action in self.actions:
            action(teacher, request)

    def __repr__(self) -> str:
        return f"Step({self.name})"


def answer(delay_s: float = 0.0, scorer: Callable | None = None, **header: Any) -> Step:
    """The honest ``SCORE_OK`` after ``delay_s`` seconds.

    ``scorer(job) -> arrays`` replaces the teacher's for this reply (e.g. wrong numbers on
    purpose); ``header`` overrides reply fields (``student_version=``, ``id=``, ``gen=``,
    ``instance=``...).
    """

    def act(teacher: FakeTeacher, request: Received) -> None:
        teacher.send(request.conn, teacher.reply(request, scorer=scorer, **header), delay_s)

    return Step(f"answer(delay_s={delay_s})" if delay_s else "answer()", (act,))


def error(
    code: ErrorCode | str,
    *,
    retryable: bool | None = None,
    message: str | None = None,
    delay_s: float = 0.0,
) -> Step:
    """An ``ERROR`` with ``code``; ``retryable`` defaults to what the protocol says
    (``OVERLOADED``, ``RELOADING``, ``DEADLINE_EXCEEDED``, ``NEED_HELLO``: true)."""
    code = ErrorCode(code)

    def act(teacher: FakeTeacher, request: Received) -> None:
        frames = teacher.error(request.msg.id, code, retryable=retryable, message=message)
        teacher.send(request.conn, frames, delay_s)

    return Step(f"error({code.value})", (act,))


def drop() -> Step:
    """Lose the request: no reply (the client resends it under the same id)."""
    return Step("drop()", ())


def hold() -> Step:
    """Keep the request in ``teacher.held`` until ``teacher.release()`` answers it."""

    def act(teacher: FakeTeacher, request: Received) -> None:
        teacher.held.append(request)

    return Step("hold()", (act,))


def duplicate(copies: int = 2, delay_s: float = 0.0) -> Step:
    """The honest reply ``copies`` times (the client accepts one; the rest are stale)."""
    if copies < 1:
        raise ValueError(f"copies={copies} must be >= 1")

    def act(teacher: FakeTeacher, request: Received) -> None:
        frames = teacher.reply(request)
        for _ in range(copies):
            teacher.send(request.conn, frames, delay_s)

    return Step(f"duplicate({copies})", (act,))


def stale(lag: int = 1, scorer: Callable | None = None, delay_s: float = 0.0) -> Step:
    """A reply echoing another policy version: ``student_version - lag`` (``+ lag`` when
    the request was for a version below ``lag``). A client must never accept it."""
    if lag < 1:
        raise ValueError(f"lag={lag} must be >= 1")

    def act(teacher: FakeTeacher, request: Received) -> None:
        version = request.msg.student_version
        other = version - lag if version >= lag else version + lag
        frames = teacher.reply(request, scorer=scorer, student_version=other)
        teacher.send(request.conn, frames, delay_s)

    return Step(f"stale(lag={lag})", (act,))


def wrong_id(offset: int = 10_000, scorer: Callable | None = None) -> Step:
    """A reply for the id ``request id + offset``, which nobody asked about."""

    def act(teacher: FakeTeacher, request: Received) -> None:
        frames = teacher.reply(request, scorer=scorer, id=request.msg.id + offset)
        teacher.send(request.conn, frames)

    return Step(f"wrong_id(+{offset})", (act,))


def restart(instance: str | None = None) -> Step:
    """The teacher process restarts now (new ``instance``, ``gen`` 0, clients forgotten);
    this request is lost with the old process."""

    def act(teacher: FakeTeacher, request: Received) -> None:
        teacher.restart(instance)

    return Step("restart()", (act,))


def reload(model: str | None = None) -> Step:
    """The teacher reloads now (``gen`` + 1); combine: ``reload() + answer()`` answers from
    the new generation."""

    def act(teacher: FakeTeacher, request: Received) -> None:
        teacher.reload(model)

    return Step("reload()", (act,))
