"""The teacher never sends a non-finite target, never scores past its model's context, and
scores a deterministic request the same way however requests arrive.

What a student relies on: a NaN or an infinity the teacher computed becomes an
``ERROR INTERNAL`` naming it (only ``tail_logmass = -inf`` at ``k = V`` is a value);
a sequence longer than the model's context is ``TOO_LARGE`` naming both numbers, and
``HELLO_OK`` advertises ``max_tokens`` = the context; a ``deterministic`` SCORE is never
coalesced with others nor served from the prefix cache, so its reply is bitwise the
reply it gets alone.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from miniverl.protocol import messages as m
from miniverl.teacher_server.backend import ScoreJob
from miniverl.teacher_server.loader import LoadedTeacher, context_length
from miniverl.teacher_server.prefix_cache import PrefixCache
from miniverl.teacher_server.scoring import (
    ScoreRequest,
    ScoringBadRequest,
    ScoringNonFinite,
    check_request,
    score_positions,
    score_requests,
)
from miniverl.teacher_server.torch_backend import TorchTeacher
from miniverl.testing import FakeBackend
from tests.teacher_server import harness as wire
from tests.teacher_server.harness import busy, call, hello, recv, score_arrays, score_header, send
from tests.teacher_server.test_scoring import VOCAB, tiny_model

SYSTEM = np.random.default_rng(7).integers(0, VOCAB, 48).astype(np.int32)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_model(seed=5)


def episode(seed: int) -> ScoreJob:
    """One pipelined SCORE: a shared system block, then the episode's own tokens."""
    rng = np.random.default_rng(seed)
    tokens = np.concatenate([SYSTEM, rng.integers(0, VOCAB, 30)]).astype(np.int32)
    positions = np.arange(len(tokens) - 1, dtype=np.int32)
    return ScoreJob(tokens, np.array([0, len(tokens)], np.int32), positions, "topk", 8, 1.0)


# -- finite targets --------------------------------------------------------------------------


def test_a_scorer_output_with_inf_is_an_error_not_a_reply(model, harness):
    broken = tiny_model(seed=5)
    with torch.no_grad():
        broken.get_output_embeddings().weight[3] = float("inf")  # logits of token 3: +-inf
    # In process, score_positions runs the finite-targets rule itself.
    with pytest.raises(ScoringNonFinite, match="non-finite.*NaN"):
        score_positions(broken, np.arange(12) % VOCAB, np.array([0, 12]), np.array([0, 5]))
    # Served, the built-in backend's reply is checked once, by the batcher: answered as
    # INTERNAL, not retryable (it would come back), naming what was not finite.
    sock = wire.served_model(harness, broken, VOCAB)
    reply, arrays = call(sock, score_header(5), score_arrays())
    assert isinstance(reply, m.ErrorReply) and reply.code == m.ErrorCode.INTERNAL
    assert not reply.retryable and "NaN" in reply.message and not arrays


def test_temperature_below_the_range_is_refused_before_any_compute():
    req = ScoreRequest(np.arange(6), np.array([0, 6]), np.array([0]), temperature=1e-45)
    with pytest.raises(ScoringBadRequest, match=r"temperature must lie in \[0.05, 20"):
        check_request(req, VOCAB, 1 << 20)


class NaNBackend(FakeBackend):
    """Answers every job with a NaN target log-prob (a plug-in scorer gone wrong)."""

    def score_batch(self, jobs):
        out = super().score_batch(jobs)
        for arrays in out:
            arrays["target_logprobs"][0] = np.nan
        return out


def test_the_server_answers_a_nan_result_with_internal_naming_it(harness):
    h, _ = harness(backend=NaNBackend())
    sock = h.raw()
    hello(sock)
    reply, arrays = call(sock, score_header(5), score_arrays())
    assert isinstance(reply, m.ErrorReply) and reply.code == m.ErrorCode.INTERNAL
    assert reply.ref_id == 5 and "target_logprobs: 1 NaN" in reply.message
    assert not arrays  # no array left the teacher


# -- sequences within the model --------------------------------------------------------------


class ShortContextBackend(FakeBackend):
    context_len = 16


def test_hello_advertises_the_context_and_a_longer_sequence_is_too_large(harness):
    h, _ = harness(backend=ShortContextBackend())
    sock = h.raw()
    assert hello(sock).limits.max_tokens == 16  # no longer 262,144
    reply, _ = call(sock, score_header(2), score_arrays(n=20, positions=(0, 3)))
    assert reply.code == m.ErrorCode.TOO_LARGE and reply.ref_id == 2
    assert "20 tokens" in reply.message and "context is 16 tokens" in reply.message
    ok, _ = call(sock, score_header(3), score_arrays(n=16, positions=(0, 3)))
    assert isinstance(ok, m.ScoreOk)  # a sequence of exactly the context is served


def test_context_length_is_the_smaller_of_positions_and_a_sane_tokenizer_limit(tmp_path):
    config = type("Config", (), {"max_position_embeddings": 1024})()
    assert context_length(config, tmp_path) == 1024  # no tokenizer_config.json
    for limit, want in ((512, 512), (1 << 20, 1024), (int(1e30), 1024)):
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": limit}))
        assert context_length(config, tmp_path) == want
    assert context_length(object(), tmp_path / "none") is None


# -- deterministic scoring ---------------------------------------------------------------------


def test_a_deterministic_score_is_never_coalesced(harness):
    h, backend, gate, sock = busy(harness)
    for rid, flag in ((2, False), (3, False), (4, True), (5, False), (6, False)):
        send(sock, score_header(rid, **({"deterministic": True} if flag else {})),
             score_arrays())
    # All five are queued behind the held batch before it is released.
    deadline = time.monotonic() + 5
    while call(sock, {"v": 1, "t": "PING", "id": 50})[0].queue_depth < 5:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    gate.set()
    replies = [recv(sock) for _ in range(6)]
    assert all(r is not None and isinstance(r[0], m.ScoreOk) for r in replies)
    assert backend.batches == [[1], [2, 3], [4], [5, 6]]


def test_deterministic_jobs_skip_the_prefix_cache_and_equal_their_solo_reply(model):
    backend = TorchTeacher(LoadedTeacher(model, None, "fp", VOCAB, {}, "cpu", "float32"),
                           exact_max_vocab=1 << 20, max_batch_tokens=4096)
    backend.prefix_cache = PrefixCache()
    backend.score_batch([episode(1), episode(2)])  # warms the cache with the system block
    assert backend.prefix_cache.entries
    before = backend.prefix_cache.stats()
    job = episode(3)
    job.deterministic = True
    (got,) = backend.score_batch([job])
    assert backend.prefix_cache.stats() == before  # neither a hit nor a miss
    (alone,) = score_requests(model, [episode(3)])
    for name in alone:
        np.testing.assert_array_equal(got[name], alone[name])  # bitwise
