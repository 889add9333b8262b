"""Generated requests at the OpenAI-compatible front end (``teacher_server/openai_http.py``).

What a user relies on (docs/engine-teachers.md, "Rules it keeps"): whatever a client
sends to ``/v1/completions`` or ``/v1/models`` — valid, near-valid or garbage JSON,
wrong types, extreme sizes and nesting, any field of the request — is answered with a
2xx or a 4xx JSON error, within a bounded time; never a 5xx, never a logged error or
traceback, and the process keeps serving. The suite runs a few dozen examples per
test (the completion bodies, up to 120,000 tokens, in the slow tier: over 2 s);
``benchmarks/http_fuzz.py`` runs 10,000+ per route against a real ``miniverl teacher
serve --openai`` process.
"""

from __future__ import annotations

import json
import logging
import time

import pytest

from tests.extras import require

require("aiohttp")
httpx = require("httpx")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from miniverl.testing import FAKE_VOCAB  # noqa: E402
from tests.teacher_server.openai_bodies import completion_bodies, model_requests  # noqa: E402
from tests.teacher_server.test_openai_http import Served  # noqa: E402

# Bounded, with room for a loaded CI machine: the largest generated body (120,000 tokens)
# takes about 0.5 s alone and was seen past 5 s beside a busy suite.
ANSWER_WITHIN_S = 20.0
FAST = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def front():
    served = Served()
    events = []
    srv = served.h.server.srv
    original = srv.log_fn
    def record(level, event, **fields):  # noqa: E306
        events.append((level, event, fields))
        if original is not None:
            original(level, event, **fields)
    srv.log_fn = record
    recorder = Recorder()
    logging.getLogger("aiohttp").addHandler(recorder)
    with httpx.Client(base_url=served.base, timeout=ANSWER_WITHIN_S) as http:
        yield served, http, events, recorder
    logging.getLogger("aiohttp").removeHandler(recorder)
    # Nothing a client sent was logged as an error or traceback by us or by aiohttp.
    assert [e for e in events if e[0] in ("error", "critical")] == []
    assert [r.getMessage() for r in recorder.records] == []
    served.close()


def check(reply, took: float, method: str = "POST") -> None:
    assert reply.status_code < 500, (reply.status_code, reply.text[:300])
    assert took < ANSWER_WITHIN_S, took
    if reply.status_code >= 400 and method != "HEAD":
        error = reply.json()["error"]
        assert isinstance(error["message"], str) and "\n" not in error["message"]
        assert len(reply.content) < 4096  # a refusal never echoes a large body back


@pytest.mark.slow
@settings(FAST, max_examples=15)
@given(example=completion_bodies("fake", FAKE_VOCAB, 16))
def test_generated_completion_bodies_get_2xx_or_a_4xx_json_error(front, example):
    _, http, _, _ = front
    kind, body = example
    t0 = time.monotonic()
    reply = http.post("/v1/completions", content=body,
                      headers={"Content-Type": "application/json"})
    check(reply, time.monotonic() - t0)
    if kind == "valid":
        assert reply.status_code == 200, reply.text[:300]
        assert reply.json()["object"] == "text_completion"


@FAST
@given(example=model_requests())
def test_generated_requests_at_v1_models_get_2xx_or_a_4xx_json_error(front, example):
    _, http, _, _ = front
    method, path, body, headers = example
    t0 = time.monotonic()
    reply = http.request(method, path, content=body or None, headers=headers)
    check(reply, time.monotonic() - t0, method)


@pytest.mark.parametrize("depth", [9, 1000, 100_000])
def test_a_deeply_nested_body_is_a_400_naming_the_limit(front, depth):
    _, http, _, _ = front
    reply = http.post("/v1/completions", content=b"[" * depth + b"]" * depth)
    assert reply.status_code == 400
    assert "more than 8 levels deep (the limit)" in reply.json()["error"]["message"]


def test_prompt_count_and_tokens_per_request_have_limits_named_in_the_413():
    from miniverl.protocol.limits import Limits

    served = Served(limits=Limits(max_tokens=64, max_sequences=4, max_inflight=2))
    try:
        with httpx.Client(base_url=served.base, timeout=ANSWER_WITHIN_S) as http:
            def post(prompt):
                reply = http.post("/v1/completions", content=json.dumps(
                    {"model": "fake", "prompt_logprobs": 1, "prompt": prompt}))
                return reply.status_code, reply.json()["error"]["message"]

            assert post([[1, 2]] * 9) == (413, "9 prompts, over the 8 one request may hold "
                                          "(max_sequences per SCORE x max_inflight SCOREs); "
                                          "send fewer prompts per request")
            status, message = post([[1] * 50] * 3)
            assert status == 413 and message.startswith("150 tokens in all, over the 128")
    finally:
        served.close()


def test_an_unknown_route_and_method_are_json_errors(front):
    _, http, _, _ = front
    for method, path, status in (("GET", "/nowhere", 404), ("DELETE", "/v1/models", 405),
                                 ("GET", "/v1/completions", 405)):
        reply = http.request(method, path)
        assert reply.status_code == status and "this teacher serves" in reply.json()["error"]["message"]
