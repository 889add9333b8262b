"""Generated xvocab SCOREs for the teacher server (hypothesis strategies).

Shared by ``tests/protocol/test_xvocab_fuzz.py`` (a few dozen examples) and
``benchmarks/http_fuzz.py`` (10,000+). Each example is ``(header, arrays)`` for a raw
connection's ``send``: a valid episode with one thing changed (the episode's bytes, its
JSON, a message, the cuts, the pieces, a header field, an array's dtype or shape), or
arrays of random values. Every one must get a reply (``SCORE_OK`` or ``ERROR``) and
leave the server serving.

Not a test module.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import strategies as st

from tests.teacher_server.openai_bodies import json_values

# A header value msgpack can carry (a client cannot even encode a larger integer).
header_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 63), 2 ** 64 - 1) | st.floats()
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=8), inner, max_size=5), max_leaves=25)

HEADER = {"v": 1, "t": "SCORE", "student_version": 0, "kind": "xvocab", "k": 4,
          "temperature": 1.0}
ints = st.integers(min_value=-(2 ** 31), max_value=2 ** 31 - 1)


def int_array(shape_max: int = 12, width: int | None = None) -> st.SearchStrategy[np.ndarray]:
    rows = st.integers(0, shape_max)
    if width is None:
        return st.lists(ints, max_size=shape_max).map(lambda v: np.array(v, np.int32))
    return rows.flatmap(lambda n: st.lists(st.lists(ints, min_size=width, max_size=width),
                                           min_size=n, max_size=n)).map(
        lambda v: np.array(v, np.int32).reshape(-1, width))


@st.composite
def xvocab_scores(draw, base: dict[str, np.ndarray]) -> tuple[dict[str, Any], dict]:
    """``base``: a valid xvocab request's arrays (episode, student_cuts, student_pieces)."""
    header = dict(HEADER)
    arrays = {name: np.array(value) for name, value in base.items()}
    how = draw(st.sampled_from(["episode_bytes", "episode_json", "message", "cuts",
                                "pieces", "header", "dtype", "random"]))
    if how == "episode_bytes":
        raw = bytearray(arrays["episode"].tobytes())
        for _ in range(draw(st.integers(1, 8))):
            if raw:
                raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        arrays["episode"] = np.frombuffer(bytes(raw), np.uint8)
    elif how == "episode_json":
        arrays["episode"] = np.frombuffer(json.dumps(draw(json_values)).encode(), np.uint8)
    elif how == "message":
        episode = json.loads(arrays["episode"].tobytes())
        key = draw(st.sampled_from(["messages", "tools", "text"]))
        if key == "messages" and episode["messages"]:
            i = draw(st.integers(0, len(episode["messages"]) - 1))
            field = draw(st.sampled_from(["role", "content", "tool_calls", "name", "extra"]))
            episode["messages"][i][field] = draw(json_values)
        else:
            episode[key] = draw(json_values)
        arrays["episode"] = np.frombuffer(json.dumps(episode).encode(), np.uint8)
    elif how == "cuts":
        arrays["student_cuts"] = draw(int_array(40))
    elif how == "pieces":
        arrays["student_pieces"] = draw(int_array(12, width=3))
    elif how == "header":
        field = draw(st.sampled_from(["k", "temperature", "student_version", "kind", "v",
                                      "deadline_ms", "id", "extra"]))
        header[field] = draw(header_values)
    elif how == "dtype":
        name = draw(st.sampled_from(sorted(arrays)))
        arrays[name] = arrays[name].astype(draw(st.sampled_from(["<i8", "<f4", "<i4", "u1"])))
    else:
        arrays = {"episode": np.frombuffer(draw(st.binary(max_size=200)), np.uint8),
                  "student_cuts": draw(int_array(20)),
                  "student_pieces": draw(int_array(6, width=3))}
    return header, arrays
