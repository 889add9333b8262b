"""The real teacher server's socket, in memory: :class:`MemoryRouter` and :class:`RawConnection`.

:class:`MemoryRouter` stands where ``teacher_server/server.py`` binds its ZeroMQ
ROUTER (``TeacherServer(..., open_socket=...)``): the server's loop reads
``[identity, *frames]`` from it and sends ``[identity, *frames]`` back, exactly as over
ZeroMQ, so admission, batching and the lifecycle run unchanged. Clients reach it
through :class:`~miniverl.testing.memory.MemoryTransport` (``TeacherClient``) or
:class:`RawConnection` (blocking, any frames at all, for wire-level tests). Every
crossing between the client's thread and the server's loop is thread-safe.

Like a ROUTER with ``ROUTER_MANDATORY``, a reply to a connection that is gone raises
``zmq.ZMQError(EHOSTUNREACH)`` (the server logs it and goes on). This module does not
decode or answer anything.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from miniverl.protocol import messages as m
from miniverl.protocol.codec import decode, encode
from miniverl.protocol.limits import Limits
from miniverl.testing.memory import MemoryTransport, copy_frames

Deliver = Callable[[list[bytes]], None]
_RAW_LIMITS = Limits()


class MemoryRouter:
    """The server end of every in-memory connection to one harnessed server."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self._inbox: asyncio.Queue | None = None
        self._peers: dict[bytes, Deliver] = {}
        self._ids = itertools.count(1)

    def bind(self) -> MemoryRouter:
        """Attach to the running (server) loop; what ``open_socket`` calls."""
        self.loop = asyncio.get_running_loop()
        self._inbox = asyncio.Queue()
        return self

    # -- the server's side (its event loop)
    async def recv_multipart(self, copy: bool = False) -> list[Any]:
        return await self._inbox.get()

    async def send_multipart(self, frames: Sequence[Any], copy: bool = False,
                             flags: int = 0) -> None:
        # flags (the server's NOBLOCK) change nothing: a memory connection never fills.
        ident, *body = frames
        deliver = self._peers.get(bytes(ident))
        if deliver is None:
            raise zmq.ZMQError(zmq.EHOSTUNREACH)
        deliver(copy_frames(body))

    def getsockopt_string(self, option: int) -> str:
        return self.endpoint

    def close(self, linger: int | None = None) -> None:
        self.closed = True

    # -- the clients' side (any thread)
    def attach(self, deliver: Deliver) -> bytes:
        """A new connection: its identity; replies to it go to ``deliver(frames)``."""
        ident = b"mem-%d" % next(self._ids)
        self._peers[ident] = deliver
        return ident

    def detach(self, ident: bytes) -> None:
        self._peers.pop(ident, None)

    def push(self, ident: bytes, frames: Sequence[Any]) -> bool:
        """Hand one message from connection ``ident`` to the server; False once it stopped."""
        if self.loop is None or self.closed:
            return False
        message = [zmq.Frame(ident), *copy_frames(frames)]
        try:
            self.loop.call_soon_threadsafe(self._inbox.put_nowait, message)
        except RuntimeError:  # the server's loop has ended
            return False
        return True


class RouterPeer:
    """Connects :class:`MemoryTransport` s (``TeacherClient``) to a :class:`MemoryRouter`."""

    def __init__(self, router: MemoryRouter):
        self.router = router
        self._idents: dict[int, bytes] = {}

    def transport_factory(self, endpoint: str) -> MemoryTransport:
        conn = MemoryTransport(self, endpoint)
        self._idents[id(conn)] = self.router.attach(conn.deliver)
        return conn

    def receive(self, conn: MemoryTransport, frames: list[bytes]) -> None:
        ident = self._idents.get(id(conn))
        if ident is not None:
            self.router.push(ident, frames)  # a stopped server: lost, as on a dead socket

    def disconnect(self, conn: MemoryTransport) -> None:
        ident = self._idents.pop(id(conn), None)
        if ident is not None:
            self.router.detach(ident)


class RawConnection:
    """A blocking DEALER-like connection for wire-level tests: sends any frames at all.

    ``send(header, arrays)`` encodes a header (a dict or a message) with the real codec;
    ``send_multipart(frames)`` sends raw frames (malformed ones included);
    ``recv(timeout_s)`` returns the next decoded ``(message, arrays)`` or None;
    ``call(...)`` does both. ``poll(ms)``/``recv_multipart()`` mirror a zmq socket.
    """

    def __init__(self, router: MemoryRouter):
        self.router = router
        self._inbox: deque[list[bytes]] = deque()
        self._arrived = threading.Condition()
        self.ident = router.attach(self._put)
        self.closed = False

    def _put(self, frames: list[bytes]) -> None:
        with self._arrived:
            self._inbox.append(frames)
            self._arrived.notify_all()

    def send_multipart(self, frames: Sequence[Any]) -> None:
        if self.closed:
            raise ConnectionError("send on a closed RawConnection")
        self.router.push(self.ident, frames)

    def send(self, header: dict[str, Any] | m.Message, arrays: dict | None = None) -> None:
        self.send_multipart(encode(header, arrays))

    def poll(self, timeout_ms: int) -> bool:
        """True when a message is waiting or arrives within ``timeout_ms``."""
        with self._arrived:
            return self._arrived.wait_for(lambda: bool(self._inbox), timeout_ms / 1000)

    def recv_multipart(self, timeout_s: float = 5.0) -> list[bytes]:
        """The next message's frames; ``TimeoutError`` when none comes in ``timeout_s``."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: bool(self._inbox), timeout_s):
                raise TimeoutError(f"no message within {timeout_s} s")
            return self._inbox.popleft()

    def recv(self, timeout_s: float = 5.0) -> tuple[m.Message, dict] | None:
        """The next reply, decoded; None when nothing arrives within ``timeout_s``."""
        try:
            frames = self.recv_multipart(timeout_s)
        except TimeoutError:
            return None
        return decode(frames, _RAW_LIMITS)

    def call(self, header: dict[str, Any] | m.Message, arrays: dict | None = None,
             timeout_s: float = 5.0) -> tuple[m.Message, dict]:
        """Send, then the next reply; ``TimeoutError`` when none comes."""
        self.send(header, arrays)
        reply = self.recv(timeout_s)
        if reply is None:
            raise TimeoutError(f"no reply to {header!r} within {timeout_s} s")
        return reply

    def hello(self, tokenizer_fp: str, vocab_size: int, rid: int = 1,
              client: str = "raw", adapter: str | None = None) -> m.Message:
        """Say ``HELLO`` (naming ``adapter`` when given); returns the reply (``HELLO_OK``
        or ``ERROR``)."""
        header = {"v": 1, "t": "HELLO", "id": rid, "client": client,
                  "tokenizer_fp": tokenizer_fp, "vocab_size": vocab_size,
                  **({"adapter": adapter} if adapter is not None else {})}
        return self.call(header)[0]

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.router.detach(self.ident)
