"""The policy's sampling engine: its KV cache operations and its decode loop.

What a user relies on: decoding over the cache (a shared prefix repeated over the rows,
finished rows dropped) gives the logits a plain forward over each row's whole sequence
gives, and a batch samples what each episode samples alone. These run on the installed
transformers and, in the fast tier, on the lowest supported one
(tests/compat/test_lowest_versions.py), where the cache is called ``past_key_values``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from miniverl.common.shared_prefix import cache_kwarg, output_cache  # noqa: E402
from miniverl.common.toy import build_toy_model, build_toy_tokenizer  # noqa: E402
from miniverl.student.rollout.engine import Sampling, TurnRequest  # noqa: E402
from miniverl.student.rollout.hf_engine import HFEngine, KVCache, left_padded  # noqa: E402
from tests.toy_kit import FOUR_HEAD  # noqa: E402

torch.set_num_threads(1)
PREFIX = [5, 9, 14, 3, 27, 8]
ROWS = [[40, 41, 42], [50], [60, 61]]  # each row's own ids after PREFIX


@pytest.fixture(scope="module")
def model():
    m = build_toy_model(FOUR_HEAD, build_toy_tokenizer())
    return m.eval()


def _plain_last_logits(model, seq):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([seq])).logits[0, -1]


def _prefix_cache(model):
    with torch.inference_mode():
        return output_cache(model(input_ids=torch.tensor([PREFIX]), use_cache=True))


def _prefill(model, cache, rows):
    """Each row's own ids over a started cache: the last position's logits per row."""
    ids_B_L, mask_B_S, pos_B_L = left_padded([PREFIX + r for r in rows], len(PREFIX), 0)
    with torch.inference_mode():
        out = model(input_ids=ids_B_L, attention_mask=mask_B_S, position_ids=pos_B_L,
                    use_cache=True, **cache.forward_kwargs())
    cache.update(out)
    return out.logits[:, -1], mask_B_S, pos_B_L[:, -1] + 1


def test_the_cache_goes_by_the_name_the_model_takes(model):
    cache = KVCache(cache_kwarg(model))
    assert cache.forward_kwargs() == {}  # nothing to hand over before a start
    cache.start(_prefix_cache(model), rows=2)
    (name,) = cache.forward_kwargs()
    assert name == cache_kwarg(model)


def test_a_prefix_repeated_over_the_rows_gives_each_rows_plain_logits(model):
    prefix = _prefix_cache(model)
    cache = KVCache(cache_kwarg(model))
    cache.start(prefix, rows=len(ROWS))
    logits_B_V, _, _ = _prefill(model, cache, ROWS)
    for b, row in enumerate(ROWS):
        assert torch.allclose(logits_B_V[b], _plain_last_logits(model, PREFIX + row), atol=1e-5)
    # The prefix's own cache is copied, not extended: the next batch starts from it again.
    assert prefix.get_seq_length() == len(PREFIX)
    again = KVCache(cache_kwarg(model))
    again.start(prefix, rows=1)
    logits_1_V, _, _ = _prefill(model, again, ROWS[:1])
    assert torch.allclose(logits_1_V[0], logits_B_V[0], atol=1e-5)


def test_dropping_rows_keeps_the_others_decoding_as_if_alone(model):
    cache = KVCache(cache_kwarg(model))
    cache.start(_prefix_cache(model), rows=len(ROWS))
    _, mask_B_S, next_pos_B = _prefill(model, cache, ROWS)
    keep_K = torch.tensor([0, 2])  # row 1 finished
    cache.keep_rows(keep_K)
    mask_K_S = torch.cat([mask_B_S[keep_K], mask_B_S.new_ones((2, 1))], dim=1)
    step_K = torch.tensor([[7], [11]])
    with torch.inference_mode():
        out = model(input_ids=step_K, attention_mask=mask_K_S,
                    position_ids=next_pos_B[keep_K].unsqueeze(-1), use_cache=True,
                    **cache.forward_kwargs())
    for k, (row, step) in enumerate(zip([ROWS[0], ROWS[2]], [7, 11], strict=True)):
        plain = _plain_last_logits(model, PREFIX + row + [step])
        assert torch.allclose(out.logits[k, -1], plain, atol=1e-5)


def _requests(seeds, budgets, prefix_len):
    return [TurnRequest(tokens=PREFIX + row, budget=budget,
                        generator=torch.Generator().manual_seed(seed), prefix_len=prefix_len)
            for row, seed, budget in zip(ROWS, seeds, budgets, strict=True)]


@pytest.mark.parametrize("prefix_len", [0, len(PREFIX)])
def test_a_batch_samples_what_each_request_samples_alone(model, prefix_len):
    engine = HFEngine(model, pad_id=0, device=torch.device("cpu"))
    sampling = Sampling(greedy=False, temperature=1.0, top_p=0.9, stop_ids=frozenset({3, 4}))
    budgets = [6, 2, 9]
    together = engine.sample(_requests([1, 2, 3], budgets, prefix_len), sampling)
    for b, request in enumerate(_requests([1, 2, 3], budgets, prefix_len)):
        (alone,) = engine.sample([request], sampling)
        assert alone.ids == together[b].ids
        assert alone.logprobs is not None and together[b].logprobs is not None
        assert torch.allclose(torch.tensor(alone.logprobs), torch.tensor(together[b].logprobs),
                              atol=1e-5)
    for turn, budget in zip(together, budgets, strict=True):
        # A turn ends at its budget or right after a stop id, and records one log-prob per id.
        assert len(turn.ids) <= budget and len(turn.logprobs or []) == len(turn.ids)
        assert len(turn.ids) == budget or turn.ids[-1] in sampling.stop_ids
        assert not set(turn.ids[:-1]) & sampling.stop_ids


def test_argmax_turns_record_no_logprobs(model):
    engine = HFEngine(model, pad_id=0, device=torch.device("cpu"))
    greedy = Sampling(greedy=True, temperature=1.0, top_p=1.0, stop_ids=frozenset())
    turns = engine.sample(_requests([1, 2, 3], [4, 4, 4], len(PREFIX)), greedy)
    assert [len(t.ids) for t in turns] == [4, 4, 4]  # no stop ids: each runs to its budget
    assert all(t.logprobs is None for t in turns)
