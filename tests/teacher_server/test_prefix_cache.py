"""The teacher's prefix cache: replies equal uncached scoring, the block is reused across
requests only when every row starts with it, its budget holds, and PARK, RELOAD and
``--prefix-cache-tokens 0`` leave nothing behind."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from miniverl.teacher_server.prefix_cache import MAX_ENTRIES, PrefixCache
from miniverl.teacher_server.scoring import ScoreRequest, score_requests
from tests.teacher_server.test_scoring import VOCAB, tiny_model
from tests.toy_kit import ONE_LAYER, toy_dir

SYSTEM = np.random.default_rng(7).integers(0, VOCAB, 48).astype(np.int32)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_model(seed=3)


def request(seed: int, system=SYSTEM, own=(20, 40), kind="topk") -> ScoreRequest:
    rng = np.random.default_rng(seed)
    tokens = np.concatenate([system, rng.integers(0, VOCAB, rng.integers(*own))]).astype(np.int32)
    # Positions inside the system block too: their hidden states come from the cache.
    positions = np.sort(rng.choice(len(tokens) - 1, 25, replace=False)).astype(np.int32)
    return ScoreRequest(tokens, np.array([0, len(tokens)], np.int32), positions, kind, 8, 1.0)


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        if name == "ids":
            np.testing.assert_array_equal(got[name], want[name])
        else:
            np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=0)


def test_single_requests_reuse_the_block_they_share_and_reply_as_without_it(model):
    cache = PrefixCache()
    for seed in range(6):
        req = request(seed, kind="exact" if seed == 4 else "topk")
        (want,) = score_requests(model, [req])
        (got,) = score_requests(model, [req], prefix_cache=cache)
        assert_same(got, want)
    # The first request has nothing to share with; the second finds the block it shares
    # with the first and caches it; the other four start with it.
    assert cache.misses == 2 and cache.hits == 4
    (entry,) = cache.entries
    np.testing.assert_array_equal(entry.ids_T.numpy()[: len(SYSTEM)], SYSTEM)
    assert cache.tokens_reused == 4 * len(entry.ids_T)


def test_a_coalesced_batch_caches_what_its_rows_share(model):
    cache = PrefixCache()
    batch = [request(seed) for seed in range(4)]
    want = score_requests(model, batch)
    got = score_requests(model, batch, prefix_cache=cache)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    assert cache.misses == 1 and len(cache.entries) == 1
    (later,) = score_requests(model, [request(10)], prefix_cache=cache)
    assert cache.hits == 1
    assert_same(later, score_requests(model, [request(10)])[0])


def test_rows_that_do_not_all_start_with_the_block_are_not_given_it(model):
    cache = PrefixCache()
    score_requests(model, [request(0), request(1)], prefix_cache=cache)
    other = np.random.default_rng(99).integers(0, VOCAB, 48).astype(np.int32)
    mixed = [request(2), request(3, system=other)]
    want = score_requests(model, mixed)
    got = score_requests(model, mixed, prefix_cache=cache)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    assert cache.hits == 0


def test_two_environments_keep_their_own_blocks(model):
    cache = PrefixCache()
    other = np.random.default_rng(5).integers(0, VOCAB, 64).astype(np.int32)
    for seed in range(3):  # two students on one teacher, alternating
        score_requests(model, [request(seed)], prefix_cache=cache)
        score_requests(model, [request(seed, system=other)], prefix_cache=cache)
    assert len(cache.entries) == 2
    (got,) = score_requests(model, [request(20, system=other)], prefix_cache=cache)
    assert_same(got, score_requests(model, [request(20, system=other)])[0])
    assert cache.hits >= 3


def test_the_token_budget_and_entry_count_hold(model):
    small = PrefixCache(max_tokens=40)  # less than the 48-token block: never kept
    for seed in range(3):
        (got,) = score_requests(model, [request(seed)], prefix_cache=small)
        assert_same(got, score_requests(model, [request(seed)])[0])
    assert small.entries == [] and small.hits == 0
    off = PrefixCache(max_tokens=0)
    batch = [request(seed) for seed in range(3)]
    shapes = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        got = score_requests(model, batch, prefix_cache=off)
    finally:
        hook.remove()
    for g, w in zip(got, score_requests(model, batch), strict=True):
        assert_same(g, w)
    assert shapes[0][0] == 1 and shapes[0][1] >= len(SYSTEM)  # still shared within the batch
    assert off.entries == [] and off.hits == 0
    many = PrefixCache()
    rng = np.random.default_rng(1)
    for i in range(MAX_ENTRIES + 3):
        block = rng.integers(0, VOCAB, 40).astype(np.int32)
        score_requests(model, [request(2 * i, system=block), request(2 * i + 1, system=block)],
                       prefix_cache=many)
    assert len(many.entries) == MAX_ENTRIES
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        PrefixCache(-1)


def test_backend_clears_on_park_and_reload_starts_empty(tmp_path):
    from miniverl.teacher_server.backend import ScoreJob
    from miniverl.teacher_server.loader import TeacherSpec
    from miniverl.teacher_server.scorers import make_loader

    model_dir = str(toy_dir(ONE_LAYER))
    load = make_loader(TeacherSpec(model=model_dir, device="cpu"), prefix_cache_tokens=512)
    backend = load(None)
    assert backend.prefix_cache.max_tokens == 512
    rng = np.random.default_rng(0)
    system = rng.integers(0, 200, 40).astype(np.int32)
    for seed in range(3):
        tokens = np.concatenate([system, np.random.default_rng(seed).integers(0, 200, 12)])
        tokens = tokens.astype(np.int32)
        cu = np.array([0, len(tokens)], np.int32)
        (reply,) = backend.score_batch([ScoreJob(tokens, cu, np.arange(40, 50, dtype=np.int32),
                                                 "topk", 4, 1.0)])
        assert reply["ids"].shape == (10, 4)
    assert backend.prefix_cache.hits == 1 and backend.prefix_cache.entries
    assert backend.stats()["prefix_cache"]["hits"] == 1  # logged with each batch
    backend.park()
    assert backend.prefix_cache.entries == []
    reloaded = load({"model": model_dir, "revision": None, "adapter": None})
    assert reloaded.prefix_cache is not backend.prefix_cache
    assert reloaded.prefix_cache.entries == []
    assert make_loader(TeacherSpec(model=model_dir, device="cpu"),
                       prefix_cache_tokens=0)(None).prefix_cache.max_tokens == 0
