"""In-memory connections: what ``transport_factory`` returns when no socket should exist.

A :class:`MemoryTransport` is the client end of one connection. It has the three
methods ``TeacherClient`` needs from a transport (``protocol/transport.py``):
``await send_multipart(frames)``, ``await recv_multipart()`` and ``close()``. A send
copies the frames (as ZeroMQ does, so a sender may reuse its arrays) and hands them to
the *peer* at the other end: a :class:`~miniverl.testing.fake_teacher.FakeTeacher` or
the in-memory ROUTER of a :class:`~miniverl.testing.harness.TeacherHarness`. The peer
answers with :meth:`MemoryTransport.deliver`, which may be called from any thread and
may delay the delivery.

A factory is called once per (re)connection, inside the client's event loop, and must
return a new transport each time: after three missed heartbeats the client closes its
transport and asks the factory for another. :class:`MemoryNetwork` routes endpoints
to peers, so one client can retarget from one fake teacher to another; an endpoint
nobody serves connects to silence, as a ZeroMQ DEALER does.

This module does not encode, decode or answer anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

from miniverl.protocol.endpoints import check_endpoint


class Peer(Protocol):
    """The far end of a :class:`MemoryTransport` (a fake teacher, an in-memory server)."""

    def receive(self, conn: MemoryTransport, frames: list[bytes]) -> None:
        """Take one multipart message sent by ``conn`` (called in the client's loop)."""

    def disconnect(self, conn: MemoryTransport) -> None:
        """``conn`` was closed by the client."""


def copy_frames(frames: Sequence[Any]) -> list[bytes]:
    """Frames as independent ``bytes``: bytes, memoryviews, numpy arrays or ``zmq.Frame``."""
    out = []
    for frame in frames:
        if isinstance(frame, bytes):
            out.append(frame)
        elif hasattr(frame, "bytes") and not isinstance(frame, (bytearray, memoryview)):
            out.append(frame.bytes)  # zmq.Frame
        else:
            out.append(bytes(memoryview(frame).cast("B")))
    return out


_CLOSED = object()


class MemoryTransport:
    """The client end of one in-memory connection (a ``Transport``).

    ``sent`` counts messages sent, ``received`` messages handed to the client; ``closed``
    turns true when the client drops the connection (a reconnect opens a new one).
    """

    def __init__(self, peer: Peer, endpoint: str):
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "a MemoryTransport is opened by the client inside its event loop; pass the "
                "factory (e.g. fake_teacher.transport_factory) as transport_factory=, do not "
                "call it yourself"
            ) from None
        self.peer = peer
        self.endpoint = endpoint
        self.closed = False
        self.sent = 0
        self.received = 0
        self._inbox: asyncio.Queue = asyncio.Queue()

    async def send_multipart(self, frames: Sequence[Any]) -> None:
        if self.closed:
            raise ConnectionError(f"send on a closed in-memory connection to {self.endpoint}")
        self.sent += 1
        self.peer.receive(self, copy_frames(frames))

    async def recv_multipart(self) -> list[bytes]:
        frames = await self._inbox.get()
        if frames is _CLOSED:
            raise ConnectionError(f"the in-memory connection to {self.endpoint} was closed")
        self.received += 1
        return frames

    def deliver(self, frames: Sequence[Any], delay_s: float = 0.0) -> None:
        """Queue one message for the client, after ``delay_s`` seconds; any thread.

        Dropped when the connection is closed by then (the reply of a lost connection).
        """
        if self.closed:
            return
        frames = copy_frames(frames)

        def put() -> None:
            if not self.closed:
                self._inbox.put_nowait(frames)

        try:
            if delay_s > 0:
                self._loop.call_soon_threadsafe(self._loop.call_later, delay_s, put)
            else:
                self._loop.call_soon_threadsafe(put)
        except RuntimeError:  # the client's event loop has ended: nobody is listening
            self.closed = True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.peer.disconnect(self)
        with contextlib.suppress(RuntimeError):  # the loop has ended: no reader is waiting
            self._loop.call_soon_threadsafe(self._inbox.put_nowait, _CLOSED)


class Silence:
    """A peer that never answers: what a client meets at an endpoint nobody serves."""

    def __init__(self) -> None:
        self.received: list[list[bytes]] = []

    def receive(self, conn: MemoryTransport, frames: list[bytes]) -> None:
        self.received.append(frames)

    def disconnect(self, conn: MemoryTransport) -> None:
        pass

    def transport_factory(self, endpoint: str) -> MemoryTransport:
        return MemoryTransport(self, endpoint)


class MemoryNetwork:
    """Endpoints → in-memory teachers; ``transport_factory`` connects a client by endpoint.

    ``MemoryNetwork({"tcp://127.0.0.1:5555": teacher_a, "tcp://127.0.0.1:6000": b})``;
    each value is anything with a ``transport_factory(endpoint)`` (a
    :class:`~miniverl.testing.fake_teacher.FakeTeacher`, a
    :class:`~miniverl.testing.harness.TeacherHarness`). An endpoint not in the map
    connects to :class:`Silence`.
    """

    def __init__(self, teachers: dict[str, Any] | None = None):
        self.teachers: dict[str, Any] = {}
        self.nobody = Silence()
        for endpoint, teacher in (teachers or {}).items():
            self.add(endpoint, teacher)

    def add(self, endpoint: str, teacher: Any) -> None:
        """Serve ``teacher`` at ``endpoint`` (replacing whoever served there: a restart)."""
        if not callable(getattr(teacher, "transport_factory", None)):
            raise TypeError(f"{type(teacher).__name__} has no transport_factory(endpoint)")
        self.teachers[check_endpoint(endpoint)] = teacher

    def remove(self, endpoint: str) -> None:
        """Nobody serves ``endpoint`` any more (new connections meet silence)."""
        self.teachers.pop(endpoint, None)

    def transport_factory(self, endpoint: str) -> MemoryTransport:
        return self.teachers.get(endpoint, self.nobody).transport_factory(endpoint)
