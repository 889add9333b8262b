"""The student's control socket: ``STATUS``, ``RETARGET {endpoint}``, ``STOP {checkpoint}``.

Same framing as ``mvl-score/1`` (one msgpack header map, no arrays; ``v``, ``t``, ``id``),
on ``ipc://<run_dir>/control.sock`` where the student binds a ROUTER. Replies echo the
request's ``id``: ``STATUS_OK`` (progress, version, teacher, stale drops, throughput),
``RETARGET_OK`` (accepted; the swap happens at the next update boundary, and its
outcome is an event in the run), ``STOP_OK``, or ``ERROR {code, message}``.

:func:`control_request` is the blocking client the CLI uses (``miniverl status``,
``miniverl stop``, ``miniverl teacher use``). This module does not train or score.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import zmq
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from miniverl.common.errors import MiniverlError, ProtocolError, TeacherUnavailable
from miniverl.common.names import NAME
from miniverl.protocol.codec import decode_header_only, encode
from miniverl.protocol.endpoints import check_endpoint

SOCKETS_FILE = "sockets.json"


class _Control(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    id: int = Field(ge=0, le=2**63 - 1)
    if TYPE_CHECKING:  # each control message declares its own Literal type (not a field here)
        t: str


class StatusRequest(_Control):
    t: Literal["STATUS"] = "STATUS"


class RetargetRequest(_Control):
    t: Literal["RETARGET"] = "RETARGET"
    endpoint: str = Field(min_length=1, max_length=1024)
    # Several teachers (docs/several-teachers.md): the route to move; None for one teacher.
    # TEACHER or TEACHER/ADAPTER, each the one name pattern (common/names.py).
    route: str | None = Field(None, pattern=rf"^{NAME.pattern}(/{NAME.pattern})?$",
                              max_length=129)


class StopRequest(_Control):
    t: Literal["STOP"] = "STOP"
    checkpoint: bool = True


class StatusReply(_Control):
    t: Literal["STATUS_OK"] = "STATUS_OK"
    run_id: str
    status: str
    mode: str
    on_policy: bool
    step: int
    version: int
    cycle: int
    cycles: int
    wall_s: float
    teacher: dict[str, Any] | None = None
    endpoint: str | None = None
    counters: dict[str, int] = Field(default_factory=dict)
    last: dict[str, Any] = Field(default_factory=dict)
    # Several teachers: each route's counters and who scores it (None for one teacher).
    by_teacher: dict[str, dict[str, Any]] | None = None


class RetargetReply(_Control):
    t: Literal["RETARGET_OK"] = "RETARGET_OK"
    endpoint: str
    takes_effect: str = "next update boundary"


class StopReply(_Control):
    t: Literal["STOP_OK"] = "STOP_OK"
    checkpoint: bool


class ControlError(_Control):
    t: Literal["ERROR"] = "ERROR"
    ref_id: int | None = None
    code: str
    message: str


REQUESTS: dict[str, type[_Control]] = {
    "STATUS": StatusRequest,
    "RETARGET": RetargetRequest,
    "STOP": StopRequest,
}
REPLIES: dict[str, type[_Control]] = {
    "STATUS_OK": StatusReply,
    "RETARGET_OK": RetargetReply,
    "STOP_OK": StopReply,
    "ERROR": ControlError,
}


def parse_control(frames: list[Any], table: dict[str, type[_Control]]) -> _Control:
    """Decode one control message; every malformed input raises ProtocolError."""
    if len(frames) != 1:
        raise ProtocolError(f"control messages are one frame; got {len(frames)}")
    header = decode_header_only(frames[0])
    if not isinstance(header, dict):
        raise ProtocolError("control header must be a map")
    header = {k: v for k, v in header.items() if not (k == "arrays" and v == [])}
    name = header.get("t")
    cls = table.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ProtocolError(f"unknown control message t={header.get('t')!r}; expected {sorted(table)}")
    try:
        return cls.model_validate(header)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise ProtocolError(f"bad {cls.__name__} header: {where}: {err.get('msg')}") from None


def control_endpoint(run_dir: str | Path) -> str:
    """The control endpoint a running student recorded in ``<run>/sockets.json``."""
    path = Path(run_dir) / SOCKETS_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))["control"]
    except (OSError, ValueError, KeyError):
        raise MiniverlError(
            f"{run_dir} has no live control socket ({SOCKETS_FILE} is missing); the run is not "
            "running, or was started without `miniverl up`"
        ) from None


_ids = itertools.count(1)


def control_request(endpoint: str, request: _Control, timeout_s: float = 5.0) -> _Control:
    """Send one control request and wait for its reply; ERROR replies raise."""
    check_endpoint(endpoint)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart(encode(request))
        if not sock.poll(int(timeout_s * 1000)):
            raise TeacherUnavailable(
                f"no answer from the student's control socket {endpoint} within {timeout_s:g} s; "
                "is the run still going? (miniverl status reads status.json when it is not)"
            )
        reply = parse_control(sock.recv_multipart(), REPLIES)
    finally:
        sock.close()
    if isinstance(reply, ControlError):
        raise MiniverlError(f"student refused {request.t}: {reply.message}")
    return reply


def new_id() -> int:
    return next(_ids)
