"""Targets across vocabularies (student/train/teacher/cross_vocab.py) against their closed forms.

What a user relies on: the vocabulary map pairs exactly the tokens that stand for the
same bytes and is built once per tokenizer pair; each target reduces to its
same-tokenizer form where the two sides agree (one token per group, the identity map)
and is zero where the two distributions are equal. The comparison against TRL 1.16 on
random inputs is tests/student/train/test_cross_vocab_trl.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from miniverl.common.alignment import MODEL, Rendering, align
from miniverl.student.train.teacher import cross_vocab as cv
from tests.common.cross_tokenizer_kit import byte_fallback_tokenizer, toy_tokenizer


def _alignment(s_cuts, t_cuts, trainable=True):
    n = int(s_cuts[-1])
    piece = Rendering("a" * n, ("a" * n,), np.array([0]), np.array([n]), np.array([0]),
                      np.array([MODEL]))
    a = align(piece, np.asarray(s_cuts), piece, np.asarray(t_cuts))
    if not trainable:
        a = type(a)(a.student_start_G, a.student_end_G, a.teacher_start_G, a.teacher_end_G,
                    a.provenance_G, np.zeros_like(a.trainable_G))
    return a


def test_token_bytes_reads_each_tokenizer_kind():
    toy, fb = toy_tokenizer(), byte_fallback_tokenizer()
    toy_bytes = cv.token_bytes(toy)
    assert sorted(toy_bytes[:256]) == [bytes([b]) for b in range(256)]  # byte-level table
    fb_bytes = cv.token_bytes(fb)
    assert fb_bytes[fb.convert_tokens_to_ids("<0xE2>")] == b"\xe2"  # byte fallback
    assert fb_bytes[fb.convert_tokens_to_ids("\u2581t")] == b" t"  # SentencePiece space
    assert fb_bytes[fb.convert_tokens_to_ids("<|im_end|>")] == b"<|im_end|>"  # added token


def test_vocab_map_pairs_equal_bytes_smallest_id_first():
    """The byte-fallback vocabulary holds both ``<0x61>`` and ``a`` for b"a": the toy's
    "a" maps to the smaller id, and every pair stands for the same bytes."""
    toy, fb = toy_tokenizer(), byte_fallback_tokenizer()
    vmap = cv.build_vocab_map(toy, fb)
    t_bytes, f_bytes = cv.token_bytes(toy), cv.token_bytes(fb)
    for s, t in enumerate(vmap.student_to_teacher_V):
        if t >= 0:
            assert t_bytes[s] == f_bytes[t]
            assert vmap.teacher_to_student_W[t] == s
    a = toy.convert_tokens_to_ids("a")
    assert vmap.student_to_teacher_V[a] == fb.convert_tokens_to_ids("<0x61>")
    cov = vmap.coverage()
    assert cov["mapped"] == len(toy) and cov["student_share"] == 1.0  # every toy token
    assert cov["teacher_share"] == pytest.approx(len(toy) / len(fb))


def test_vocab_map_is_built_once_per_pair(tmp_path, monkeypatch):
    toy, fb = toy_tokenizer(), byte_fallback_tokenizer()
    first = cv.vocab_map(toy, fb, tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 1

    def refuse(*_):
        raise AssertionError("rebuilt a cached map")

    monkeypatch.setattr(cv, "build_vocab_map", refuse)
    again = cv.vocab_map(toy, fb, tmp_path)
    np.testing.assert_array_equal(first.student_to_teacher_V, again.student_to_teacher_V)
    monkeypatch.undo()
    other = cv.vocab_map(fb, toy, tmp_path)  # the other direction is another pair
    assert len(list(tmp_path.glob("*.npz"))) == 2
    assert other.student_fingerprint == first.teacher_fingerprint


def test_exact_kl_is_full_kl_with_identity_map_and_full_topk():
    torch.manual_seed(0)
    s_logits, t_logits = torch.randn(5, 7), torch.randn(5, 7)
    t_logp = torch.log_softmax(t_logits, -1)
    ids = torch.arange(7).expand(5, 7)
    got = cv.exact_forward_kl_P(s_logits, ids, t_logp)
    want = (t_logp.exp() * (t_logp - torch.log_softmax(s_logits, -1))).sum(-1)
    torch.testing.assert_close(got, want)


def test_exact_kl_ignores_unmapped_entries_and_is_zero_on_agreement():
    """Teacher ids 3 and 4 have no student twin: they take no part, and where the
    student's renormalised probabilities on the mapped ids equal the teacher's the KL
    is 0."""
    t_to_s = torch.tensor([2, 0, 1, -1, -1])
    t_ids = torch.tensor([[0, 3, 1, 4, 2]])
    t_logp = torch.log(torch.tensor([[0.4, 0.2, 0.2, 0.1, 0.1]]))
    s_ids, s_tlogp = cv.project_topk(t_ids, t_logp, t_to_s)
    assert torch.isinf(s_tlogp[0, [1, 3]]).all() and s_ids[0, [0, 2, 4]].tolist() == [2, 0, 1]
    # The student's probabilities on ids 2, 0, 1 in the ratio 0.4 : 0.2 : 0.1.
    s_logits = torch.log(torch.tensor([[0.2, 0.1, 0.4, 0.3]]))
    assert cv.exact_forward_kl_P(s_logits, s_ids, s_tlogp).item() == pytest.approx(0, abs=1e-6)


def test_exact_groups_need_one_token_each_side_and_the_map():
    vmap = cv.VocabMap("s", "t", np.array([1, 0, -1]), np.array([1, 0]))
    a = _alignment([0, 1, 2, 4], [0, 1, 2, 4])
    groups = cv.exact_groups_G(a, np.array([0, 2, 1]), np.array([1, 0, 1]), vmap)
    # 0 -> 1 is the teacher's token; 2 maps nowhere; 1 -> 0 is not the teacher's 1.
    assert groups.tolist() == [True, False, False]
    a2 = _alignment([0, 1, 2, 4], [0, 1, 4])  # the last group is 2 student tokens : 1
    assert not cv.exact_groups_G(a2, np.array([0, 1, 0]), np.array([1, 0]), vmap)[1]


def test_merge_keeps_single_rows_and_multiplies_the_others():
    probs = torch.softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(1)), -1)
    ids = torch.tensor([1, 2, 3, 4])
    starts, ends = torch.tensor([0, 1, 4]), torch.tensor([1, 4, 4])
    obs = cv.merge_group_probs(probs, ids, starts, ends, "observed")
    torch.testing.assert_close(obs[0], probs[0])
    torch.testing.assert_close(obs[1], probs[1] * probs[2, 3] * probs[3, 4])
    assert (obs[2] == 0).all()  # an empty group
    bay = cv.merge_group_probs(probs, ids, starts, ends, "bayesian")
    torch.testing.assert_close(bay[1], probs[3] * probs[1, 2] * probs[2, 3])
    with pytest.raises(ValueError, match="not one of observed, bayesian"):
        cv.merge_group_probs(probs, ids, starts, ends, "mean")


def test_topk_merge_is_the_full_merge_with_the_whole_vocabulary():
    """A teacher that sends its top-k and each actual token's log-prob gives the same
    merged rows as one that sends every probability, when k is the vocabulary."""
    probs = torch.softmax(torch.randn(5, 6, generator=torch.Generator().manual_seed(7)), -1)
    ids = torch.tensor([0, 5, 2, 2, 1])
    starts, ends = torch.tensor([0, 2, 5]), torch.tensor([2, 5, 5])
    actual = probs.gather(-1, ids[:, None]).squeeze(-1).log()
    for strategy in ("observed", "bayesian"):
        torch.testing.assert_close(cv.merge_group_topk(probs, actual, starts, ends, strategy),
                                   cv.merge_group_probs(probs, ids, starts, ends, strategy))


def test_uld_is_zero_for_a_relabelled_vocabulary_and_pads_the_shorter():
    p = torch.softmax(torch.randn(3, 8, generator=torch.Generator().manual_seed(2)), -1)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(3))
    assert cv.uld_loss(p, p[:, perm]).item() == pytest.approx(0, abs=1e-7)
    wider = torch.cat([p[:, perm], torch.zeros(3, 5)], -1)  # a larger teacher vocabulary
    assert cv.uld_loss(p, wider).item() == pytest.approx(0, abs=1e-7)
    one_hot = torch.zeros(1, 4)
    one_hot[0, 2] = 1
    uniform = torch.full((1, 4), 0.25)
    assert cv.uld_loss(one_hot, uniform).item() == pytest.approx(0.75 + 3 * 0.25)


def test_topk_uld_bounds_full_uld_and_equals_it_at_full_k():
    g = torch.Generator().manual_seed(4)
    s = torch.softmax(torch.randn(6, 12, generator=g), -1)
    t = torch.softmax(torch.randn(6, 10, generator=g) * 2, -1)
    full = cv.uld_distance_G(s, t)
    for k in (1, 3, 6):
        top = t.sort(-1, descending=True).values[:, :k]
        assert (cv.uld_topk_distance_G(s, top) <= full + 1e-6).all()
    torch.testing.assert_close(cv.uld_topk_distance_G(s, t), full)


def test_generalized_jsd_endpoints_and_symmetry():
    g = torch.Generator().manual_seed(5)
    s = torch.softmax(torch.randn(4, 9, generator=g), -1)
    t = torch.softmax(torch.randn(4, 9, generator=g), -1)
    kl = lambda p, q: (p * (p.log() - q.log())).sum() / 4  # noqa: E731
    assert cv.generalized_jsd_probs(s, t, 0.0).item() == pytest.approx(kl(t, s).item(), rel=1e-5)
    assert cv.generalized_jsd_probs(s, t, 1.0).item() == pytest.approx(kl(s, t).item(), rel=1e-5)
    assert cv.generalized_jsd_probs(s, t, 0.5).item() == pytest.approx(
        cv.generalized_jsd_probs(t, s, 0.5).item(), rel=1e-5)
    assert cv.generalized_jsd_probs(s, s, 0.5).item() == pytest.approx(0, abs=1e-6)


def test_hybrid_with_every_token_matched_is_the_jsd():
    g = torch.Generator().manual_seed(6)
    s = torch.softmax(torch.randn(3, 5, generator=g), -1)
    t = torch.softmax(torch.randn(3, 5, generator=g), -1)
    perm = torch.tensor([4, 0, 3, 1, 2])
    got = cv.hybrid_uld_loss(s, t, perm, torch.arange(5), beta=0.5)
    want = cv.generalized_jsd_probs(s[:, perm], t, 0.5)
    torch.testing.assert_close(got, want)


def test_sampled_token_advantage_is_per_token_with_one_token_groups():
    """The same split on both sides: the advantage is log T(y) - log S(y) per position,
    the same-tokenizer sampled-token estimator."""
    s_lp, t_lp = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    a = _alignment([0, 1, 2, 3], [0, 1, 2, 3])
    adv, valid = cv.sampled_token_advantage_T(s_lp, t_lp, a)
    torch.testing.assert_close(adv, t_lp - s_lp)
    assert valid.all()


def test_sampled_token_advantage_sums_each_group_and_spares_untrainable_ones():
    """Student tokens "ab" and "c" against teacher tokens "a" and "bc": one group of
    all three bytes, whose teacher log-prob is the sum of its two teacher tokens'."""
    s_lp, t_lp = torch.tensor([-1.0, -2.0]), torch.tensor([-0.25, -0.5])
    a = _alignment([0, 2, 3], [0, 1, 3])
    adv, valid = cv.sampled_token_advantage_T(s_lp, t_lp, a)
    torch.testing.assert_close(adv, torch.tensor([2.25, 2.25]))
    adv, valid = cv.sampled_token_advantage_T(s_lp, t_lp, _alignment([0, 2, 3], [0, 1, 3], False))
    assert (adv == 0).all() and not valid.any()
