"""Scoring numerics: equal to a naive full forward, only requested rows reach the LM head,
coalesced = separate, a stable tail, and the documented refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from miniverl.protocol import messages as m
from miniverl.teacher_server.scoring import (
    ScoreRequest,
    ScoringBadRequest,
    ScoringUnsupported,
    score_positions,
    score_requests,
)
from tests.teacher_server.harness import recv, score_header, send, served_model
from tests.toy_kit import FOUR_HEAD, bare_qwen3

VOCAB = 97


def tiny_model(seed: int = 0, vocab: int = VOCAB):
    torch.manual_seed(seed)
    return bare_qwen3(FOUR_HEAD, vocab=vocab, max_positions=256).eval()


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_model()


def packed(seed=0, lengths=(9, 14, 4, 20)):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, sum(lengths)).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    valid = np.concatenate([np.arange(cu[b], cu[b + 1] - 1) for b in range(len(lengths))])
    positions = rng.permutation(valid)[:15].astype(np.int32)  # unsorted on purpose
    return tokens, cu, positions


def naive_logprobs(model, tokens, cu, positions, temperature=1.0):
    """Full forward per sequence, [T, V] logits, then pick the rows: the obvious way."""
    rows = []
    for p in positions:
        b = int(np.searchsorted(cu, p, side="right") - 1)
        ids = torch.tensor(tokens[cu[b] : cu[b + 1]], dtype=torch.long)[None]
        with torch.no_grad():
            logits = model(ids).logits[0, p - cu[b]].double()
        rows.append(torch.log_softmax(logits / temperature, -1))
    return torch.stack(rows)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_topk_and_exact_equal_a_naive_forward(model, temperature):
    tokens, cu, positions = packed()
    ref = naive_logprobs(model, tokens, cu, positions, temperature)
    top = score_positions(model, tokens, cu, positions, "topk", k=6, temperature=temperature)
    exact = score_positions(model, tokens, cu, positions, "exact", temperature=temperature)
    ref_vals, ref_ids = ref.topk(6, dim=-1)
    assert np.array_equal(top["ids"], ref_ids.numpy())
    np.testing.assert_allclose(top["logprobs"], ref_vals.numpy(), atol=1e-5)
    np.testing.assert_allclose(exact["logprobs"], ref.numpy(), atol=1e-5)
    target = ref[torch.arange(len(positions)), torch.tensor(tokens[positions + 1]).long()]
    np.testing.assert_allclose(top["target_logprobs"], target.numpy(), atol=1e-5)
    np.testing.assert_allclose(exact["target_logprobs"], target.numpy(), atol=1e-5)
    assert top["ids"].dtype == np.int32 and top["logprobs"].dtype == np.float32


def test_the_head_chunk_size_changes_nothing(model, monkeypatch):
    # The LM head runs in [rows, V] chunks sized for the device; any size, even a few
    # rows per chunk, gives the same reply as one chunk for all positions.
    from miniverl.teacher_server import scoring

    tokens, cu, positions = packed()
    monkeypatch.setattr(scoring, "HEAD_CHUNK_ELEMENTS_CPU", 1 << 30)
    whole = {kind: score_positions(model, tokens, cu, positions, kind, k=6)
             for kind in ("topk", "exact")}
    monkeypatch.setattr(scoring, "HEAD_CHUNK_ELEMENTS_CPU", 4 * VOCAB)
    for kind, want in whole.items():
        got = score_positions(model, tokens, cu, positions, kind, k=6)
        for name, array in want.items():
            np.testing.assert_allclose(got[name], array, rtol=1e-6, atol=1e-6, err_msg=name)


def test_topk_plus_tail_is_the_whole_distribution(model):
    tokens, cu, positions = packed(1)
    top = score_positions(model, tokens, cu, positions, "topk", k=10)
    lse = np.logaddexp.reduce(top["logprobs"].astype(np.float64), axis=1)
    np.testing.assert_allclose(np.logaddexp(lse, top["tail_logmass"]), 0.0, atol=1e-5)
    full = score_positions(model, tokens, cu, positions, "topk", k=VOCAB)
    assert np.all(np.isneginf(full["tail_logmass"]))


def test_tail_stays_finite_when_the_top_k_holds_almost_all_mass():
    # The bug this prevents: log1mexp(logsumexp(top-k)) in fp32 returns -inf (or NaN)
    # once the tail is below ~1e-7, although the true tail is finite.
    peaked = tiny_model(seed=3)
    with torch.no_grad():
        peaked.lm_head.weight.mul_(400.0)
    tokens, cu, positions = packed(2)
    top = score_positions(peaked, tokens, cu, positions, "topk", k=4)
    ref = naive_logprobs(peaked, tokens, cu, positions)
    keep = torch.ones_like(ref, dtype=torch.bool)
    keep.scatter_(1, torch.from_numpy(top["ids"]).long(), False)
    ref_tail = torch.logsumexp(ref.masked_fill(~keep, float("-inf")), dim=-1).numpy()
    assert np.all(np.isfinite(top["tail_logmass"]))
    assert ref_tail.min() < -17  # the regime where fp32 log1mexp breaks down
    np.testing.assert_allclose(top["tail_logmass"], ref_tail, rtol=1e-3)


def test_lm_head_sees_only_the_requested_rows(model):
    # Users rely on: memory scales with positions asked for, never with [N, V].
    tokens, cu, positions = packed()
    seen = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape))
    try:
        score_positions(model, tokens, cu, positions, "exact")
    finally:
        hook.remove()
    assert sum(shape[0] for shape in seen) == len(positions)
    assert all(len(shape) == 2 for shape in seen)


def test_coalesced_requests_equal_separate_ones(model):
    reqs = [
        ScoreRequest(*packed(seed), kind=kind, k=5, temperature=t)
        for seed, kind, t in ((0, "topk", 1.0), (1, "exact", 1.0), (2, "topk", 0.5))
    ]
    together = score_requests(model, reqs, max_batch_tokens=40)  # several micro-batches
    for req, got in zip(reqs, together, strict=True):
        alone = score_positions(
            model,
            req.tokens_N,
            req.cu_seqlens_B1,
            req.positions_P,
            req.kind,
            req.k,
            req.temperature,
        )
        assert got.keys() == alone.keys()
        for name in got:
            np.testing.assert_allclose(got[name], alone[name], atol=1e-5)


def test_one_bad_request_does_not_fail_the_batch(model, harness):
    # Served, a SCORE is checked once, when it arrives: a bad one is refused before any
    # job exists, and the good one sent with it is scored as if alone.
    tokens, cu, positions = packed()
    sock = served_model(harness, model, VOCAB)
    arrays = {"tokens": tokens, "cu_seqlens": cu}
    send(sock, score_header(2, k=3), {**arrays, "positions": np.array([cu[1] - 1], np.int32)})
    send(sock, score_header(3, k=3), {**arrays, "positions": positions})
    replies = {msg.id if msg.t == "SCORE_OK" else msg.ref_id: (msg, got)
               for msg, got in (recv(sock), recv(sock))}
    bad, _ = replies[2]
    assert isinstance(bad, m.ErrorReply) and bad.code == m.ErrorCode.BAD_REQUEST
    assert "own sequence" in bad.message
    good, got = replies[3]
    want = score_positions(model, tokens, cu, positions, "topk", 3)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-5)


def test_refusals_name_the_rule(model):
    tokens, cu, positions = packed()
    with pytest.raises(ScoringUnsupported, match="exact_max_vocab=50"):
        score_positions(model, tokens, cu, positions, "exact", exact_max_vocab=50)
    with pytest.raises(ScoringBadRequest, match="own sequence"):
        score_positions(model, tokens, cu, np.array([cu[1] - 1], np.int32))
    with pytest.raises(ScoringBadRequest, match=r"\[0, 97\)"):
        score_positions(model, tokens + VOCAB, cu, positions)
    with pytest.raises(ScoringBadRequest, match="k must"):
        score_positions(model, tokens, cu, positions, "topk", k=VOCAB + 1)
    with pytest.raises(ScoringBadRequest, match="temperature"):
        score_positions(model, tokens, cu, positions, "topk", temperature=0.0)


def test_no_positions_gives_empty_arrays(model):
    tokens, cu, _ = packed()
    out = score_positions(model, tokens, cu, np.zeros(0, np.int32), "topk", k=4)
    assert out["ids"].shape == (0, 4) and out["tail_logmass"].shape == (0,)
