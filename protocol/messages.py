"""Typed headers of ``mvl-score/1`` (docs/protocol.md): one pydantic model per message type.

Each model is the msgpack map in frame 0 minus its ``arrays`` list, with the field names
of docs/protocol.md ("Messages") exactly as they travel. Models are strict (``extra="forbid"``, no
coercion of ``"5"`` into ``5``, no NaN), so a header either parses into the model
its ``t`` names or :func:`parse_header` raises :class:`ProtocolViolation` carrying
the error code the server answers with. :func:`expected_arrays` says which arrays
(name, dtype, ndim) each message must carry; ``checks.py`` checks their contents.

This module does not touch bytes (see ``codec.py``) or sockets (``link.py``,
the teacher server in ``teacher_server/``).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from miniverl.common.errors import ProtocolError
from miniverl.common.names import MAX_NAME, NAME

PROTOCOL_VERSION: Final = 1
PROTOCOL_NAME = "mvl-score/1"
MAX_ID = 2**63 - 1


def _omit(data: dict[str, Any], *names: str, default: Any = None) -> dict[str, Any]:
    """``data`` without the fields of ``names`` that hold their unset value (``None``, or
    ``default``): a header carries an optional field only when it says something, so a
    peer that predates the field reads the header it always read."""
    for name in names:
        if data.get(name) in (None, default):
            data.pop(name, None)
    return data


class ErrorCode(str, Enum):
    """The ``code`` of an ``ERROR`` reply (docs/protocol.md, "ERROR")."""

    BAD_REQUEST = "BAD_REQUEST"
    VERSION_MISMATCH = "VERSION_MISMATCH"
    NEED_HELLO = "NEED_HELLO"
    TOKENIZER_MISMATCH = "TOKENIZER_MISMATCH"
    TOO_LARGE = "TOO_LARGE"
    UNSUPPORTED = "UNSUPPORTED"
    OVERLOADED = "OVERLOADED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    RELOADING = "RELOADING"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    INTERNAL = "INTERNAL"
    TEACHER_DEAD = "TEACHER_DEAD"
    UNAUTHORIZED = "UNAUTHORIZED"


class TeacherState(str, Enum):
    """The ``state`` a teacher reports in ``PONG``/``STATUS_OK``."""

    LOADING = "LOADING"
    READY = "READY"
    RELOADING = "RELOADING"
    PARKED = "PARKED"
    DRAINING = "DRAINING"


class ProtocolViolation(ProtocolError):
    """A malformed message, with the ``ERROR`` code a server answers it with.

    ``ref_id`` is the request id when the header got far enough to have one, else None.
    """

    def __init__(
        self,
        message: str,
        code: ErrorCode = ErrorCode.BAD_REQUEST,
        ref_id: int | None = None,
    ):
        super().__init__(message)
        self.code = ErrorCode(code)
        self.ref_id = ref_id


# Annotated scalar types shared by the models. Enum fields are not strict so a plain
# string from msgpack validates into the enum.
Id = Annotated[int, Field(ge=0, le=MAX_ID)]
Count = Annotated[int, Field(ge=0, le=MAX_ID)]
Name = Annotated[str, Field(max_length=1024)]
# An adapter's name (HELLO, SCORE, HELLO_OK's list): the one pattern of every teacher,
# route and adapter name (common/names.py), so a peer's name never reaches a path or a
# log line as anything else.
AdapterName = Annotated[str, Field(pattern=rf"^{NAME.pattern}$", max_length=MAX_NAME)]
# A vocabulary size and a top-k, both within int32 (token ids travel as i4).
VocabSize = Annotated[int, Field(ge=1, le=2**31 - 1)]
TopK = Annotated[int, Field(ge=0, le=2**31 - 1)]
Code = Annotated[ErrorCode, Field(strict=False)]
State = Annotated[TeacherState, Field(strict=False)]
Kind = Literal["topk", "exact", "xvocab"]
Mode = Literal["drain", "abort"]
# Target kinds a client may announce in HELLO (``understands``): kinds an old client
# does not know, advertised in HELLO_OK only to a client that named them.
Negotiated = Literal["xvocab"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class TeacherInfo(_Wire):
    """Who the teacher is: name, model id/path, pinned revision, adapter digest."""

    name: Name
    model: Name
    revision: Name | None = None
    adapter_sha256: Name | None = None


# A teacher serves at most this many named adapters (``--adapters``): HELLO_OK lists
# them all, within the header's 256-item lists and 65,536 bytes.
MAX_ADAPTERS = 64


class AdapterInfo(_Wire):
    """One adapter a teacher serves under a name (docs/protocol.md, "Adapters"): the
    name a HELLO and a SCORE ask for, and the digest of its files (``adapter_sha256``)."""

    name: AdapterName
    adapter_sha256: Name


class TopkKind(_Wire):
    k_max: int = Field(ge=1, le=MAX_ID)


class ExactKind(_Wire):
    max_vocab: int = Field(ge=1, le=MAX_ID)


class XvocabKind(_Wire):
    """Cross-tokenizer targets (docs/protocol.md, "xvocab"): the teacher tokenizes the
    episode itself; ``k_max`` bounds its top-k, ``max_episode_bytes`` the episode."""

    k_max: int = Field(ge=1, le=MAX_ID)
    max_episode_bytes: int = Field(ge=1, le=MAX_ID)


class Kinds(_Wire):
    """Scoring kinds a teacher serves; ``exact`` is None when it serves top-k only.

    ``xvocab`` is sent only to a client that announced it understands it (HELLO
    ``understands``) and is left off the wire otherwise, so an old client's HELLO_OK
    is byte for byte what it was before the kind existed.
    """

    topk: TopkKind
    exact: ExactKind | None = None
    xvocab: XvocabKind | None = None

    @model_serializer(mode="wrap")
    def _omit_unset_xvocab(self, handler: Any) -> dict[str, Any]:
        return _omit(handler(self), "xvocab")


class ServerLimits(_Wire):
    max_tokens: int = Field(ge=1, le=MAX_ID)
    max_positions: int = Field(ge=1, le=MAX_ID)
    max_inflight: int = Field(ge=1, le=MAX_ID)


class Timing(_Wire):
    queue_ms: float = Field(ge=0)
    compute_ms: float = Field(ge=0)


class Counters(_Wire):
    """Teacher-side counters in ``STATUS_OK``. ``replies_dropped`` (replies to a client
    whose queue of unread replies was full) is off the wire while 0, so a teacher that
    dropped none answers what a client that predates the field reads."""

    requests: Count = 0
    positions: Count = 0
    errors: dict[Name, Count] = Field(default_factory=dict)
    bytes_received: Count = 0
    bytes_sent: Count = 0
    replies_dropped: Count = 0

    @model_serializer(mode="wrap")
    def _omit_no_drops(self, handler: Any) -> dict[str, Any]:
        return _omit(handler(self), "replies_dropped", default=0)


class DeviceMemory(_Wire):
    """Accelerator memory in ``STATUS_OK``; byte counts are None on CPU."""

    device: Name
    allocated_bytes: Count | None = None
    reserved_bytes: Count | None = None
    total_bytes: Count | None = None


class Message(_Wire):
    """Fields every message carries: protocol major ``v``, type ``t``, request ``id``."""

    v: Literal[1] = PROTOCOL_VERSION
    id: Id
    if TYPE_CHECKING:  # each message type declares its own Literal type (not a field here)
        t: str


class Hello(Message):
    """``understands`` (optional, off the wire when None, so an old client's HELLO is
    unchanged): target kinds beyond ``topk``/``exact`` this client can read. A client
    that names ``xvocab`` may have another tokenizer than the teacher. ``adapter``
    (optional, off the wire when None): the served adapter this client scores with;
    HELLO_OK's ``teacher`` is then that adapter's identity."""

    t: Literal["HELLO"] = "HELLO"
    client: Name
    tokenizer_fp: Name
    vocab_size: VocabSize
    understands: Annotated[list[Negotiated], Field(min_length=1, max_length=8)] | None = None
    adapter: AdapterName | None = None

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        return _omit(handler(self), "understands", "adapter")


class HelloOk(Message):
    """``adapters`` (off the wire when None, so a one-model teacher's HELLO_OK is what it
    always was): every adapter a teacher started with ``--adapters`` serves."""

    t: Literal["HELLO_OK"] = "HELLO_OK"
    teacher: TeacherInfo
    instance: Name
    gen: Count
    tokenizer_fp: Name
    vocab_size: VocabSize
    kinds: Kinds
    limits: ServerLimits
    heartbeat_ms: int = Field(ge=1, le=3_600_000)
    server_version: Name
    adapters: Annotated[list[AdapterInfo], Field(max_length=MAX_ADAPTERS)] | None = None

    @model_serializer(mode="wrap")
    def _omit_unset_adapters(self, handler: Any) -> dict[str, Any]:
        return _omit(handler(self), "adapters")


# The temperatures a SCORE may ask for; docs/protocol.md ("Temperature") says why.
TEMPERATURE_MIN = 0.05
TEMPERATURE_MAX = 20.0


class Score(Message):
    """Score ``positions`` of packed ``tokens``; ``deadline_ms`` is a budget from receipt.

    ``deterministic`` (optional; off the wire when false, so an older teacher still
    parses the header): score it alone, bit-identical however requests arrive.
    ``kind="xvocab"`` carries other arrays (:data:`XVOCAB_SCORE_ARRAYS`): the episode
    the teacher renders with its own tokenizer and chat template (docs/protocol.md,
    "xvocab"). ``adapter`` (optional, off the wire when None): the served adapter that
    scores it (docs/protocol.md, "Adapters").
    """

    t: Literal["SCORE"] = "SCORE"
    student_version: Count
    kind: Kind
    k: TopK = 0
    temperature: float = 1.0
    deadline_ms: int | None = Field(None, ge=0, le=MAX_ID)
    deterministic: bool = False
    adapter: AdapterName | None = None

    @field_validator("temperature")
    @classmethod
    def _temperature_in_range(cls, value: float) -> float:
        if not TEMPERATURE_MIN <= value <= TEMPERATURE_MAX:
            raise ValueError(f"temperature={value} is outside [{TEMPERATURE_MIN}, "
                             f"{TEMPERATURE_MAX}]; pick one inside (docs/protocol.md)")
        return value

    @model_validator(mode="after")
    def _k_matches_kind(self) -> Score:
        if self.kind in ("topk", "xvocab") and self.k < 1:
            raise ValueError(f"k={self.k} but a {self.kind} SCORE needs k >= 1")
        return self

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        return _omit(_omit(handler(self), "deterministic", default=False), "adapter")


class ScoreOk(Message):
    """``episode_sha256`` and ``alignment_sha256``: an xvocab reply's digests of the
    request it scored and of the alignment it used (both required there, off the wire
    for the other kinds)."""

    t: Literal["SCORE_OK"] = "SCORE_OK"
    student_version: Count
    instance: Name
    gen: Count
    kind: Kind
    k: TopK
    timing: Timing
    episode_sha256: Name | None = None
    alignment_sha256: Name | None = None

    @model_validator(mode="after")
    def _digests_match_kind(self) -> ScoreOk:
        has = (self.episode_sha256 is not None, self.alignment_sha256 is not None)
        if has != ((self.kind == "xvocab"),) * 2:
            raise ValueError("an xvocab SCORE_OK carries episode_sha256 and alignment_sha256 "
                             f"and no other kind does; got kind={self.kind!r}")
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_digests(self, handler: Any) -> dict[str, Any]:
        return _omit(handler(self), "episode_sha256", "alignment_sha256")


class ErrorReply(Message):
    """``ERROR``: ``id`` and ``ref_id`` are the request's id, or None when it had none."""

    t: Literal["ERROR"] = "ERROR"
    id: Id | None = None  # type: ignore[assignment]  # the one message whose id may be unknown
    ref_id: Id | None = None
    code: Code
    message: Annotated[str, Field(max_length=8192)]
    retryable: bool = False
    instance: Name | None = None
    gen: Count | None = None


class Ping(Message):
    t: Literal["PING"] = "PING"


class _Liveness(Message):
    """Fields ``PONG`` and ``STATUS_OK`` share (``t`` is declared here to keep it third
    on the wire, before these fields: msgpack keeps the order of the map)."""

    t: str
    instance: Name
    gen: Count
    state: State
    inflight: Count
    queue_depth: Count
    last_progress_ms: float = Field(ge=0)


class Pong(_Liveness):
    t: Literal["PONG"] = "PONG"


class Status(Message):
    t: Literal["STATUS"] = "STATUS"


class StatusOk(_Liveness):
    """``adapters``: as in HELLO_OK (off the wire when None)."""

    t: Literal["STATUS_OK"] = "STATUS_OK"
    teacher: TeacherInfo | None = None
    counters: Counters = Field(default_factory=Counters)
    memory: DeviceMemory | None = None
    adapters: Annotated[list[AdapterInfo], Field(max_length=MAX_ADAPTERS)] | None = None

    @model_serializer(mode="wrap")
    def _omit_unset_adapters(self, handler: Any) -> dict[str, Any]:
        return _omit(handler(self), "adapters")


class AdminRequest(Message):
    """An admin message (``RELOAD``, ``PARK``, ``WAKE``, ``SHUTDOWN``): ``auth`` carries
    the teacher's admin token when the connection has no admin CURVE key. Optional, and
    left off the wire when None, so a teacher that predates it still parses the header."""

    t: str
    auth: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    @model_serializer(mode="wrap")
    def _omit_empty_auth(self, handler: Any) -> dict[str, Any]:
        return _omit(handler(self), "auth")


ADMIN_TYPES = frozenset({"RELOAD", "PARK", "WAKE", "SHUTDOWN"})


class Reload(AdminRequest):
    t: Literal["RELOAD"] = "RELOAD"
    model: Name
    revision: Name | None = None
    adapter: Name | None = None
    adapter_revision: Name | None = None  # pins a hub adapter id, as revision pins model
    mode: Mode = "drain"


class ReloadOk(Message):
    t: Literal["RELOAD_OK"] = "RELOAD_OK"
    gen: Count
    teacher: TeacherInfo


class Park(AdminRequest):
    t: Literal["PARK"] = "PARK"


class ParkOk(Message):
    t: Literal["PARK_OK"] = "PARK_OK"
    state: State


class Wake(AdminRequest):
    t: Literal["WAKE"] = "WAKE"


class WakeOk(Message):
    t: Literal["WAKE_OK"] = "WAKE_OK"
    state: State


class Shutdown(AdminRequest):
    t: Literal["SHUTDOWN"] = "SHUTDOWN"
    mode: Mode = "drain"
    timeout_s: float | None = Field(None, ge=0, le=86400)


class ShutdownOk(Message):
    t: Literal["SHUTDOWN_OK"] = "SHUTDOWN_OK"


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.model_fields["t"].default: cls
    for cls in (
        Hello, HelloOk, Score, ScoreOk, ErrorReply, Ping, Pong, Status, StatusOk,
        Reload, ReloadOk, Park, ParkOk, Wake, WakeOk, Shutdown, ShutdownOk,
    )
}  # fmt: skip

ArraySpec = tuple[str, int]  # (dtype code, ndim)
SCORE_ARRAYS: dict[str, ArraySpec] = {"tokens": ("i4", 1), "cu_seqlens": ("i4", 1), "positions": ("i4", 1)}  # fmt: skip
TOPK_ARRAYS: dict[str, ArraySpec] = {
    "ids": ("i4", 2),
    "logprobs": ("f4", 2),
    "tail_logmass": ("f4", 1),
    "target_logprobs": ("f4", 1),
}
EXACT_ARRAYS: dict[str, ArraySpec] = {"logprobs": ("f4", 2), "target_logprobs": ("f4", 1)}
# xvocab (docs/protocol.md, "xvocab"): the episode as UTF-8 JSON bytes, the student's
# token cuts over its own rendering and where each content sits in that rendering,
# [C, 3] rows of (start, end, offset) in bytes.
XVOCAB_SCORE_ARRAYS: dict[str, ArraySpec] = {
    "episode": ("u1", 1),
    "student_cuts": ("i4", 1),
    "student_pieces": ("i4", 2),
}
# The teacher's tokens, the alignment groups ([G, 6]: student start, end, teacher
# start, end, provenance, trainable) and top-k targets at its scored positions.
XVOCAB_ARRAYS: dict[str, ArraySpec] = {
    "teacher_ids": ("i4", 1),
    "groups": ("i4", 2),
    "positions": ("i4", 1),
    **TOPK_ARRAYS,
}


def expected_arrays(msg: Message) -> dict[str, ArraySpec]:
    """The arrays ``msg`` must carry, exactly: name -> (dtype code, ndim)."""
    if isinstance(msg, Score):
        return XVOCAB_SCORE_ARRAYS if msg.kind == "xvocab" else SCORE_ARRAYS
    if isinstance(msg, ScoreOk):
        return {"topk": TOPK_ARRAYS, "exact": EXACT_ARRAYS, "xvocab": XVOCAB_ARRAYS}[msg.kind]
    return {}


def _id_of(header: dict) -> int | None:
    value = header.get("id")
    if type(value) is int and 0 <= value <= MAX_ID:
        return value
    return None


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"]) or "<header>"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {first['msg']}{more}"


def parse_header(header: Any) -> Message:
    """Validate a decoded header map into the model its ``t`` names.

    An ``arrays`` key is ignored here (the codec checks it against the frames).
    Raises :class:`ProtocolViolation`: ``VERSION_MISMATCH`` when ``v`` is not 1,
    ``BAD_REQUEST`` for a non-map, an unknown ``t``, an unknown key or a bad field.
    """
    if not isinstance(header, dict):
        raise ProtocolViolation(f"header must be a map, got {type(header).__name__}")
    ref_id = _id_of(header)
    version = header.get("v")
    if version is None:
        raise ProtocolViolation("header has no 'v'; mvl-score/1 headers carry v=1", ref_id=ref_id)
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolViolation(
            f"protocol version v={version!r} is not supported; this side speaks v=1",
            ErrorCode.VERSION_MISMATCH,
            ref_id,
        )
    kind = header.get("t")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolViolation(
            f"unknown message type t={kind!r}; expected one of {sorted(MESSAGE_TYPES)}",
            ref_id=ref_id,
        )
    fields = {key: value for key, value in header.items() if key != "arrays"}
    try:
        return cls.model_validate(fields)
    except ValidationError as exc:
        raise ProtocolViolation(f"bad {kind} header: {_first_error(exc)}", ref_id=ref_id) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ProtocolViolation(f"bad {kind} header: {exc}", ref_id=ref_id) from None


def header_dict(msg: Message) -> dict[str, Any]:
    """The wire map for ``msg`` (enums as strings), without ``arrays``."""
    return msg.model_dump(mode="json")
