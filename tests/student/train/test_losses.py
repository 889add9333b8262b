"""Closed-form properties of the per-position divergences (tiny vocabularies, CPU,
float64): identical inputs give 0, beta 0 and 1 equal the matching KL, JSD is symmetric
at 0.5, bucketed never exceeds exact and equals it at K = V."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from miniverl.student.train.objectives import (
    bucketed_topk_tail_distributions,
    bucketed_topk_tail_divergence_P,
    cross_entropy_P,
    exact_divergence_P,
    exact_forward_kl_P,
    exact_jsd_P,
    exact_reverse_kl_P,
    log1mexp,
    sampled_token_reverse_kl_P,
)

torch.set_num_threads(1)
DT = torch.float64
DIVERGENCES = [("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.5), ("jsd", 0.3)]



def _logits(p, v, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(p, v, generator=g, dtype=DT) * scale


def _topk_targets(teacher_logits_P_V, k):
    teacher_logp = F.log_softmax(teacher_logits_P_V, dim=-1)
    top_logp, ids = teacher_logp.topk(k, dim=-1)
    tail = log1mexp(torch.logsumexp(top_logp, dim=-1))
    if k == teacher_logits_P_V.shape[-1]:
        tail = torch.full_like(tail, -math.inf)  # what the server sends when k == V
    return ids, top_logp, tail


# -- exact ------------------------------------------------------------------------------


@pytest.mark.parametrize("divergence,beta", DIVERGENCES)
def test_identical_distributions_give_zero(divergence, beta):
    # A student that already matches the teacher must get no push in any direction.
    logits = _logits(5, 11, 0)
    div = exact_divergence_P(
        logits, F.log_softmax(logits, -1), divergence=divergence, jsd_beta=beta
    )
    assert torch.allclose(div, torch.zeros(5, dtype=DT), atol=1e-12)


def test_jsd_endpoints_equal_the_kls():
    # TRL convention: beta = 0 is forward KL(T||S), beta = 1 is reverse KL(S||T).
    s, t = _logits(6, 9, 1), F.log_softmax(_logits(6, 9, 2), -1)
    assert torch.equal(exact_jsd_P(s, t, beta=0.0), exact_forward_kl_P(s, t))
    assert torch.equal(exact_jsd_P(s, t, beta=1.0), exact_reverse_kl_P(s, t))
    # And the KLs themselves are the textbook ones.
    ps, pt = F.softmax(s, -1), t.exp()
    assert torch.allclose(exact_forward_kl_P(s, t), (pt * (t - ps.log())).sum(-1), atol=1e-12)
    assert torch.allclose(exact_reverse_kl_P(s, t), (ps * (ps.log() - t)).sum(-1), atol=1e-12)


def test_jsd_is_symmetric_at_one_half():
    a, b = _logits(4, 7, 3), _logits(4, 7, 4)
    ab = exact_jsd_P(a, F.log_softmax(b, -1), beta=0.5)
    ba = exact_jsd_P(b, F.log_softmax(a, -1), beta=0.5)
    assert torch.allclose(ab, ba, atol=1e-12)
    assert (ab <= math.log(2) + 1e-12).all()


def test_temperature_divides_student_logits_only():
    s, t = _logits(3, 8, 5), F.log_softmax(_logits(3, 8, 6), -1)
    assert torch.allclose(
        exact_forward_kl_P(s, t, temperature=2.0), exact_forward_kl_P(s / 2.0, t), atol=1e-12
    )


def test_zero_teacher_probability_is_handled():
    # A teacher that puts exactly zero mass somewhere: forward KL stays finite (0 log 0 = 0).
    s = _logits(2, 5, 7)
    t = torch.tensor([[0.0, -math.inf, 0.0, -math.inf, -math.inf]] * 2, dtype=DT)
    t = t - torch.logsumexp(t, -1, keepdim=True)
    s.requires_grad_(True)
    fkl = exact_forward_kl_P(s, t)
    fkl.sum().backward()
    assert torch.isfinite(fkl).all() and torch.isfinite(s.grad).all()


# -- bucketed ----------------------------------------------------------------------------


@pytest.mark.parametrize("divergence,beta", DIVERGENCES)
def test_bucketed_with_k_equal_v_is_exact(divergence, beta):
    v = 13
    s, tl = _logits(6, v, 8), _logits(6, v, 9)
    ids, top, tail = _topk_targets(tl, v)
    exact = exact_divergence_P(s, F.log_softmax(tl, -1), divergence=divergence, jsd_beta=beta)
    bucketed = bucketed_topk_tail_divergence_P(
        s, ids, top, tail, divergence=divergence, jsd_beta=beta, tail_epsilon=0.0
    )
    assert torch.allclose(bucketed, exact, atol=1e-9, rtol=0)


@pytest.mark.parametrize("divergence,beta", DIVERGENCES)
@pytest.mark.parametrize("k", [1, 3, 8])
def test_unfloored_bucketed_never_exceeds_exact(divergence, beta, k):
    # Merging the tail into one bucket is a coarse-graining: by the data processing
    # inequality it can only lose divergence, never invent it.
    s, tl = _logits(16, 12, 10 + k), _logits(16, 12, 20 + k)
    ids, top, tail = _topk_targets(tl, k)
    exact = exact_divergence_P(s, F.log_softmax(tl, -1), divergence=divergence, jsd_beta=beta)
    bucketed = bucketed_topk_tail_divergence_P(
        s, ids, top, tail, divergence=divergence, jsd_beta=beta, tail_epsilon=0.0
    )
    assert (bucketed <= exact + 1e-12).all()
    assert (bucketed >= -1e-12).all()


def test_student_is_normalised_over_the_full_vocabulary():
    # The gathered student log-probs are the full-vocabulary ones, not a softmax over K.
    s, tl = _logits(3, 10, 30), _logits(3, 10, 31)
    ids, top, tail = _topk_targets(tl, 4)
    student_B, teacher_B = bucketed_topk_tail_distributions(s, ids, top, tail)
    assert torch.allclose(student_B[:, :4], F.log_softmax(s, -1).gather(-1, ids), atol=1e-12)
    assert torch.allclose(teacher_B.exp().sum(-1), torch.ones(3, dtype=DT))
    assert torch.allclose(student_B.exp().sum(-1), torch.ones(3, dtype=DT))


def test_tail_floor_keeps_a_vanishing_teacher_tail_finite():
    s = _logits(2, 6, 32)
    ids = torch.tensor([[0, 1], [2, 3]])
    top = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=DT))
    tail = torch.full((2,), -math.inf, dtype=DT)  # teacher claims zero tail with k < V
    unfloored = bucketed_topk_tail_divergence_P(s, ids, top, tail, divergence="reverse_kl")
    floored = bucketed_topk_tail_divergence_P(
        s, ids, top, tail, divergence="reverse_kl", tail_epsilon=1e-6
    )
    assert torch.isinf(unfloored).all() and torch.isfinite(floored).all()


def test_log1mexp_is_stable_at_both_ends():
    x = torch.tensor([-1e-20, -1e-8, -0.5, -math.log(2), -5.0, -50.0, 0.0], dtype=DT)
    x.requires_grad_(True)
    y = log1mexp(x)
    ref = torch.log(1 - torch.exp(x.detach().to(torch.float64)))
    assert math.isclose(y[0].item(), math.log(1e-20), rel_tol=1e-12)
    assert torch.allclose(y[1:6], ref[1:6], rtol=1e-10)
    assert y[6].item() < -700  # 0 (or rounding above it) means "no tail", finitely
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


# -- token-level -------------------------------------------------------------------------------


def test_sampled_token_estimator_gradient_is_reverse_kl_policy_gradient():
    s = _logits(4, 6, 40).requires_grad_(True)
    sampled = torch.tensor([0, 3, 5, 1])
    teacher_logp = F.log_softmax(_logits(4, 6, 41), -1)
    target = teacher_logp.gather(-1, sampled[:, None]).squeeze(-1)
    loss_P, est_P = sampled_token_reverse_kl_P(s, sampled, target)
    loss_P.sum().backward()
    logp = F.log_softmax(s.detach(), -1).gather(-1, sampled[:, None]).squeeze(-1)
    assert torch.allclose(est_P, logp - target)
    # d/ds of (log S(y) - log T(y)) * log S(y), with the coefficient held fixed.
    expected = (logp - target)[:, None] * (F.one_hot(sampled, 6) - F.softmax(s.detach(), -1))
    assert torch.allclose(s.grad, expected, atol=1e-12)


def test_cross_entropy_matches_torch():
    s, y = _logits(5, 7, 42), torch.tensor([0, 1, 2, 3, 6])
    assert torch.allclose(cross_entropy_P(s, y), F.cross_entropy(s, y, reduction="none"))


# -- properties --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    p=st.integers(1, 4),
    v=st.integers(2, 9),
    k=st.integers(1, 9),
    seed=st.integers(0, 10_000),
    scale=st.floats(0.1, 30.0),
    shift=st.floats(-50.0, 50.0),
    divergence=st.sampled_from(["forward_kl", "reverse_kl", "jsd"]),
    beta=st.floats(0.0, 1.0),
)
@pytest.mark.slow
def test_losses_are_finite_nonnegative_and_shift_invariant(
    p, v, k, seed, scale, shift, divergence, beta
):
    k = min(k, v)
    s, tl = _logits(p, v, seed, scale), _logits(p, v, seed + 1, scale)
    t = F.log_softmax(tl, -1)
    ids, top, tail = _topk_targets(tl, k)
    exact = exact_divergence_P(s, t, divergence=divergence, jsd_beta=beta)
    shifted = exact_divergence_P(s + shift, t, divergence=divergence, jsd_beta=beta)
    bucketed = bucketed_topk_tail_divergence_P(
        s, ids, top, tail, divergence=divergence, jsd_beta=beta, tail_epsilon=1e-6
    )
    bucketed_shifted = bucketed_topk_tail_divergence_P(
        s + shift, ids, top, tail, divergence=divergence, jsd_beta=beta, tail_epsilon=1e-6
    )
    for value in (exact, bucketed):
        assert torch.isfinite(value).all()
        assert (value >= -1e-9).all()
    assert torch.allclose(exact, shifted, atol=1e-8)
    assert torch.allclose(bucketed, bucketed_shifted, atol=1e-8)


def test_floored_tail_gradient_stays_finite_when_the_top_k_holds_all_the_mass():
    # float32 student whose top-1 rounds to probability 1: the student tail is log(0)
    # before the floor; the floor must not turn that into a nan gradient.
    s = torch.tensor([[100.0, 0.0, 0.0, 0.0]], requires_grad=True)
    ids = torch.tensor([[0]])
    top = torch.tensor([[math.log(0.9)]])
    tail = torch.tensor([math.log(0.1)])
    for divergence in ("forward_kl", "reverse_kl", "jsd"):
        s.grad = None
        div = bucketed_topk_tail_divergence_P(
            s, ids, top, tail, divergence=divergence, tail_epsilon=1e-6
        )
        div.sum().backward()
        assert torch.isfinite(div).all() and torch.isfinite(s.grad).all()
