"""The sampled-token estimator's variants against closed forms (tiny vocabularies, CPU,
float64): without a ratio and a clamp it is the plain estimator in value and gradient;
the importance-weighted gradient, summed over every token the sampler could draw, is the
exact reverse-KL gradient of the version being trained; the cap bounds the weight; the
clamp bounds the log-ratio that weighs the gradient but not the reported estimate."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from test_losses import DT, _logits

from miniverl.student.train.objectives import exact_reverse_kl_P, sampled_token_reverse_kl_P
from miniverl.student.train.objectives.formulas import (
    sampled_token_reverse_kl_ratio_P,
    truncated_ratio_P,
)

torch.set_num_threads(1)


def _grad(fn, logits):
    x = logits.clone().requires_grad_(True)
    loss_P, est_P = fn(x)
    loss_P.sum().backward()
    return loss_P.detach(), est_P, x.grad


def test_without_ratio_and_clamp_it_is_the_plain_estimator():
    # A recipe that sets neither must train exactly as before the variants existed.
    logits, sampled = _logits(5, 9, 1), torch.tensor([0, 3, 8, 2, 2])
    teacher = F.log_softmax(_logits(5, 9, 2), -1).gather(-1, sampled[:, None]).squeeze(-1)
    plain = _grad(lambda x: sampled_token_reverse_kl_P(x, sampled, teacher), logits)
    variant = _grad(lambda x: sampled_token_reverse_kl_ratio_P(x, sampled, teacher), logits)
    for a, b in zip(plain, variant, strict=True):
        assert torch.equal(a, b)
    # Ratio 1 (sampled by the version being trained), cap set: the same numbers.
    logq = F.log_softmax(logits, -1).gather(-1, sampled[:, None]).squeeze(-1)
    at_one = _grad(lambda x: sampled_token_reverse_kl_ratio_P(
        x, sampled, teacher, logq, importance_ratio_cap=2.0), logits)
    for a, b in zip(plain, at_one, strict=True):
        assert torch.allclose(a, b, atol=1e-12)


def test_importance_weighted_gradient_is_the_exact_reverse_kl_gradient_of_the_trainee():
    # Tokens drawn from an older version q, trained under S: weighting each by S/q makes
    # the expected gradient that of KL(S || T), whatever q was (the cap is not reached).
    V = 7
    s_logits, q_logits = _logits(1, V, 3), _logits(1, V, 4)
    teacher_V = F.log_softmax(_logits(1, V, 5), -1)[0]
    q_V = F.softmax(q_logits, -1)[0]
    every_y = torch.arange(V)  # one row per token the sampler could draw
    rows = s_logits.expand(V, V).clone().requires_grad_(True)
    loss_P, _ = sampled_token_reverse_kl_ratio_P(
        rows, every_y, teacher_V[every_y], q_V.log(), importance_ratio_cap=1e6)
    (q_V * loss_P).sum().backward()  # E_{y ~ q}[loss(y)]
    expected_grad = rows.grad.sum(0)
    exact = s_logits.clone().requires_grad_(True)
    exact_reverse_kl_P(exact, teacher_V[None]).sum().backward()
    assert torch.allclose(expected_grad, exact.grad[0], atol=1e-12)
    # Without the weight the same draws estimate another gradient (the bias it removes).
    plain = s_logits.expand(V, V).clone().requires_grad_(True)
    (q_V * sampled_token_reverse_kl_P(plain, every_y, teacher_V[every_y])[0]).sum().backward()
    assert not torch.allclose(plain.grad.sum(0), exact.grad[0], atol=1e-3)


def test_cap_bounds_the_ratio_and_the_gradient_has_the_truncated_closed_form():
    logits, sampled = _logits(6, 5, 6, scale=4.0), torch.tensor([0, 1, 2, 3, 4, 0])
    logp = F.log_softmax(logits, -1).gather(-1, sampled[:, None]).squeeze(-1)
    logq = logp + torch.tensor([-30.0, -2.0, -0.5, 0.0, 0.5, 3.0], dtype=DT)  # S/q up to e^30
    cap = 2.0
    w = truncated_ratio_P(logp, logq, cap)
    assert torch.isfinite(w).all() and (w <= cap).all()
    assert torch.allclose(w, torch.minimum((logp - logq).exp(), torch.tensor(cap, dtype=DT)))
    teacher = F.log_softmax(_logits(6, 5, 7), -1).gather(-1, sampled[:, None]).squeeze(-1)
    _, est, grad = _grad(lambda x: sampled_token_reverse_kl_ratio_P(
        x, sampled, teacher, logq, importance_ratio_cap=cap), logits)
    # d/dz of -w (log T - log S) log S(y) with w and the log-ratio held: w (log S - log T) (e_y - S).
    closed = (w * (logp - teacher))[:, None] * (F.one_hot(sampled, 5) - F.softmax(logits, -1))
    assert torch.allclose(grad, closed, atol=1e-12)
    assert torch.allclose(est, logp - teacher)


def test_clamp_bounds_the_log_ratio_but_not_the_reported_estimate():
    logits, sampled = _logits(3, 6, 8), torch.tensor([1, 2, 3])
    logp = F.log_softmax(logits, -1).gather(-1, sampled[:, None]).squeeze(-1)
    # One token the teacher finds all but impossible (log T = -60), one it prefers.
    teacher = torch.stack([torch.tensor(-60.0, dtype=DT), logp[1] + 0.5, logp[2] - 1.0])
    c = 5.0
    _, est, grad = _grad(lambda x: sampled_token_reverse_kl_ratio_P(
        x, sampled, teacher, log_ratio_clamp=c), logits)
    clamped = (logp - teacher).clamp(-c, c)
    assert clamped[0] == c  # the outlier is bounded ...
    closed = clamped[:, None] * (F.one_hot(sampled, 6) - F.softmax(logits, -1))
    assert torch.allclose(grad, closed, atol=1e-12)
    assert torch.allclose(est, logp - teacher)  # ... the KL figure is not
    assert est[0] > 50 and math.isfinite(float(est[0]))
