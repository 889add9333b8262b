"""The client's socket layer: what ``TeacherClient`` needs from a connection, and the ZeroMQ one.

A :class:`Transport` is one connected DEALER-like pipe with three methods:
``await send_multipart(frames)``, ``await recv_multipart() -> frames`` and
``close()``. :class:`ZmqTransport` is the real one (pyzmq asyncio DEALER, send and
receive with ``copy=False``, optional CURVE). Tests pass their own factory to the
client instead, so the client logic runs with no ZeroMQ at all. This module does
not encode, decode or retry anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import zmq
import zmq.asyncio

from miniverl.protocol.endpoints import CurveClientKeys, apply_curve_client, check_endpoint


class Transport(Protocol):
    """One connection to a teacher endpoint."""

    async def send_multipart(self, frames: Sequence[Any]) -> None: ...

    async def recv_multipart(self) -> list[Any]: ...

    def close(self) -> None: ...


TransportFactory = Callable[[str], Transport]
"""Opens a :class:`Transport` connected to an endpoint (called inside the event loop)."""


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
