"""Sharing the common prefix of a batch changes the cost of a forward, never its result."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from miniverl.common import toy  # noqa: E402
from miniverl.common.modeling import load_causal_lm  # noqa: E402
from miniverl.common.shared_prefix import decoder_hidden, shared_prefix_len  # noqa: E402
from tests.toy_kit import FOUR_HEAD, seeded  # noqa: E402

SPEC = seeded(FOUR_HEAD, 3)


@pytest.fixture(scope="module")
def decoder():
    model = load_causal_lm(toy.toy_model_dir(SPEC), dtype="float32", device="cpu")
    model.train()
    return model.get_decoder().double()


def _batch(rows: list[list[int]]):
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
        mask[b, : len(row)] = 1
    return ids, mask, [len(r) for r in rows]


def _rows(shared: int, own: list[int], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, 200, (shared,), generator=gen).tolist()
    return [prefix + torch.randint(3, 200, (n,), generator=gen).tolist() for n in own]


def _forward_and_grads(decoder, fn, lengths):
    decoder.zero_grad()
    hidden = fn()
    real = torch.cat([hidden[b, :n] for b, n in enumerate(lengths)])
    (real.sin() * torch.linspace(-1, 1, real.shape[-1], dtype=real.dtype)).sum().backward()
    return real.detach(), {n: p.grad.detach().clone() for n, p in decoder.named_parameters()}


def test_shared_forward_equals_plain_forward_in_value_and_gradient(decoder):
    ids, mask, lengths = _batch(_rows(48, [5, 17, 9, 30]))
    assert shared_prefix_len(ids, lengths) >= 48

    def plain():
        return decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state

    want, want_grads = _forward_and_grads(decoder, plain, lengths)
    got, got_grads = _forward_and_grads(
        decoder, lambda: decoder_hidden(decoder, ids, mask, lengths), lengths
    )
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # The shared pass sums the rows' prefix gradients before the RMSNorm backward, which
    # transformers computes in float32 even for a float64 model: equal to float32 rounding.
    for name, grad in want_grads.items():
        err = float((got_grads[name] - grad).abs().max())
        assert err <= 1e-6 * float(grad.abs().max()), (name, err)


def test_prefix_length_leaves_every_row_a_token_of_its_own():
    ids, _, lengths = _batch([[5, 6, 7, 8], [5, 6, 7, 8, 9, 10]])
    assert shared_prefix_len(ids, lengths) == 3  # not 4: row 0 needs one token of its own
    ids, _, lengths = _batch([[5, 6, 7, 8], [5, 6, 1, 8]])
    assert shared_prefix_len(ids, lengths) == 2
    ids, _, lengths = _batch([[1, 2], [3, 2]])
    assert shared_prefix_len(ids, lengths) == 0
    ids, _, lengths = _batch([[1, 2, 3]])
    assert shared_prefix_len(ids, lengths) == 0  # one row: nothing to share


def test_short_or_absent_prefix_is_one_plain_forward(decoder):
    calls = []
    forward = decoder.forward

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape)
        return forward(*args, **kwargs)

    ids, mask, lengths = _batch(_rows(4, [6, 8]))
    decoder.forward = counting
    try:
        with torch.no_grad():
            out = decoder_hidden(decoder, ids, mask, lengths)
        assert [tuple(c) for c in calls] == [(2, 12)]
        assert out.shape == (2, 12, 32)
        calls.clear()
        ids, mask, lengths = _batch(_rows(40, [6, 8]))
        with torch.no_grad():
            out = decoder_hidden(decoder, ids, mask, lengths)
        assert [tuple(c) for c in calls] == [(1, 40), (2, 8)]
        assert out.shape == (2, 48, 32)
    finally:
        del decoder.forward
