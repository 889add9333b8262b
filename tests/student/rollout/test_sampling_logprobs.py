"""What the rollout runner records per sampled token: the log-prob of the drawn token
under the distribution it was drawn from (temperature and top-p applied, renormalised),
with the same draw as before; nothing for argmax."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from miniverl.student.rollout.hf_engine import sample_next, sample_with_logprobs  # noqa: E402

torch.set_num_threads(1)


def _gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_logq_is_the_drawn_tokens_share_of_the_sampled_distribution(temperature, top_p):
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(3)) * 2
    ids, logq = sample_with_logprobs(logits, _gens(6), greedy=False, temperature=temperature,
                                     top_p=top_p)
    # Recording changes no draw.
    assert ids.tolist() == sample_next(logits, _gens(6), greedy=False,
                                       temperature=temperature, top_p=top_p).tolist()
    probs = torch.softmax(logits / temperature, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    kept = (sorted_p.cumsum(-1) - sorted_p) < top_p  # the nucleus, as the sampler keeps it
    nucleus = torch.zeros_like(probs).scatter(-1, order, sorted_p * kept)
    expected = (nucleus / nucleus.sum(-1, keepdim=True)).gather(-1, ids[:, None]).log()
    assert torch.allclose(logq, expected.squeeze(-1), atol=1e-5)
    assert (logq <= 0).all()


def test_argmax_records_nothing():
    logits = torch.randn(2, 5)
    ids, logq = sample_with_logprobs(logits, _gens(2), greedy=True, temperature=1.0, top_p=1.0)
    assert logq is None and ids.tolist() == logits.argmax(-1).tolist()
