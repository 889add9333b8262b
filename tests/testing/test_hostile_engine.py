"""The engine-teacher client against every misbehaviour of ``miniverl.testing.HostileEngine``.

What a user relies on (docs/engine-teachers.md, "A hostile engine"): a hostile engine's
reply is refused with one line that names the endpoint, where the fault is and what to
do; it is never returned to the trainer (so nothing is trained on it); no request hangs
past its deadline; and the client still answers honestly afterwards (its state intact).
Both flavours, vLLM and SGLang, meet the same faults.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from miniverl.common.errors import TeacherError, TeacherUnavailable
from tests.extras import require

require("httpx")

from miniverl.protocol.engine_client import EngineTeacherClient  # noqa: E402
from miniverl.testing import HOSTILE_BEHAVIOURS, HostileEngine  # noqa: E402

VOCAB = 300  # bytes, plus a few ids no text maps to
K = 4
SEQS = [list(b"hello hostile world"), list(b"another prompt, longer than the first one")]
REQUEST_TIMEOUT_S = 0.5
RETRIES = 1
BACKOFF_S = 0.05


def encode(text: str, special: bool = False) -> list[int]:
    return list(text.encode("utf-8"))


def client_of(engine: HostileEngine, **kw) -> EngineTeacherClient:
    settings = dict(flavour=engine.flavour, model=engine.model, tokenize=encode,
                    tokenizer_fp="bytes", vocab_size=VOCAB, request_timeout_s=REQUEST_TIMEOUT_S,
                    max_retries=RETRIES, retry_backoff_s=BACKOFF_S)
    return EngineTeacherClient(engine.url, **{**settings, **kw})


def packed():
    tokens = np.concatenate([np.asarray(s, np.int32) for s in SEQS])
    cu = np.cumsum([0] + [len(s) for s in SEQS]).astype(np.int32)
    positions = np.concatenate([np.arange(cu[b], cu[b + 1] - 1) for b in range(len(SEQS))])
    return tokens, cu, positions.astype(np.int32)


def score(client: EngineTeacherClient):
    tokens, cu, positions = packed()
    rid = client.submit(tokens, cu, positions, k=K)
    return client.wait([rid], timeout_s=30)[rid]


# What the one line says for each refused misbehaviour (besides the endpoint).
REFUSED = {
    "positive_logprobs": "above 0 (a probability of 148.4)",
    "mass_over_one": "sum to a probability of",
    "nan_logprob": "is NaN",
    "infinite_logprob": "non-finite",
    "short": "entries for a prompt of",
    "missing_actual": "",
    "out_of_vocab": "outside the student's vocabulary [0, 300)",
    "model_changed": "now answers as model 'another-model'",
    "http_500": "did not answer after 2 tries (HTTP 500)",
    "huge": "the read was stopped",
    "drip": "no whole answer within 0.5 s",
    "never_ends": "the read was stopped",
    "duplicate_ids": "twice",
    "redirect": "redirected the request (HTTP 307",
    "deep_nesting": "nested too deep",
    "not_json": "non-JSON",
}
# The most a refused request may take: every try's deadline and the back-offs between.
DEADLINE_S = (RETRIES + 1) * REQUEST_TIMEOUT_S + sum(BACKOFF_S * 2 ** i for i in range(RETRIES))


def test_every_behaviour_has_a_verdict():
    assert set(HOSTILE_BEHAVIOURS) == set(REFUSED) | {"honest", "ranks_shuffled"}


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
@pytest.mark.parametrize("behaviour", sorted(REFUSED))
def test_each_misbehaviour_is_refused_in_one_line_within_the_deadline(flavour, behaviour):
    if flavour == "sglang" and behaviour == "model_changed":
        pytest.skip("SGLang replies name no model; /get_model_info is checked at bind")
    with HostileEngine(tokenize=encode, vocab_size=VOCAB, flavour=flavour, after=1,
                       drip_s=0.3) as engine, client_of(engine) as client:
        client.set_version(0)
        client.bind()
        honest = score(client)  # the first request is answered honestly
        engine.behaviour = behaviour
        t0 = time.monotonic()
        with pytest.raises((TeacherError, TeacherUnavailable)) as err:
            score(client)
        took = time.monotonic() - t0
        line = str(err.value)
        assert "\n" not in line and engine.url in line and REFUSED[behaviour] in line, line
        assert "check" in line or "set teacher.endpoint" in line or "restart" in line, line
        assert took <= DEADLINE_S + 1.0, took  # bounded: the deadline, plus scheduling
        retried = behaviour in ("drip", "http_500")  # what waiting may fix is tried again
        assert engine.misbehaved == (RETRIES + 1 if retried else 1)
        assert client.counters["received"] == 1
        # Nothing of the bad reply reached the caller; the client still scores honestly.
        engine.behaviour = "honest"
        again = score(client)
    for name in ("ids", "logprobs", "target_logprobs"):
        np.testing.assert_array_equal(honest.arrays[name], again.arrays[name])


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_an_honest_answer_gives_its_targets_and_reordered_ranks_change_nothing(flavour):
    with HostileEngine(tokenize=encode, vocab_size=VOCAB, flavour=flavour) as engine, \
            client_of(engine) as client:
        client.set_version(0)
        client.bind()
        honest = score(client)
        engine.behaviour = "ranks_shuffled"
        shuffled = score(client)
    want = [engine.targets(seq, K) for seq in SEQS]
    for name in ("ids", "logprobs", "target_logprobs"):
        expected = np.concatenate([w[name] for w in want])
        np.testing.assert_array_equal(honest.arrays[name], expected)
        np.testing.assert_array_equal(shuffled.arrays[name], expected)
    assert np.all(honest.arrays["logprobs"] <= 0) and np.all(np.isfinite(honest.arrays["tail_logmass"]))


def test_the_bytes_counter_counts_what_was_read_even_when_refused():
    with HostileEngine(tokenize=encode, vocab_size=VOCAB, behaviour="huge") as engine, \
            client_of(engine) as client:
        client.set_version(0)
        client.bind()
        before = client.counters["bytes_received"]
        with pytest.raises(TeacherError, match="more than"):
            score(client)
        read = client.counters["bytes_received"] - before
    cap = 1 << 20
    assert cap < read < cap + (4 << 20), read  # past the cap, then the read stopped


def test_a_server_that_drips_forever_is_unavailable_after_the_documented_tries():
    with HostileEngine(tokenize=encode, vocab_size=VOCAB, behaviour="drip", drip_s=0.2) as engine, \
            client_of(engine) as client:
        client.set_version(0)
        client.bind()
        t0 = time.monotonic()
        with pytest.raises(TeacherUnavailable, match=r"after 2 tries \(no whole answer"):
            score(client)
        assert time.monotonic() - t0 <= DEADLINE_S + 1.0
        assert client.counters["deadline_exceeded"] == 2


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_generated_replies_are_accepted_only_as_sound_targets_or_refused_in_one_line(flavour):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from miniverl.protocol.engine_replies import score_body
    from tests.protocol.engine_reply_bodies import engine_replies, judge

    with HostileEngine(tokenize=encode, vocab_size=VOCAB, flavour=flavour) as engine, \
            client_of(engine, max_retries=0) as client:
        client.set_version(0)
        client.bind()
        route, body = score_body(flavour, engine.model, SEQS, K)
        honest = engine.honest(route, body)
        tokens, _, positions = packed()
        actual_P = tokens[positions + 1]
        verdicts: dict[str, int] = {}

        @settings(max_examples=30, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def one(data):
            status, reply = data.draw(engine_replies(honest))
            engine.reply_with = lambda route, body, answer=(status, reply): answer
            t0 = time.monotonic()
            try:
                outcome = score(client)
            except Exception as exc:  # judged below: only a one-line refusal is allowed
                outcome = exc
            verdict = judge(outcome, url=engine.url, vocab=VOCAB, k=K, actual_P=actual_P)
            assert verdict in ("accepted", "refused"), verdict
            assert time.monotonic() - t0 <= DEADLINE_S + 1.0
            verdicts[verdict] = verdicts.get(verdict, 0) + 1

        one()
    assert verdicts.get("refused", 0) > 0 and sum(verdicts.values()) == 30


@pytest.mark.parametrize("choice", [{"index": {}}, {"index": 0, "prompt_token_ids": 5},
                                    {"index": 0, "prompt_logprobs": {"a": 1}}])
def test_a_reply_of_an_unexpected_shape_is_refused_not_left_hanging(choice):
    # Found by benchmarks/http_fuzz.py: a choice whose index was an object raised a
    # TypeError inside the request's task, and its wait ran to its timeout.
    import json

    with HostileEngine(tokenize=encode, vocab_size=VOCAB) as engine, \
            client_of(engine) as client:
        client.set_version(0)
        client.bind()
        body = {"model": engine.model, "choices": [choice, {"index": 1}]}
        engine.reply_with = lambda route, request: (200, json.dumps(body).encode())
        t0 = time.monotonic()
        with pytest.raises(TeacherError) as err:
            score(client)
        assert time.monotonic() - t0 < 2.0 and engine.url in str(err.value)
