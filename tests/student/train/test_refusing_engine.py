"""A run waits out an engine teacher (vLLM, SGLang) that refuses its SCOREs, as it waits
out a ``mvl-score`` teacher's refusals (docs/training.md, "A teacher that fails").

What a user relies on: an engine that answers an update's requests with ``503`` (or
another ``5xx`` or ``429``) after the client's own retries, or with a ``4xx``, is an
unavailable teacher, not an error that ends the run at once. The update sends its
SCOREs again after a backoff, up to ``runtime.unavailable_timeout_s`` from the first
refusal (event ``teacher_refusing``), and trains on the engine's answers once it serves
again; past the budget it stops with the same one line and event
``teacher_unavailable`` as over ``mvl-score``. A reply that is not log-probabilities is
still refused at once. A request the update gives up frees its slot at once. The
server is ``miniverl.testing.HostileEngine``; budgets are under a second.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from miniverl.common.errors import TeacherError, TeacherRefusing
from tests.extras import require

require("httpx")

from miniverl.protocol.engine_client import EngineTeacherClient  # noqa: E402
from miniverl.student.train.teacher.link import Patience, TeacherLink  # noqa: E402
from miniverl.testing import HostileEngine  # noqa: E402

VOCAB, K = 300, 4
SEQS = [list(b"hello engine"), list(b"a second, longer episode")]
UNAVAILABLE = (503, b'{"error": {"message": "Service Unavailable"}}')
NO_MODEL = (404, b'{"error": {"message": "The model `hostile-teacher` does not exist."}}')


def encode(text: str, special: bool = False) -> list[int]:
    return list(text.encode("utf-8"))


def refuse_first(engine: HostileEngine, n: int, refusal: tuple[int, bytes]):
    """Answer the first ``n`` scoring requests with ``refusal``, the rest honestly."""
    lock, seen = threading.Lock(), [0]

    def reply(route, body):
        with lock:
            seen[0] += 1
            refused = seen[0] <= n
        if refused:
            return refusal
        return 200, json.dumps(engine.honest(route, body)).encode()

    return reply


def client_of(engine: HostileEngine, **kw) -> EngineTeacherClient:
    settings = dict(flavour=engine.flavour, model=engine.model, tokenize=encode,
                    tokenizer_fp="bytes", vocab_size=VOCAB, request_timeout_s=2.0,
                    max_retries=1, retry_backoff_s=0.02)
    return EngineTeacherClient(engine.url, **{**settings, **kw})


def update(client, budget_s, said):
    """A link of a run of one teacher, its update's two episodes submitted."""
    patience = Patience(budget_s, lambda name, **fields: said.append((name, fields)),
                        threading.Event(), first_s=0.05, most_s=0.2)
    link = TeacherLink(client, kind="topk", k=K, temperature=1.0, patience=patience)
    link.begin_update(2)
    for seq in SEQS:
        link.submit(SimpleNamespace(tokens=seq), np.arange(len(seq) - 1))
    return link


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
@pytest.mark.parametrize("refusal", [UNAVAILABLE, NO_MODEL], ids=["503", "404"])
def test_an_update_waits_out_an_engine_that_refuses_and_trains_on_its_answers(
        flavour, refusal):
    said = []
    with HostileEngine(tokenize=encode, vocab_size=VOCAB, flavour=flavour) as engine, \
            client_of(engine) as client:
        engine.reply_with = refuse_first(engine, 4, refusal)  # both requests, both tries
        link = update(client, budget_s=5.0, said=said)
        t0 = time.monotonic()
        scored = link.collect()
        waited = time.monotonic() - t0
    for s, seq in zip(scored, SEQS, strict=True):
        want = engine.targets(seq, K)
        for name in ("ids", "logprobs", "target_logprobs"):
            np.testing.assert_array_equal(s.arrays[name], want[name])
        assert s.student_version == 2
    assert waited < 2.0, waited  # a backoff or two of 0.05 s, not a deadline
    [(name, fields)] = said
    assert name == "teacher_refusing" and fields["version"] == 2 and fields["episodes"] == 2
    assert f"HTTP {refusal[0]}" in fields["why"] and engine.url in fields["why"]


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_an_engine_that_keeps_refusing_ends_the_update_in_one_line_within_its_budget(flavour):
    said = []
    with HostileEngine(tokenize=encode, vocab_size=VOCAB, flavour=flavour,
                       behaviour="http_500") as engine, client_of(engine) as client:
        link = update(client, budget_s=0.6, said=said)
        t0 = time.monotonic()
        with pytest.raises(TeacherRefusing) as info:
            link.collect()
        waited = time.monotonic() - t0
        assert client.connected  # nothing of the given-up requests is left behind
    text = str(info.value)
    # The line a mvl-score teacher's refusals end with, the engine's own line as its last.
    assert "\n" not in text and text.startswith("the teacher refused this update's SCOREs")
    assert "runtime.unavailable_timeout_s=0.6" in text and "--resume" in text
    assert f"engine teacher at {engine.url}" in text and "(HTTP 500)" in text
    assert 0.3 <= waited < 2.0, waited  # bounded by the budget
    assert [name for name, _ in said] == ["teacher_refusing", "teacher_unavailable"]
    # No backoff starts that would end past the budget; the last re-send's refusal (its
    # own retries) may come later (docs/training.md: up to one request's retries).
    assert said[1][1]["resent"] >= 2 and said[1][1]["waited_s"] < 2.0


def test_a_reply_that_is_not_log_probabilities_is_still_refused_at_once():
    said = []
    with HostileEngine(tokenize=encode, vocab_size=VOCAB,
                       behaviour="positive_logprobs") as engine, client_of(engine) as client:
        link = update(client, budget_s=5.0, said=said)
        with pytest.raises(TeacherError, match="not log-probabilities") as info:
            link.collect()
    assert not isinstance(info.value, TeacherRefusing) and said == []
    # Each request at most once (never sent again); the second may still be in flight when
    # the first reply ends the collect.
    assert 1 <= engine.misbehaved <= 2


def test_a_request_given_up_frees_its_slot_at_once():
    # One slot (max_inflight=1): the first request hangs on a server that never answers
    # it; once forgotten (the update gave it up), the next request is answered at once,
    # not after the first one's deadline (2 s) and retry.
    release, calls = threading.Event(), []
    with HostileEngine(tokenize=encode, vocab_size=VOCAB) as engine, \
            client_of(engine, max_inflight=1) as client:

        def reply(route, body):
            calls.append(route)
            if len(calls) == 1:
                release.wait(10)
                return UNAVAILABLE
            return 200, json.dumps(engine.honest(route, body)).encode()

        engine.reply_with = reply
        client.set_version(0)
        client.bind()
        tokens = np.asarray(SEQS[0], np.int32)
        cu, positions = np.array([0, len(tokens)], np.int32), np.arange(len(tokens) - 1)
        hung = client.submit(tokens, cu, positions, k=K)
        time.sleep(0.1)  # the first request is at the server
        client.forget([hung])
        t0 = time.monotonic()
        rid = client.submit(tokens, cu, positions, k=K)
        reply_ = client.wait([rid], timeout_s=5)[rid]
        took = time.monotonic() - t0
        release.set()
    assert took < 1.0, took
    np.testing.assert_array_equal(reply_.arrays["ids"], engine.targets(SEQS[0], K)["ids"])
    assert len(calls) == 2  # the given-up request was not tried again


@pytest.mark.slow  # a toy OPD run against an engine, stopping in its second update
def test_a_run_whose_engine_keeps_failing_stops_in_one_line_with_a_checkpoint(tmp_path):
    from miniverl.common.modeling import load_tokenizer
    from miniverl.student.train.trainer import Trainer
    from tests.toy_kit import TEACHER, events, make_recipe, toy_dir

    tok = load_tokenizer(toy_dir(TEACHER))
    with HostileEngine(tokenize=lambda t, s: tok.encode(t, add_special_tokens=s),
                       vocab_size=len(tok), behaviour="http_500", after=4) as engine:
        recipe = make_recipe("opd", tmp_path, cycles=3, sections={
            "teacher": {"model": {"path": engine.model}, "endpoint": engine.url,
                        "api": engine.flavour},
            "loss": {"top_k": 4}, "runtime": {"unavailable_timeout_s": 3.0}})
        trainer = Trainer(recipe, show_progress=False, write_report=False)
        with trainer, pytest.raises(TeacherRefusing) as info:
            trainer.train()
    text = str(info.value)  # update 0's four SCOREs answered, then HTTP 500 for good
    assert "\n" not in text and "unavailable_timeout_s=3" in text and "(HTTP 500)" in text
    run_dir = trainer.run.path
    assert [e["version"] for e in events(run_dir, "teacher_refusing")] == [1]
    [gave_up] = events(run_dir, "teacher_unavailable")
    # The budget, plus at most one request's own retries (0.5 + 1 + 2 s of back-off
    # against a server that answers 500 at once), which end the last re-send.
    assert gave_up["version"] == 1 and 2.5 <= gave_up["waited_s"] <= 3.0 + 3.5 + 1.0
    [failed] = events(run_dir, "run_failed")
    assert "refused this update's SCOREs" in failed["reason"] and engine.url in failed["reason"]
    assert (run_dir / "checkpoints" / "step_1").is_dir()  # the update it finished is kept
