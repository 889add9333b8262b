"""The OpenAI-compatible scorer (``teacher serve --openai``): vLLM's shape, its rules.

What a TRL or prime-rl user relies on: ``POST /v1/completions`` with ``prompt_logprobs``
answers in vLLM's response shape (``prompt_logprobs[0]`` is None, then per position a
dict ``token_id -> {logprob, rank, decoded_token}`` holding the top-k and the token
actually there), with our teacher's numbers exactly (float32), the student version the
request named coming back; what mvl-score/1 guarantees holds here too (a bearer token
off loopback, no admin, bounded requests refused with a 4xx naming the limit, finite
numbers only). The request parser and the bind rule need no HTTP stack; the served
cases need aiohttp (the ``openai`` extra) and skip without it, saying so. The server is the real
``TeacherServer`` in ``miniverl.testing``'s harness (a fake backend), the HTTP
listener a real one on loopback.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from miniverl.common.errors import ConfigError
from miniverl.protocol.limits import Limits
from miniverl.teacher_server.openai_http import (
    HttpRefusal,
    OpenAIConfig,
    OpenAIFrontEnd,
    openai_config,
    parse_request,
)
from miniverl.testing import FAKE_VOCAB, FakeBackend, TeacherHarness, next_token_targets
from tests.extras import needs

# The served cases need the HTTP stack (the openai extra); the rest of the module does not.
served_http = needs("aiohttp")

LIM = Limits(max_tokens=64, max_k=16)


def body(**fields):
    return {"model": "fake", "prompt": [[1, 2, 3]], "max_tokens": 1, "prompt_logprobs": 4,
            **fields}


# ------------------------------------------------------------------ no HTTP stack needed


@pytest.mark.parametrize(("fields", "status", "words"), [
    ({"model": "other"}, 404, "`other` does not exist; this teacher serves `fake`"),
    ({"prompt": "What is 2 + 2?"}, 400, "prompt must be token ids"),
    ({"prompt": [[1, 2, FAKE_VOCAB]]}, 400, f"token ids are ints in [0, {FAKE_VOCAB})"),
    ({"prompt": [[]]}, 400, "prompt must be token ids"),
    ({"max_tokens": 16}, 400, "generates nothing; send max_tokens 1"),
    ({"prompt_logprobs": None}, 400, "prompt_logprobs=None"),
    ({"prompt_logprobs": 17}, 400, "1 <= k <= 16"),
    ({"temperature": 0.0}, 400, "temperature=0.0 is outside"),
    ({"top_p": 0.9}, 400, "fields ['top_p'] are not served"),
    ({"n": 2}, 400, "one choice per prompt"),
    ({"stream": True}, 400, "stream, echo and logprobs are not served"),
    ({"miniverl_student_version": -1}, 400, "an integer >= 0"),
    ({"prompt": [list(range(30)) * 3]}, 413, "over the 64 one SCORE of this teacher takes"),
])
def test_bad_requests_are_refused_naming_the_rule(fields, status, words):
    with pytest.raises(HttpRefusal) as info:
        parse_request(body(**fields), "fake", FAKE_VOCAB, LIM)
    assert info.value.status == status and words in info.value.message, info.value.message


def test_a_flat_prompt_is_one_sequence_and_the_version_is_kept():
    req = parse_request(body(prompt=[1, 2, 3], miniverl_student_version=9), "fake", FAKE_VOCAB, LIM)
    assert req["prompts"] == [[1, 2, 3]] and req["k"] == 4 and req["student_version"] == 9


def test_off_loopback_needs_a_bearer_token(tmp_path):
    # mvl-score/1's rule: nothing a remote host can reach is served without proof.
    with pytest.raises(ConfigError, match="non-loopback address needs a bearer token"):
        openai_config("0.0.0.0:8000", None)
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ConfigError, match="at least 16"):
        openai_config("0.0.0.0:8000", str(short))
    good = tmp_path / "token"
    good.write_text("x" * 32 + "\n")
    assert openai_config("0.0.0.0:8000", str(good)).token == "x" * 32
    assert openai_config("127.0.0.1:0", None).token is None
    assert openai_config("[::1]:8000", None).host == "::1"
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        openai_config("8000", None)


def test_the_cli_refuses_an_open_bind_in_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "miniverl.teacher_server", "--model", "/nonexistent",
         "--openai", "0.0.0.0:8000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: --openai 0.0.0.0:8000: a non-loopback address needs a bearer token; pass "
        "--openai-token-file FILE, or bind 127.0.0.1"]


# ------------------------------------------------------------------------- served


class OffTopBackend(FakeBackend):
    """Sure of the next token but never ranks it: the actual token is outside the top-k."""

    def score_batch(self, jobs):
        out = []
        for job in jobs:
            res = dict(next_token_targets(job.tokens_N, job.cu_seqlens_B1, job.positions_P,
                                          kind="topk", k=job.k + 1, vocab_size=self.vocab_size))
            res["ids"] = np.ascontiguousarray(res["ids"][:, 1:])
            res["logprobs"] = np.ascontiguousarray(res["logprobs"][:, 1:])
            out.append(res)
        return out


class Served:
    def __init__(self, backend=None, token=None, **config):
        self.backend = backend or FakeBackend()
        self.h = TeacherHarness(self.backend, **config)
        self.front = OpenAIFrontEnd(self.h.server.srv, OpenAIConfig("127.0.0.1", 0, token))
        self._on_loop(self.front.start())
        self.base = f"http://127.0.0.1:{self.front.bound[1]}"

    def _on_loop(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.h.server.srv.loop).result(30)

    def call(self, method, path, payload=None, token=None, raw=None):
        data = raw if raw is not None else (
            json.dumps(payload).encode() if payload is not None else None)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            text = exc.read()
            return exc.code, json.loads(text) if text.startswith(b"{") else text.decode()

    def close(self):
        self._on_loop(self.front.stop())
        self.h.close()


@pytest.fixture
def served():
    made = []

    def make(**kwargs):
        made.append(Served(**kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


@served_http
def test_health_and_models(served):
    s = served()
    assert s.call("GET", "/health") == (200, {"status": "ok", "state": "READY"})
    status, models = s.call("GET", "/v1/models")
    assert status == 200 and models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["fake"]


@served_http
def test_completions_answer_in_vllms_shape_with_our_numbers(served):
    s = served()
    prompts = [[1, 2, 3, 4], [5, 6]]
    status, reply = s.call("POST", "/v1/completions",
                           body(prompt=prompts, prompt_logprobs=4, miniverl_student_version=7))
    assert status == 200, reply
    assert reply["object"] == "text_completion" and reply["model"] == "fake"
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    assert reply["miniverl"]["student_version"] == 7 and reply["miniverl"]["k"] == 4
    assert reply["usage"] == {"prompt_tokens": 6, "completion_tokens": 0, "total_tokens": 6}
    for seq, choice, tails in zip(prompts, reply["choices"], reply["miniverl"]["tail_logmass"],
                                  strict=True):
        lps = choice["prompt_logprobs"]
        assert len(lps) == len(seq) and lps[0] is None and tails[0] is None
        ref = next_token_targets(np.array(seq), np.array([0, len(seq)]),
                                 np.arange(len(seq) - 1), kind="topk", k=4, vocab_size=FAKE_VOCAB)
        for j in range(1, len(seq)):
            entry = lps[j]
            assert all(set(v) == {"logprob", "rank", "decoded_token"} for v in entry.values())
            ranked = sorted(entry.items(), key=lambda kv: kv[1]["rank"])
            assert [int(t) for t, _ in ranked] == ref["ids"][j - 1].tolist()
            assert [v["rank"] for _, v in ranked] == [1, 2, 3, 4]
            # float32 exactly: the JSON number is the f32 value, not a rounding of it.
            got = np.array([v["logprob"] for _, v in ranked], dtype=np.float32)
            assert np.array_equal(got, ref["logprobs"][j - 1])
            assert str(seq[j]) in entry  # the token actually there
            assert np.float32(tails[j]) == ref["tail_logmass"][j - 1]


@served_http
def test_the_actual_token_outside_the_top_k_comes_with_its_log_prob(served):
    # vLLM includes the prompt token at every position (k or k+1 entries); TRL reads it
    # as the reverse-KL term. Its rank is not known past k, so it is sent as k + 1.
    s = served(backend=OffTopBackend())
    status, reply = s.call("POST", "/v1/completions", body(prompt=[[1, 2, 3]], prompt_logprobs=3))
    assert status == 200, reply
    entry = reply["choices"][0]["prompt_logprobs"][1]
    assert len(entry) == 4 and entry["2"]["rank"] == 4
    assert np.float32(entry["2"]["logprob"]) == np.float32(np.log(0.5))


@served_http
def test_a_top_k_of_the_whole_vocabulary_sends_no_infinity(served):
    # tail_logmass is -inf exactly when k = V (protocol/checks.py, nonfinite_report); JSON has no -inf.
    s = served(limits=Limits(max_k=FAKE_VOCAB))
    status, reply = s.call("POST", "/v1/completions", body(prompt=[[1, 2]],
                                                         prompt_logprobs=FAKE_VOCAB))
    assert status == 200, reply
    assert reply["miniverl"]["tail_logmass"] == [[None, None]]
    assert len(reply["choices"][0]["prompt_logprobs"][1]) == FAKE_VOCAB


@served_http
def test_without_a_version_the_reply_says_none(served):
    s = served()
    status, reply = s.call("POST", "/v1/completions", body())
    assert status == 200 and reply["miniverl"]["student_version"] is None


@served_http
def test_a_bearer_token_guards_the_scoring_routes(served):
    s = served(token="t" * 32)
    assert s.call("POST", "/v1/completions", body())[0] == 401
    assert s.call("POST", "/v1/completions", body(), token="u" * 32)[0] == 401
    assert s.call("GET", "/v1/models")[0] == 401
    assert s.call("POST", "/v1/completions", body(), token="t" * 32)[0] == 200
    # /health reveals only the lifecycle state, as vLLM's does without its key.
    assert s.call("GET", "/health")[0] == 200


@served_http
def test_no_admin_over_http(served):
    # RELOAD, PARK, WAKE and SHUTDOWN exist only on the ZeroMQ side, behind admin proof.
    s = served()
    for method, path in (("POST", "/reload"), ("POST", "/shutdown"), ("POST", "/v1/load_lora"),
                         ("GET", "/v1/completions")):
        assert s.call(method, path, {} if method == "POST" else None)[0] in (404, 405), path
    assert s.h.server.srv.state.value == "READY"


@served_http
def test_a_request_over_one_score_is_split_and_answered_whole(served):
    # TRL's ServerDistillationTrainer sends a whole batch in one request: it is scored as
    # several SCOREs of at most max_tokens tokens and answered as one.
    backend = FakeBackend()
    s = served(backend=backend, limits=Limits(max_tokens=32))
    prompts = [[1] * 20, [2, 3] * 10, [4, 5, 6]]
    status, reply = s.call("POST", "/v1/completions", body(prompt=prompts, prompt_logprobs=2))
    assert status == 200, reply
    assert s.h.server.srv.counters["requests"] == 2  # [20 tokens], [20 + 3 tokens]
    for seq, choice in zip(prompts, reply["choices"], strict=True):
        ref = next_token_targets(np.array(seq), np.array([0, len(seq)]),
                                 np.arange(len(seq) - 1), kind="topk", k=2, vocab_size=FAKE_VOCAB)
        got = [[int(t) for t, v in sorted(e.items(), key=lambda kv: kv[1]["rank"])]
               for e in choice["prompt_logprobs"][1:]]
        assert got == ref["ids"].tolist()


@served_http
def test_requests_past_the_teachers_limits_get_4xx(served):
    s = served(limits=Limits(max_tokens=32, max_inflight=2))
    status, reply = s.call("POST", "/v1/completions", body(prompt=[[1] * 40]))
    assert status == 413 and "over the 32 one SCORE" in reply["error"]["message"]
    status, reply = s.call("POST", "/v1/completions", body(prompt=[[1] * 20] * 3))
    assert status == 413 and "need 3 SCOREs" in reply["error"]["message"]
    assert "max_inflight=2" in reply["error"]["message"]
    # A body no request within the limits can reach is refused before it is read.
    status, reply = s.call("POST", "/v1/completions", raw=b"[" + b"1," * 300_000 + b"1]")
    assert status == 413 and "fewer prompts" in reply["error"]["message"]
    status, reply = s.call("POST", "/v1/completions", raw=b"{not json")
    assert status == 400 and "not JSON" in reply["error"]["message"]


@served_http
def test_past_max_inflight_a_request_is_told_to_slow_down(served):
    backend = FakeBackend()
    s = served(backend=backend, limits=Limits(max_inflight=1))
    backend.hold()
    first = {}
    thread = threading.Thread(target=lambda: first.update(r=s.call("POST", "/v1/completions",
                                                                   body())))
    thread.start()
    assert backend.entered.wait(10)
    status, reply = s.call("POST", "/v1/completions", body())
    backend.release()
    thread.join(30)
    assert status == 429 and "max_inflight=1" in reply["error"]["message"]
    assert first["r"][0] == 200
