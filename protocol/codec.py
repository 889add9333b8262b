"""Frame codec of ``mvl-score/1``: a msgpack header plus one raw frame per array.

``encode(header, arrays)`` returns ``[frame0, frame1, ...]``: frame 0 is a msgpack map
(at most 64 KiB) whose ``arrays`` key lists ``[name, dtype, shape]`` for each following
frame; frames 1..n are little-endian C-contiguous buffers (non-contiguous or
big-endian inputs are converted, contiguous little-endian ones are sent without a
copy). ``decode(frames, limits)`` reverses it with ``numpy.frombuffer`` (no copy; the
arrays are read-only views of the received frames) after checking every size against
``limits`` (``checks.check_limits``). Every malformed input raises :class:`ProtocolViolation` (a
``ProtocolError``) and nothing else; no msgpack ext types, no pickle.

dtypes: ``u1`` bytes (an xvocab episode's UTF-8), ``i4`` int32, ``i8`` int64, ``f4``
float32, ``f2`` float16, ``bf16``. numpy has
no bfloat16, so bf16 travels as raw 16-bit words and is represented here by
:data:`BF16`, a one-field structured dtype over ``<u2``: :func:`bf16_from_float32`
and :func:`bf16_to_float32` convert, :func:`bf16_words` gives the ``uint16`` view
(``torch.from_numpy(words.view(np.int16)).view(torch.bfloat16)`` on the torch side).
A dtype named ``bfloat16`` with itemsize 2 (e.g. from ml_dtypes) is also accepted.

This module checks sizes, not values (``checks.py``), and owns no socket.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np
from pydantic import BaseModel

from miniverl.protocol.checks import check_limits
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import (
    MAX_ID,
    ErrorCode,
    Message,
    ProtocolViolation,
    expected_arrays,
    parse_header,
)

BF16 = np.dtype([("bf16", "<u2")])
"""bfloat16 as raw little-endian 16-bit words (numpy has no native bfloat16)."""

WIRE_DTYPES: dict[str, np.dtype] = {
    "u1": np.dtype("u1"),
    "i4": np.dtype("<i4"),
    "i8": np.dtype("<i8"),
    "f4": np.dtype("<f4"),
    "f2": np.dtype("<f2"),
    "bf16": BF16,
}
_KIND_TO_CODE = {("u", 1): "u1", ("i", 4): "i4", ("i", 8): "i8", ("f", 4): "f4",
                 ("f", 2): "f2"}
_DEFAULT_LIMITS = Limits()


def bf16_words(arr: np.ndarray) -> np.ndarray:
    """The raw ``uint16`` words of a :data:`BF16` array (a view, no copy)."""
    return arr.view("<u2")


def as_bf16(words: np.ndarray) -> np.ndarray:
    """Flag a ``uint16`` array of bfloat16 bit patterns as :data:`BF16` (a view when possible)."""
    words = np.asarray(words).astype("<u2", order="C", copy=False)
    return words.view(BF16)


def bf16_from_float32(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest even; NaN stays NaN) as a :data:`BF16` array."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    words = np.where(nan, (bits >> 16) | 0x40, rounded).astype("<u2")
    return words.view(BF16)


def bf16_to_float32(arr: np.ndarray) -> np.ndarray:
    """Widen a :data:`BF16` array to float32 exactly."""
    words = np.ascontiguousarray(bf16_words(arr)).astype("<u4") << 16
    return words.view("<f4")


def wire_dtype(dtype: np.dtype) -> str:
    """The wire code for a numpy dtype, or :class:`ProtocolViolation` if it has none."""
    if dtype == BF16 or (dtype.name == "bfloat16" and dtype.itemsize == 2):
        return "bf16"
    code = _KIND_TO_CODE.get((dtype.kind, dtype.itemsize))
    if code is None:
        raise ProtocolViolation(
            f"dtype {dtype} cannot travel on mvl-score/1; use one of {sorted(WIRE_DTYPES)}"
        )
    return code


def _as_wire_array(name: str, value: Any) -> tuple[str, np.ndarray]:
    arr = np.asarray(value)
    code = wire_dtype(arr.dtype)
    if code == "bf16":
        arr = arr.view(BF16) if arr.dtype != BF16 else arr
    else:
        arr = arr.astype(WIRE_DTYPES[code], copy=False)  # big-endian -> little-endian
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
    return code, arr


def encode(
    header: dict[str, Any] | BaseModel,
    arrays: dict[str, np.ndarray] | None = None,
    *,
    max_header_bytes: int = _DEFAULT_LIMITS.max_header_bytes,
) -> list[bytes | memoryview]:
    """Frames for one message: ``[msgpack header, array buffers...]``.

    ``header`` is a message model or a plain map (``v``/``t``/``id`` included); its
    ``arrays`` key is written from ``arrays`` (insertion order = frame order).
    Raises :class:`ProtocolViolation` for an unsupported dtype, a header that
    msgpack cannot encode, or one larger than ``max_header_bytes``.
    """
    if isinstance(header, BaseModel):
        fields = header.model_dump(mode="json")
    elif isinstance(header, dict):
        fields = dict(header)
    else:
        raise ProtocolViolation(f"header must be a map or a message, got {type(header).__name__}")
    specs: list[list[Any]] = []
    frames: list[bytes | memoryview] = []
    for name, value in (arrays or {}).items():
        code, arr = _as_wire_array(name, value)
        specs.append([name, code, list(arr.shape)])
        frames.append(arr.reshape(-1).view(np.uint8).data)
    fields["arrays"] = specs
    try:
        head = msgpack.packb(fields, use_bin_type=True, datetime=False, strict_types=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolViolation(f"header cannot be encoded as msgpack: {exc}") from None
    if len(head) > max_header_bytes:
        raise ProtocolViolation(
            f"header is {len(head)} bytes; the limit is {max_header_bytes}", ErrorCode.TOO_LARGE
        )
    return [head, *frames]


def _buffer(frame: Any) -> memoryview:
    """A flat byte view of a frame: bytes, memoryview, numpy array or ``zmq.Frame``."""
    try:
        view = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        if view.ndim != 1 or view.format not in ("B", "b", "c"):
            view = view.cast("B")
        return view
    except (TypeError, ValueError, AttributeError, BufferError) as exc:
        raise ProtocolViolation(f"frame is not a byte buffer: {exc}") from None


def _unpack(head: memoryview, limits: Limits) -> Any:
    if len(head) > limits.max_header_bytes:
        raise ProtocolViolation(
            f"header is {len(head)} bytes; the limit is {limits.max_header_bytes}",
            ErrorCode.TOO_LARGE,
        )
    try:
        return msgpack.unpackb(
            head,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_bin_len=0,
            max_ext_len=0,
            max_str_len=limits.max_str_len,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            timestamp=0,
        )
    except Exception as exc:  # msgpack raises ValueError, ExtraData, FormatError, StackError...
        raise ProtocolViolation(
            f"header is not valid msgpack ({type(exc).__name__}: {str(exc)[:120]})"
        ) from None


def decode_header_only(frame0: Any, limits: Limits | None = None) -> dict[str, Any]:
    """Unpack frame 0 to a map without validating it (to recover ``id`` for an ERROR)."""
    header = _unpack(_buffer(frame0), limits or _DEFAULT_LIMITS)
    if not isinstance(header, dict):
        raise ProtocolViolation(f"header must be a map, got {type(header).__name__}")
    return header


def _array_specs(raw: Any, limits: Limits, ref_id: int | None) -> list[tuple[str, str, tuple]]:
    def bad(text: str, code: ErrorCode = ErrorCode.BAD_REQUEST) -> ProtocolViolation:
        return ProtocolViolation(text, code, ref_id)

    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad("'arrays' must be a list of [name, dtype, shape]")
    if len(raw) > limits.max_arrays:
        raise bad(f"{len(raw)} arrays; the limit is {limits.max_arrays}", ErrorCode.TOO_LARGE)
    specs, seen = [], set()
    for entry in raw:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise bad(f"array entry {entry!r:.80} is not [name, dtype, shape]")
        name, code, shape = entry
        if not isinstance(name, str) or not name or name in seen:
            raise bad(f"array name {name!r:.80} is empty, not a string or repeated")
        seen.add(name)
        if not isinstance(code, str) or code not in WIRE_DTYPES:
            raise bad(f"array {name!r} has unknown dtype {code!r:.40}; use {sorted(WIRE_DTYPES)}")
        if not isinstance(shape, list) or len(shape) > limits.max_dims:
            raise bad(f"array {name!r} shape must be a list of at most {limits.max_dims} dims")
        if not all(type(d) is int and 0 <= d <= MAX_ID for d in shape):
            raise bad(f"array {name!r} shape {shape!r:.80} must hold non-negative ints")
        nbytes = math.prod(shape) * WIRE_DTYPES[code].itemsize
        if nbytes > limits.max_array_bytes:
            raise bad(
                f"array {name!r} would be {nbytes} bytes; the limit is {limits.max_array_bytes}",
                ErrorCode.TOO_LARGE,
            )
        specs.append((name, code, tuple(shape)))
    return specs


def decode(
    frames: Sequence[Any], limits: Limits | None = None
) -> tuple[Message, dict[str, np.ndarray]]:
    """Parse frames into ``(message, arrays)``; arrays are read-only zero-copy views.

    Checks: header size and msgpack caps, a map with a known ``t`` and only its keys,
    frame count = 1 + len(arrays), known dtypes, dims, ``prod(shape) * itemsize ==
    len(frame)``, the arrays the type requires (names, dtypes, ndim) and the size
    limits. Raises :class:`ProtocolViolation` (with ``code`` and ``ref_id``) for any
    malformed input and never anything else.
    """
    limits = limits or _DEFAULT_LIMITS
    try:
        count = len(frames)
    except TypeError:
        raise ProtocolViolation("frames must be a sequence") from None
    if count == 0:
        raise ProtocolViolation("empty message: no header frame")
    if count > limits.max_arrays + 1:
        raise ProtocolViolation(f"{count} frames; at most {limits.max_arrays + 1} are allowed")
    header = decode_header_only(frames[0], limits)
    msg = parse_header(header)
    rid = msg.id
    specs = _array_specs(header.get("arrays"), limits, rid)
    if count != 1 + len(specs):
        raise ProtocolViolation(
            f"header lists {len(specs)} arrays but {count - 1} data frames arrived",
            ref_id=rid,
        )
    arrays: dict[str, np.ndarray] = {}
    for (name, code, shape), frame in zip(specs, frames[1:], strict=True):
        buf = _buffer(frame)
        dtype = WIRE_DTYPES[code]
        nbytes = math.prod(shape) * dtype.itemsize
        if len(buf) != nbytes:
            raise ProtocolViolation(
                f"array {name!r} {code}{list(shape)} needs {nbytes} bytes, frame has {len(buf)}",
                ref_id=rid,
            )
        try:
            if nbytes == 0:
                arr = np.zeros(shape, dtype=dtype)
                arr.flags.writeable = False
            else:
                arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
        except (ValueError, TypeError, BufferError) as exc:
            raise ProtocolViolation(f"array {name!r} cannot be read: {exc}", ref_id=rid) from None
        arrays[name] = arr
    want = expected_arrays(msg)
    got = {name: (code, len(shape)) for name, code, shape in specs}
    if got != want:
        need = ", ".join(f"{n} {c} {d}-D" for n, (c, d) in want.items()) or "no arrays"
        raise ProtocolViolation(f"{msg.t} must carry {need}; got {sorted(got)}", ref_id=rid)
    check_limits(msg, arrays, limits)
    return msg, arrays
