"""Frame codec: round trips for every wire dtype, and malformed input never escapes as
anything but ProtocolError (the server loop relies on that to stay alive)."""

from __future__ import annotations

import contextlib

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from miniverl.common.errors import ProtocolError
from miniverl.protocol.codec import (
    BF16,
    as_bf16,
    bf16_from_float32,
    bf16_to_float32,
    bf16_words,
    decode,
    decode_header_only,
    encode,
)
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import ErrorCode, ProtocolViolation, Score, ScoreOk

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NUMPY_DTYPES = {"i4": "<i4", "i8": "<i8", "f4": "<f4", "f2": "<f2"}
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)


def ping_with(arrays):
    """A PING header carrying arbitrary arrays: fine for encode, refused by decode."""
    return encode({"v": 1, "t": "PING", "id": 1}, arrays)


def raw_round_trip(frames):
    """Decode frames without the per-type array rules (to test the array layer)."""
    header = decode_header_only(frames[0])
    arrays = {}
    for (name, code, shape), frame in zip(header["arrays"], frames[1:], strict=True):
        dtype = BF16 if code == "bf16" else np.dtype(NUMPY_DTYPES[code])
        arrays[name] = np.frombuffer(bytes(frame), dtype=dtype).reshape(shape)
    return header, arrays


def score_frames(n=6, k=4, **header):
    msg = Score(id=header.pop("id", 7), student_version=1, kind="topk", k=k, **header)
    arrays = {
        "tokens": np.arange(n, dtype=np.int32),
        "cu_seqlens": np.array([0, n], np.int32),
        "positions": np.arange(n - 1, dtype=np.int32),
    }
    return encode(msg, arrays)


@FAST
@given(
    code=st.sampled_from(sorted(NUMPY_DTYPES)),
    shape=SHAPES,
    data=st.data(),
    big_endian=st.booleans(),
    transpose=st.booleans(),
)
def test_round_trip_every_numeric_dtype(code, shape, data, big_endian, transpose):
    # Whatever layout the sender holds, the receiver gets the same values, little-endian.
    dtype = np.dtype(NUMPY_DTYPES[code])
    arr = data.draw(hnp.arrays(dtype, shape))
    if transpose and arr.ndim >= 2:
        arr = arr.T  # non-contiguous
    if big_endian:
        arr = arr.astype(dtype.newbyteorder(">"))
    header, out = raw_round_trip(ping_with({"x": arr}))
    assert header["arrays"] == [["x", code, list(arr.shape)]]
    assert out["x"].dtype == dtype and out["x"].shape == arr.shape
    np.testing.assert_array_equal(out["x"], arr.astype(dtype))


@FAST
@given(words=hnp.arrays(np.uint16, SHAPES), transpose=st.booleans())
def test_round_trip_bf16_as_raw_words(words, transpose):
    arr = as_bf16(words)
    if transpose and arr.ndim >= 2:
        arr = arr.T
    header, out = raw_round_trip(ping_with({"w": arr}))
    assert header["arrays"][0][1] == "bf16"
    assert out["w"].dtype == BF16
    np.testing.assert_array_equal(bf16_words(out["w"]), bf16_words(arr))


def test_bf16_conversion_rounds_to_nearest_even():
    x = np.array([1.0, -2.5, 3.140625, np.inf, -np.inf, 0.0, 1.00390625], np.float32)
    back = bf16_to_float32(bf16_from_float32(x))
    np.testing.assert_array_equal(back[:6], x[:6])
    assert back[6] == 1.0  # halfway between 1.0 and 1.0078125 rounds to even
    assert np.isnan(bf16_to_float32(bf16_from_float32(np.array([np.nan], np.float32))))[0]


def test_score_round_trip_is_zero_copy_and_typed():
    # Neither side copies array payloads: encode views the caller's array, decode
    # views the received frame (read-only when the frame is immutable bytes).
    tokens = np.arange(6, dtype=np.int32)
    msg = Score(id=7, student_version=1, kind="topk", k=4)
    arrays = {"tokens": tokens, "cu_seqlens": np.array([0, 6], np.int32)}
    arrays["positions"] = np.arange(5, dtype=np.int32)
    frames = encode(msg, arrays)
    out_msg, out = decode(frames)
    assert out_msg == msg and np.shares_memory(out["tokens"], tokens)
    _, received = decode([bytes(f) for f in frames])
    assert not received["tokens"].flags.writeable
    np.testing.assert_array_equal(received["positions"], np.arange(5))


def test_score_ok_with_empty_arrays_round_trips():
    msg = ScoreOk(
        id=3,
        student_version=0,
        instance="i",
        gen=0,
        kind="topk",
        k=2,
        timing={"queue_ms": 0.0, "compute_ms": 0.0},
    )
    arrays = {
        "ids": np.zeros((0, 2), np.int32),
        "logprobs": np.zeros((0, 2), np.float32),
        "tail_logmass": np.zeros(0, np.float32),
        "target_logprobs": np.zeros(0, np.float32),
    }
    out_msg, out = decode(encode(msg, arrays))
    assert out_msg == msg and out["ids"].shape == (0, 2)


def test_unsupported_dtype_is_refused_on_encode():
    with pytest.raises(ProtocolError, match="float64"):
        ping_with({"x": np.zeros(3, np.float64)})


def rejects(frames, code=ErrorCode.BAD_REQUEST, limits=None):
    with pytest.raises(ProtocolViolation) as info:
        decode(frames, limits)
    assert info.value.code == code, str(info.value)
    return info.value


def replace_header(frames, **changes):
    header = decode_header_only(frames[0])
    header.update(changes)
    for key, value in list(changes.items()):
        if value is ...:
            del header[key]
    return [msgpack.packb(header), *frames[1:]]


class TestMalformed:
    def test_truncated_msgpack(self):
        frames = score_frames()
        rejects([frames[0][:-3], *frames[1:]])

    def test_trailing_bytes_after_the_header(self):
        frames = score_frames()
        rejects([frames[0] + b"\x00", *frames[1:]])

    def test_wrong_frame_count(self):
        frames = score_frames()
        err = rejects(frames[:-1])
        assert err.ref_id == 7  # the server can still answer ERROR with the id
        rejects([*frames, b"extra"])
        rejects([])

    def test_size_mismatch(self):
        frames = score_frames()
        rejects([*frames[:-1], bytes(frames[-1])[:-1]])

    def test_unknown_dtype(self):
        frames = score_frames()
        header = decode_header_only(frames[0])
        header["arrays"][0][1] = "u4"
        rejects([msgpack.packb(header), *frames[1:]])

    def test_wrong_dtype_for_the_message(self):
        frames = score_frames()
        header = decode_header_only(frames[0])
        header["arrays"][0][1] = "f4"
        rejects([msgpack.packb(header), *frames[1:]])

    def test_huge_shapes(self):
        frames = score_frames()
        for shape in ([2**62], [2**40, 2**40], [-1], [1.5], [1, 1, 1, 1, 1, 1, 1, 1, 1]):
            header = decode_header_only(frames[0])
            header["arrays"][0][2] = shape
            with pytest.raises(ProtocolViolation):
                decode([msgpack.packb(header), *frames[1:]])

    def test_limits_on_tokens_positions_and_k(self):
        rejects(score_frames(n=50), ErrorCode.TOO_LARGE, Limits(max_tokens=10))
        rejects(score_frames(n=50), ErrorCode.TOO_LARGE, Limits(max_positions=10))
        rejects(score_frames(k=64), ErrorCode.TOO_LARGE, Limits(max_k=16))

    def test_non_map_header(self):
        for value in ([1, 2], 5, "SCORE", None, b"x"):
            rejects([msgpack.packb(value)])

    def test_unknown_type(self):
        rejects([msgpack.packb({"v": 1, "t": "FLY", "id": 1, "arrays": []})])

    def test_version_mismatch(self):
        err = rejects(replace_header(score_frames(), v=2), ErrorCode.VERSION_MISMATCH)
        assert err.ref_id == 7

    def test_extra_keys(self):
        rejects(replace_header(score_frames(), pickle=True))

    def test_missing_and_mistyped_fields(self):
        rejects(replace_header(score_frames(), student_version=...))
        rejects(replace_header(score_frames(), k="4"))
        rejects(replace_header(score_frames(), id=-1))
        rejects(replace_header(score_frames(), temperature=float("nan")))

    def test_ext_types_and_binary_strings(self):
        rejects([msgpack.packb({"v": 1, "t": "PING", "id": msgpack.ExtType(1, b"x")})])
        rejects([msgpack.packb({"v": 1, "t": "PING", "id": 1, "blob": b"\x00" * 4})])
        rejects([msgpack.packb({1: 1, "v": 1, "t": "PING", "id": 1})])

    def test_oversized_header(self):
        big = msgpack.packb({"v": 1, "t": "PING", "id": 1, "x": "a" * 70000})
        rejects([big], ErrorCode.TOO_LARGE)
        with pytest.raises(ProtocolViolation):
            encode({"v": 1, "t": "PING", "id": 1, "x": "a" * 70000})

    def test_deep_nesting(self):
        deep = msgpack.packb({"v": 1, "t": "PING", "id": 1, "x": [[[[[[[[[[[[1]]]]]]]]]]]]})
        rejects([deep])
        rejects([b"\x91" * 5000])

    def test_non_buffer_frames(self):
        frames = score_frames()
        rejects([frames[0], 12, object(), None])
        rejects([None])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(st.binary(max_size=64), min_size=0, max_size=5))
def test_random_bytes_only_ever_raise_protocol_error(frames):
    with contextlib.suppress(ProtocolError):
        decode(frames)


def _mutations():
    base = score_frames()
    return st.tuples(
        st.integers(0, len(base) - 1),
        st.integers(0, 200),
        st.binary(min_size=0, max_size=4),
        st.booleans(),
    ).map(lambda t: (base, *t))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_mutations())
def test_mutated_valid_messages_only_ever_raise_protocol_error(case):
    base, index, offset, patch, truncate = case
    frames = [bytes(f) for f in base]
    data = bytearray(frames[index])
    offset = offset % (len(data) + 1)
    data[offset : offset + len(patch)] = patch
    frames[index] = bytes(data[:offset]) if truncate else bytes(data)
    with contextlib.suppress(ProtocolError):
        decode(frames)


_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
header_values = (
    _scalars
    | st.lists(_scalars, max_size=3)
    | st.dictionaries(st.text(max_size=6), _scalars, max_size=3)
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    t=st.sampled_from(["SCORE", "SCORE_OK", "HELLO", "HELLO_OK", "STATUS_OK", "ERROR", "PONG",
                       "X"]),
    extra=st.dictionaries(
        st.sampled_from(["v", "id", "k", "kind", "arrays", "gen", "code", "teacher", "adapter",
                         "adapters", "zz"]),
        header_values,
        max_size=4,
    ),
)
def test_random_headers_only_ever_raise_protocol_error(t, extra):
    header = {"v": 1, "t": t, "id": 1, **extra}
    try:
        frame = msgpack.packb(header)
    except (OverflowError, ValueError, TypeError):
        return
    with contextlib.suppress(ProtocolError):
        decode([frame])
