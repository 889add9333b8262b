"""Testing my custom teacher behind the real teacher server, with only ``miniverl.testing``.

``teacher_harness`` (from miniverl's pytest plugin) runs the real server — admission,
batching, the finite-numbers check — around my backend or my scorer factory, in memory:
no process, no socket, no port.
"""

import numpy as np
import pytest
from my_teacher import FINGERPRINT, VOCAB, BigramTeacher, make_scorer

TOKENS = np.array([1, 2, 3, 1, 3, 9], np.int32)
POSITIONS = np.arange(len(TOKENS) - 1)


def test_my_backend_serves_its_own_distribution(teacher_harness):
    backend = BigramTeacher()
    harness = teacher_harness(backend)
    with harness.client() as client:
        assert client.hello.teacher.name == "bigram(smoothing=1)"
        result = client.score(TOKENS, [0, len(TOKENS)], POSITIONS, k=4, temperature=2.0)
    for row, p in enumerate(POSITIONS):
        expected = backend.distribution(int(TOKENS[p]), 2.0)
        assert result.arrays["ids"][row, 0] == np.argmax(expected)
        np.testing.assert_allclose(result.arrays["target_logprobs"][row],
                                   expected[TOKENS[p + 1]], rtol=1e-5)
    np.testing.assert_allclose(  # top-k mass plus the tail is the whole distribution
        np.logaddexp(np.logaddexp.reduce(result.arrays["logprobs"], axis=1),
                     result.arrays["tail_logmass"]), 0.0, atol=1e-5)


def test_my_scorer_factory_takes_its_options(teacher_harness):
    harness = teacher_harness(scorer=make_scorer, scorer_options={"smoothing": 0.5})
    with harness.client() as client:
        assert client.hello.teacher.name == "bigram(smoothing=0.5)"
        assert client.score(TOKENS, [0, len(TOKENS)], POSITIONS, kind="exact").arrays[
            "logprobs"].shape == (len(POSITIONS), VOCAB)


def test_deterministic_requests_reach_my_backend_one_at_a_time(teacher_harness):
    backend = BigramTeacher()
    harness = teacher_harness(backend)
    with harness.client() as client:
        ids = [client.submit(TOKENS, [0, len(TOKENS)], POSITIONS, k=2, deterministic=True)
               for _ in range(6)]
        client.wait(ids)
    assert backend.batch_sizes == [1] * 6


def test_a_bad_request_is_refused_before_my_backend_sees_it(teacher_harness):
    backend = BigramTeacher()
    conn = teacher_harness(backend).raw()
    assert conn.hello(FINGERPRINT, VOCAB).t == "HELLO_OK"
    arrays = {"tokens": np.array([1, VOCAB + 5, 2], np.int32),
              "cu_seqlens": np.array([0, 3], np.int32), "positions": np.array([0], np.int32)}
    reply, _ = conn.call({"v": 1, "t": "SCORE", "id": 2, "student_version": 0, "kind": "topk",
                          "k": 2}, arrays)
    assert reply.t == "ERROR" and reply.code == "BAD_REQUEST"
    assert backend.batch_sizes == []


def test_a_nan_from_my_backend_never_leaves_the_teacher(teacher_harness):
    harness = teacher_harness(BigramTeacher(broken=True))
    with harness.client() as client, pytest.raises(RuntimeError, match="non-finite"):
        client.score(TOKENS, [0, len(TOKENS)], POSITIONS, k=2)
