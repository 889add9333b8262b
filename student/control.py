"""The student's control socket server: a ROUTER on ``ipc://<run>/control.sock``.

It runs on its own thread so it answers while the training loop computes. ``STATUS``
reads a snapshot of the trainer; ``RETARGET`` and ``STOP`` only *request* a change:
the training loop applies them at the next update boundary. A retarget is validated
first, here (a teacher answers at the endpoint, its handshake and tokenizer, the
competence gate): one the run would refuse gets ``ERROR`` with the reason, so
``miniverl teacher use`` fails, and training goes on with the old teacher. It is checked
once more at the boundary (a refusal there is the event ``teacher_swap_refused``). The socket's address is written to ``<run>/sockets.json`` for the CLI;
the socket file is removed when the server stops (normal exit, SIGTERM, error).

This module does not train; it never touches the model.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from miniverl.common.atomic import atomic_write_json
from miniverl.common.errors import MiniverlError, TeacherUnavailable
from miniverl.common.names import path_inside
from miniverl.protocol.codec import decode, encode
from miniverl.protocol.control_socket import (
    REQUESTS,
    SOCKETS_FILE,
    ControlError,
    RetargetReply,
    RetargetRequest,
    StatusReply,
    StopReply,
    StopRequest,
    parse_control,
)
from miniverl.protocol.endpoints import IPC_PATH_MAX, check_endpoint
from miniverl.protocol.engine_client import check_engine_endpoint, is_engine_endpoint
from miniverl.protocol.messages import Ping, Pong
from miniverl.protocol.socket_files import bound_file, remove_bound_file
from miniverl.student.train.optim import planned_cycles
from miniverl.student.train.teacher.connect import vet_endpoint, vet_route

log = logging.getLogger(__name__)

RETARGET_PROBE_S = 3.0
# The handshake of a vetted retarget; with the probe it stays under `teacher use`'s
# default 10 s wait for the reply.
RETARGET_HANDSHAKE_S = 5.0


def socket_endpoint(run_dir: Path, name: str) -> str:
    """``ipc://<run>/<name>``, or a short private path when the run path is too long;
    ``name`` (``teacher-<teacher name>.sock``) must stay inside that folder."""
    path = path_inside(Path(run_dir).resolve(), name, what="socket")
    if len(str(path).encode()) <= IPC_PATH_MAX:
        return f"ipc://{path}"
    short = path_inside(tempfile.mkdtemp(prefix="mvl-"), name, what="socket")
    return f"ipc://{short}"


def record_socket(run_dir: Path, role: str, endpoint: str) -> None:
    path = Path(run_dir) / SOCKETS_FILE
    try:
        current = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        current = {}
    current[role] = endpoint
    atomic_write_json(path, current)


def status_snapshot(trainer: Any) -> dict[str, Any]:
    recipe = trainer.recipe
    state = trainer.state  # None until the trainer has built it
    metrics = state.last_metrics if state is not None else {}
    last = {k: metrics.get(k) for k in (
        "loss", "divergence", "train_success", "positions_per_s", "stale_dropped",
        "nonfinite_replies",
        "time_rollout_s", "time_teacher_wait_s", "time_update_s",
    ) if k in metrics}
    side = trainer.teacher
    counters = side.counters()
    counters.pop("by_teacher", None)
    by_teacher = {name: {**route.counters(), "teacher": route.identity or None,
                         "endpoint": route.endpoint}
                  for name, route in (side.routes or {}).items()}
    return dict(
        run_id=trainer.run.id,
        status=trainer.run.status,
        mode=recipe.run.mode,
        on_policy=recipe.on_policy,
        step=trainer.step,
        version=trainer.version,
        cycle=state.cycle if state is not None else 0,
        cycles=planned_cycles(recipe),
        wall_s=time.perf_counter() - trainer.started,
        teacher=side.identity or None,
        endpoint=side.endpoint,
        counters={k: int(v) for k, v in counters.items()},
        last=json.loads(json.dumps(last, default=float)),
        by_teacher=json.loads(json.dumps(by_teacher, default=str)) if by_teacher else None,
    )


def probe_teacher(endpoint: str, timeout_s: float) -> None:
    """PING ``endpoint`` once; raise ``TeacherUnavailable`` unless a teacher answers."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart(encode(Ping(id=1)))
        if sock.poll(int(timeout_s * 1000)):
            msg, _ = decode(sock.recv_multipart())
            if isinstance(msg, Pong):
                return
    except (zmq.ZMQError, MiniverlError):
        pass
    finally:
        sock.close()
    raise TeacherUnavailable(
        f"no teacher answers PING at {endpoint} within {timeout_s:g} s; start it first "
        "(miniverl teacher serve --bind ENDPOINT) or check the endpoint"
    )


class ControlServer:
    """Serve the control socket for ``trainer`` while the ``with`` block runs."""

    def __init__(self, trainer: Any, endpoint: str | None = None):
        self.trainer = trainer
        self.endpoint = endpoint or socket_endpoint(trainer.run.path, "control.sock")
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="control", daemon=True)

    def __enter__(self) -> ControlServer:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise MiniverlError(f"cannot bind the control socket {self.endpoint}: {self._error}")
        record_socket(self.trainer.run.path, "control", self.endpoint)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _serve(self) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            check_endpoint(self.endpoint)
            if self.endpoint.startswith("ipc://"):
                Path(self.endpoint[6:]).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            sock.bind(self.endpoint)
        except Exception as exc:
            self._error = exc
            self._ready.set()
            sock.close()
            return
        sock_file = bound_file(self.endpoint)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(100):
                    continue
                frames = sock.recv_multipart()
                ident, body = frames[0], frames[1:]
                try:
                    reply = self._handle(parse_control(body, REQUESTS))
                except MiniverlError as exc:
                    reply = ControlError(id=0, ref_id=None, code="BAD_REQUEST", message=str(exc))
                try:
                    sock.send_multipart([ident, *encode(reply)])
                except zmq.ZMQError as exc:  # the asker went away; keep serving
                    log.debug("control reply dropped: %s", exc)
        finally:
            sock.close()
            remove_bound_file(sock_file)

    def _handle(self, req: Any) -> Any:
        trainer = self.trainer
        if isinstance(req, RetargetRequest):
            engine = is_engine_endpoint(req.endpoint)  # a vLLM or SGLang server
            check_engine_endpoint(req.endpoint) if engine else check_endpoint(req.endpoint)
            # The handshake at the update boundary waits up to unavailable_timeout_s for a
            # teacher that never answers, stalling training; a mistyped endpoint is
            # refused here instead, before anything waits on it (an engine: by the
            # handshake of vet_endpoint, over HTTP with its own timeouts).
            try:
                route = trainer.route_to_retarget(req.route)
                if not engine:
                    probe_teacher(req.endpoint, RETARGET_PROBE_S)
                if trainer.state is not None and trainer.state.policy is not None:
                    # The swap the run would refuse is refused now, before it is queued.
                    if route is not None:
                        vet_route(trainer.state, route, req.endpoint)
                    else:
                        vet_endpoint(trainer.state, req.endpoint, RETARGET_HANDSHAKE_S)
            except MiniverlError as exc:
                trainer.run.event("teacher_swap_refused", endpoint=req.endpoint,
                                  reason=str(exc), version=trainer.version)
                raise
            trainer.request_retarget(req.endpoint, route)
            trainer.run.event("retarget_requested", endpoint=req.endpoint, version=trainer.version,
                              **({"route": req.route} if req.route is not None else {}))
            return RetargetReply(id=req.id, endpoint=req.endpoint)
        if isinstance(req, StopRequest):
            trainer.run.event("stop_requested", checkpoint=req.checkpoint, version=trainer.version)
            trainer.stop_event.set()
            return StopReply(id=req.id, checkpoint=req.checkpoint)
        return StatusReply(id=req.id, **status_snapshot(trainer))
