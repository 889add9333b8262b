"""The client's socket layer: what ``TeacherClient`` needs from a connection, and the ZeroMQ one.

A :class:`Transport` is one connected DEALER-like pipe with three methods:
``await send_multipart(frames)``, ``await recv_multipart() -> frames`` and
``close()``. :class:`ZmqTransport` is the real one (pyzmq asyncio DEALER, send and
receive with ``copy=False``, optional CURVE). Tests pass their own factory to the
client instead (``miniverl.testing`` has in-memory ones), so the client logic runs with
no ZeroMQ at all; :func:`checked_factory` makes a wrong one fail at once. This module
does not encode, decode or retry anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import zmq
import zmq.asyncio

from miniverl.common.errors import ConfigError
from miniverl.protocol.endpoints import CurveClientKeys, apply_curve_client, check_endpoint
from miniverl.protocol.limits import Limits


class Transport(Protocol):
    """One connection to a teacher endpoint."""

    async def send_multipart(self, frames: Sequence[Any]) -> None: ...

    async def recv_multipart(self) -> list[Any]: ...

    def close(self) -> None: ...


TransportFactory = Callable[[str], Transport]
"""Opens a :class:`Transport` connected to an endpoint (called inside the event loop)."""

TRANSPORT_METHODS = ("send_multipart", "recv_multipart", "close")


def checked_factory(factory: Any) -> TransportFactory | None:
    """``factory`` (None: the default ZeroMQ one) wrapped so a mistake fails at once.

    The client calls it for every (re)connection. A transport object passed where its
    factory belongs used to end, after ``unavailable_timeout_s``, in a misleading
    ``TeacherUnavailable``; now it is a :class:`ConfigError` when the client is made,
    and a factory that returns something without the transport methods is one at
    ``connect()``.
    """
    if factory is None:
        return None
    if not callable(factory):
        has = [name for name in TRANSPORT_METHODS if hasattr(factory, name)]
        what = "a transport" if has else "not callable"
        raise ConfigError(
            f"transport_factory is {what} ({type(factory).__name__} object); it must be a "
            "callable endpoint -> Transport that opens a new connection each time the "
            "client (re)connects, e.g. miniverl.testing's fake_teacher.transport_factory "
            "(docs/testing.md)"
        )

    def open_checked(endpoint: str) -> Transport:
        transport = factory(endpoint)
        missing = [n for n in TRANSPORT_METHODS if not callable(getattr(transport, n, None))]
        if missing:
            raise ConfigError(
                f"transport_factory({endpoint!r}) returned a {type(transport).__name__} "
                f"without {', '.join(missing)}; it must return a Transport (async "
                "send_multipart, async recv_multipart, close; protocol/transport.py)"
            )
        return transport

    return open_checked


class ZmqTransport:
    """A pyzmq asyncio DEALER connected to ``endpoint``; zero-copy frames both ways.

    ``LINGER`` is 0 so closing never blocks on a dead teacher; ZeroMQ itself
    reconnects the pipe underneath, the client decides when to replace the socket.
    """

    def __init__(self, endpoint: str, curve: CurveClientKeys | None = None):
        check_endpoint(endpoint)
        self.endpoint = endpoint
        self._socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        # The teacher's replies wait unread up to what the client may ask at once
        # (Limits.receive_hwm), not ZeroMQ's default of 1000 messages.
        self._socket.setsockopt(zmq.RCVHWM, Limits().receive_hwm())
        if curve is not None:
            apply_curve_client(self._socket, curve)
        self._socket.connect(endpoint)

    async def send_multipart(self, frames: Sequence[Any]) -> None:
        await self._socket.send_multipart(frames, copy=False)

    async def recv_multipart(self) -> list[Any]:
        return await self._socket.recv_multipart(copy=False)

    def close(self) -> None:
        self._socket.close(linger=0)


def zmq_transport_factory(curve: CurveClientKeys | None = None) -> TransportFactory:
    """A factory opening :class:`ZmqTransport` connections (with CURVE keys when given)."""

    def open_transport(endpoint: str) -> Transport:
        return ZmqTransport(endpoint, curve)

    return open_transport


def frame_nbytes(frame: Any) -> int:
    """Bytes in one frame: bytes, memoryview or ``zmq.Frame``."""
    if hasattr(frame, "buffer"):
        return frame.buffer.nbytes
    if isinstance(frame, memoryview):
        return frame.nbytes
    return len(frame)
