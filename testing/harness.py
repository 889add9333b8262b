"""Any teacher backend behind the real server, without sockets: :class:`TeacherHarness`.

A harness runs ``teacher_server.server.TeacherServer`` — admission (``HELLO`` and the
tokenizer check, ``NEED_HELLO``, ``max_inflight``, resends, every ``BAD_REQUEST``), the
batcher (coalescing, deadlines, the finite-numbers check) and the lifecycle (``PARK``,
``WAKE``, ``RELOAD``, ``SHUTDOWN``) — on a background thread, with an in-memory ROUTER
(``router.py``) where the ZeroMQ socket would be. What it serves is your code:

- ``TeacherHarness(backend)``: any object with the
  :class:`~miniverl.teacher_server.backend.Backend` methods (a ``RELOAD`` is refused:
  one backend has nothing to reload to);
- ``TeacherHarness(loader=fn)``: ``fn(None)`` builds the first backend and
  ``fn({"model", "revision", "adapter", "adapter_revision"})`` a reload, as the teacher
  process calls its loader;
- ``TeacherHarness(scorer=make_scorer, spec=..., scorer_options={...})``: a scorer
  factory (or the name of an installed ``miniverl.scorers`` entry point) called the way
  ``--scorer`` calls it.

Talk to it with :meth:`TeacherHarness.client` (the real ``SyncTeacherClient``),
``transport_factory=harness.transport_factory`` for your own client code, or
:meth:`TeacherHarness.raw` for raw frames. Use it as a context manager (or call
:meth:`close`): the server is shut down and its thread joined.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from miniverl.common.errors import ConfigError
from miniverl.protocol.client import TeacherClient
from miniverl.protocol.sync_client import SyncTeacherClient
from miniverl.teacher_server import roles
from miniverl.teacher_server.backend import Backend, Loader
from miniverl.teacher_server.scorers import get_scorer
from miniverl.teacher_server.server import TeacherServer
from miniverl.teacher_server.server_state import ServerConfig, ServerState
from miniverl.testing.backends import FakeBackend
from miniverl.testing.fake_teacher import FAST_SETTINGS
from miniverl.testing.memory import MemoryTransport
from miniverl.testing.router import MemoryRouter, RawConnection, RouterPeer


class TeacherHarness:
    """The real teacher server over in-memory connections; see the module docstring.

    ``config`` are :class:`~miniverl.teacher_server.server_state.ServerConfig` fields
    (``limits``, ``batch_tokens``, ``heartbeat_ms``, ``admin_token``...). ``logs`` holds
    every ``(level, event, fields)`` the server logged; ``log`` also receives them.
    With no backend, loader or scorer it serves a :class:`FakeBackend`. The constructor
    returns once the first backend is loaded (``wait_ready=False``: at once, to see the
    ``LOADING`` state) or the load failed (:meth:`wait_stopped` then returns 1).
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        loader: Loader | None = None,
        scorer: Callable[..., Backend] | str | None = None,
        spec: Any = None,
        scorer_options: dict[str, Any] | None = None,
        exact_max_vocab: int = 262144,
        max_batch_tokens: int = 8192,
        log: Callable[..., None] | None = None,
        wait_ready: bool = True,
        start_timeout_s: float = 30.0,
        **config: Any,
    ):
        choices = (("backend", backend), ("loader", loader), ("scorer", scorer))
        given = [name for name, value in choices if value is not None]
        if len(given) > 1:
            raise ConfigError(f"TeacherHarness takes one of backend, loader or scorer; got "
                              f"{' and '.join(given)}")
        if scorer is not None:
            loader = _scorer_loader(scorer, spec, scorer_options or {},
                                    exact_max_vocab=exact_max_vocab,
                                    max_batch_tokens=max_batch_tokens)
        elif loader is None:
            loader = _single(backend if backend is not None else FakeBackend())
        self.logs: list[tuple[str, str, dict[str, Any]]] = []
        self._log = log
        self.router = MemoryRouter(config.pop("endpoint", None)
                                   or f"inproc://miniverl-testing-{uuid.uuid4().hex[:12]}")
        self._peer = RouterPeer(self.router)
        self.server = TeacherServer(ServerConfig(endpoint=self.router.endpoint, **config), loader,
                                    log=self._record, open_socket=self._open)
        self._outcome: list[Any] = []
        self._clients: list[SyncTeacherClient] = []
        self._raws: list[RawConnection] = []
        self.thread = threading.Thread(target=self._run, name="teacher-harness", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while self.server.endpoint is None and self.thread.is_alive():
            if time.monotonic() > deadline:
                self.close()  # nobody else can: the caller never gets this harness
                raise TimeoutError(f"the harnessed server did not start in {start_timeout_s} s")
            time.sleep(0.002)
        if self.server.endpoint is None:
            self._raise_outcome()
        while wait_ready and self.server.srv.backend is None and self.thread.is_alive():
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"the harnessed teacher did not load in {start_timeout_s} s")
            time.sleep(0.002)

    # ----------------------------------------------------------------- the server
    def _open(self, srv: ServerState) -> MemoryRouter:
        router = self.router.bind()
        srv.endpoint = router.endpoint
        srv.admin = roles.setup(srv, None)  # inproc: open, unless config.admin_token is set
        return router

    def _record(self, level: str, event: str, /, **fields: Any) -> None:
        self.logs.append((level, event, fields))
        if self._log is not None:
            self._log(level, event, **fields)

    def _run(self) -> None:
        try:
            self._outcome.append(asyncio.run(self.server.serve()))
        except BaseException as exc:  # surfaced by wait_stopped() and close()
            self._outcome.append(exc)

    def _raise_outcome(self) -> None:
        if self._outcome and isinstance(self._outcome[0], BaseException):
            raise self._outcome[0]

    @property
    def endpoint(self) -> str:
        """The name clients use (``inproc://miniverl-testing-...``); no socket exists."""
        return self.router.endpoint

    @property
    def instance(self) -> str:
        return self.server.instance

    @property
    def gen(self) -> int:
        return self.server.srv.gen

    @property
    def state(self) -> str:
        return self.server.srv.state.value

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def backend(self, timeout_s: float = 10.0) -> Backend:
        """The backend being served, once loaded (waits up to ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while self.server.srv.backend is None:
            if not self.running or time.monotonic() > deadline:
                self._raise_outcome()
                raise TimeoutError(f"the teacher did not load within {timeout_s} s "
                                   f"(logs: {self.events('load_failed')})")
            time.sleep(0.002)
        return self.server.srv.backend

    def events(self, event: str) -> list[dict[str, Any]]:
        """The fields of every logged ``event`` (``"batch"``, ``"reloaded"``...)."""
        return [fields for _, name, fields in self.logs if name == event]

    def wait_stopped(self, timeout_s: float = 10.0) -> int | None:
        """The server's exit code once it stopped (0 after ``SHUTDOWN``, 1 after a failed
        load), or None if it still runs after ``timeout_s``."""
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            return None
        self._raise_outcome()
        return self._outcome[0]

    def shutdown(self, mode: str = "drain") -> None:
        """Begin a shutdown as SIGTERM would (``drain``) or ``abort``."""
        self.server.shutdown_threadsafe(mode)

    # ----------------------------------------------------------------- clients
    def transport_factory(self, endpoint: str) -> MemoryTransport:
        """Open an in-memory connection to this server (pass as ``transport_factory=``)."""
        return self._peer.transport_factory(endpoint)

    def client_settings(self, **settings: Any) -> dict[str, Any]:
        """``TeacherClient`` settings for this server: the served tokenizer (waits for the
        load), :data:`~miniverl.testing.fake_teacher.FAST_SETTINGS`, this transport."""
        if "tokenizer_fp" not in settings or "vocab_size" not in settings:
            served = self.backend()
            settings = {"tokenizer_fp": served.tokenizer_fp, "vocab_size": served.vocab_size,
                        **settings}
        return {"transport_factory": self.transport_factory, **FAST_SETTINGS, **settings}

    def client(self, endpoint: str | None = None, **settings: Any) -> SyncTeacherClient:
        """A blocking client of this server (``with harness.client() as c:`` connects);
        closed with the harness at the latest. ``endpoint``/``settings`` override."""
        client = SyncTeacherClient(endpoint or self.endpoint, **self.client_settings(**settings))
        self._clients.append(client)
        return client

    def async_client(self, endpoint: str | None = None, **settings: Any) -> TeacherClient:
        """An async client of this server (``async with harness.async_client() as c:``)."""
        return TeacherClient(endpoint or self.endpoint, **self.client_settings(**settings))

    def raw(self) -> RawConnection:
        """A raw blocking connection (any frames, decoded replies)."""
        conn = RawConnection(self.router)
        self._raws.append(conn)
        return conn

    def close(self) -> None:
        """Close every client, stop the server (abort) and join its thread (idempotent)."""
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self.thread.is_alive():
            self.server.shutdown_threadsafe("abort")
            self.thread.join(10)
        for conn in self._raws:
            conn.close()

    def __enter__(self) -> TeacherHarness:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _single(backend: Backend) -> Loader:
    def load(request: dict[str, Any] | None) -> Backend:
        if request is not None:
            raise ConfigError(
                f"this harness serves one backend and cannot load {request['model']!r}; "
                "pass TeacherHarness(loader=...) to serve reloads"
            )
        return backend

    return load


def _scorer_loader(scorer: Callable[..., Backend] | str, spec: Any, options: dict[str, Any], *,
                   exact_max_vocab: int, max_batch_tokens: int) -> Loader:
    """The loader ``--scorer`` makes (``scorers.make_loader``), for a factory or a name."""
    factory = get_scorer(scorer) if isinstance(scorer, str) else scorer

    def load(request: dict[str, Any] | None) -> Backend:
        chosen = spec
        if request is not None:
            chosen = (spec.with_model(request["model"], request.get("revision"),
                                      request.get("adapter"), request.get("adapter_revision"))
                      if hasattr(spec, "with_model") else request)
        return factory(chosen, exact_max_vocab=exact_max_vocab,
                       max_batch_tokens=max_batch_tokens, options=dict(options))

    return load
