"""Generated request bodies for the OpenAI-compatible front end (hypothesis strategies).

Shared by ``tests/teacher_server/test_openai_fuzz.py`` (a few dozen examples per test)
and ``benchmarks/http_fuzz.py`` (10,000+ per route). :func:`completion_bodies` mixes
valid requests, near-valid ones (one field replaced by any JSON value, dropped, or an
unknown field added), any JSON, raw bytes, and extremes (deep nesting, many prompts,
long prompts, huge numbers and strings). Each example is ``(kind, bytes)``.

Not a test module.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

FIELDS = ("model", "prompt", "max_tokens", "temperature", "prompt_logprobs", "n", "stream",
          "logprobs", "echo", "user", "miniverl_student_version")

leaves = (st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
          | st.floats() | st.text(max_size=20))
json_values = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=8), inner, max_size=5), max_leaves=25)


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # NaN and Infinity as Python writes them


def valid_bodies(model: str, vocab: int, max_k: int) -> st.SearchStrategy[dict]:
    ids = st.integers(0, vocab - 1)
    return st.fixed_dictionaries(
        {"model": st.just(model),
         "prompt": st.lists(st.lists(ids, min_size=1, max_size=24), min_size=1, max_size=4)
         | st.lists(ids, min_size=1, max_size=24),
         "prompt_logprobs": st.integers(1, max_k)},
        optional={"max_tokens": st.sampled_from([0, 1]),
                  "temperature": st.floats(0.05, 20.0),
                  "miniverl_student_version": st.integers(0, 10 ** 6),
                  "n": st.just(1), "stream": st.just(False), "echo": st.just(False),
                  "logprobs": st.none(), "user": st.text(max_size=12)})


@st.composite
def near_valid_bodies(draw, model: str, vocab: int, max_k: int) -> dict:
    body = draw(valid_bodies(model, vocab, max_k))
    how = draw(st.sampled_from(["replace", "drop", "add", "ids"]))
    if how == "replace":
        body[draw(st.sampled_from(FIELDS))] = draw(json_values)
    elif how == "drop":
        body.pop(draw(st.sampled_from(sorted(body))))
    elif how == "add":
        body[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
    else:  # ids just outside, far outside, of the wrong type
        bad = draw(st.sampled_from([-1, vocab, 2 ** 31, 2 ** 64, 1.5, "7", True, None, [1]]))
        body["prompt"] = [[1, 2, bad]]
    return body


@st.composite
def extreme_bodies(draw, model: str, vocab: int) -> bytes:
    kind = draw(st.sampled_from(["nest_list", "nest_object", "many_prompts", "long_prompt",
                                 "big_number", "big_string", "many_fields"]))
    n = draw(st.integers(1, 6))
    if kind == "nest_list":
        depth = draw(st.sampled_from([9, 50, 1000, 100_000]))
        return b"[" * depth + b"]" * depth
    if kind == "nest_object":
        depth = draw(st.sampled_from([9, 50, 1000, 100_000]))
        return b'{"a":' * depth + b"1" + b"}" * depth
    base = {"model": model, "prompt_logprobs": 1}
    if kind == "many_prompts":
        return dumps({**base, "prompt": [[1, 2]] * (10_000 * n)})
    if kind == "long_prompt":
        return dumps({**base, "prompt": [[1] * (20_000 * n)]})
    if kind == "big_number":
        return dumps({**base, "prompt": [[1, 2]], "prompt_logprobs": 10 ** (300 * n)})
    if kind == "big_string":
        return dumps({**base, "prompt": [[1, 2]], "user": "x" * (1 << 20) * n})
    return dumps({**base, "prompt": [[1, 2]], **{f"f{i}": i for i in range(5000 * n)}})


def completion_bodies(model: str, vocab: int, max_k: int) -> st.SearchStrategy[tuple[str, bytes]]:
    """``(kind, body)`` for ``POST /v1/completions``."""
    return st.one_of(
        valid_bodies(model, vocab, max_k).map(lambda b: ("valid", dumps(b))),
        near_valid_bodies(model, vocab, max_k).map(lambda b: ("near_valid", dumps(b))),
        json_values.map(lambda b: ("any_json", dumps(b))),
        st.binary(max_size=200).map(lambda b: ("bytes", b)),
        extreme_bodies(model, vocab).map(lambda b: ("extreme", b)),
    )


def model_requests() -> st.SearchStrategy[tuple[str, str, bytes, dict]]:
    """``(method, path, body, headers)`` for ``/v1/models`` (and its neighbours)."""
    return st.tuples(
        st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]),
        st.sampled_from(["/v1/models", "/v1/models/", "/v1/models?x=1", "/v1/models/fake",
                         "/v1/../v1/models", "/v1/models%00", "/v2/models"]),
        st.one_of(st.just(b""), st.binary(max_size=64), json_values.map(dumps)),
        st.dictionaries(st.sampled_from(["Authorization", "Content-Type", "Accept", "X-Any"]),
                        st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40),
                        max_size=3))
