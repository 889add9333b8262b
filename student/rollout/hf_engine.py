"""The policy's own sampling engine: batched decoding over transformers' KV cache.

:class:`HFEngine` plays the :class:`~miniverl.student.rollout.engine.SamplingEngine`
role with the training policy itself. One call samples one assistant turn for a batch of
episodes: their ids are left-padded into one batch (the system block every episode
shares is prefilled once per :meth:`HFEngine.reset` and its KV reused by every row and
turn), prefilled, then decoded token by token; a row leaves the batch as soon as it
samples a stop id or reaches its budget.

:class:`KVCache` holds the cache of one decode batch and is the only code that touches
transformers' cache object (copy, repeat over rows, drop rows): the decode loop in
:meth:`HFEngine.sample` never does. Sampling is reproducible per episode: every row
draws exactly one uniform number from its episode's generator per sampled token
(inverse-CDF sampling, :func:`sample_with_logprobs`), so an episode's randomness does
not depend on which others share its batch.

This module knows nothing about environments, chat templates or trajectories.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from miniverl.common.shared_prefix import cache_kwarg, output_cache
from miniverl.student.rollout.engine import SampledTurn, Sampling, TurnRequest


def sample_next(
    logits_B_V: torch.Tensor,
    generators: Sequence[torch.Generator],
    *,
    greedy: bool,
    temperature: float,
    top_p: float,
) -> torch.Tensor:
    """One token per row: argmax, or temperature + top-p sampling by inverse CDF.

    Row ``b`` consumes exactly one draw from ``generators[b]``, so its sample depends
    only on its own logits and generator, not on the other rows.
    """
    return sample_with_logprobs(
        logits_B_V, generators, greedy=greedy, temperature=temperature, top_p=top_p
    )[0]


def sample_with_logprobs(
    logits_B_V: torch.Tensor, generators: Sequence[torch.Generator], *, greedy: bool,
    temperature: float, top_p: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`sample_next` and ``logq_B``, the float32 log-prob each drawn token had under
    the distribution it was drawn from (temperature and top-p applied, renormalised): the
    sampling-time log-prob the importance ratio of ``loss.importance_ratio_cap`` divides
    by. ``logq_B`` is None for argmax (nothing was drawn)."""
    if greedy or temperature <= 0.0:
        return logits_B_V.argmax(dim=-1), None
    probs_B_V = torch.softmax(logits_B_V.float() / temperature, dim=-1)
    # Without top-p no sort is needed (hot path).
    probs_B_V, order_B_V = _top_p(probs_B_V, top_p) if top_p < 1.0 else (probs_B_V, None)
    cum_B_V = probs_B_V.cumsum(dim=-1)
    u_B = torch.cat([torch.rand(1, generator=g) for g in generators]).to(cum_B_V.device)
    target_B1 = (u_B * cum_B_V[:, -1]).unsqueeze(-1)
    idx_B = torch.searchsorted(cum_B_V, target_B1, right=True)
    # Rounding can put the draw past the last token with mass; step back onto it.
    last_B1 = (cum_B_V < cum_B_V[:, -1:]).sum(dim=-1, keepdim=True)
    idx_B = torch.minimum(idx_B, last_B1)
    # The drawn token's share of the mass it was drawn from (p <= the total, so <= 0).
    logq_B = (probs_B_V.gather(-1, idx_B).log() - cum_B_V[:, -1:].log()).squeeze(-1)
    if order_B_V is not None:
        idx_B = order_B_V.gather(-1, idx_B)
    return idx_B.squeeze(-1), logq_B.clamp(max=0.0)


def _top_p(probs_B_V: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs_B_V sorted in descending order, order_B_V)``, each row's probabilities kept
    for the smallest prefix whose mass reaches ``top_p`` (the most likely token always
    stays) and zeroed after it; ``order_B_V`` the vocabulary id of each sorted column."""
    probs_B_V, order_B_V = probs_B_V.sort(dim=-1, descending=True)
    drop_B_V = (probs_B_V.cumsum(dim=-1) - probs_B_V) >= top_p
    return probs_B_V.masked_fill(drop_B_V, 0.0), order_B_V


class KVCache:
    """The KV cache of one decode batch, over transformers' cache object (``DynamicCache``).

    Three operations, and the only ones the engine does on a cache: :meth:`start` on a
    copy of a shared prefix's cache repeated over the rows (the prefix's own cache is
    never changed, so the next batch starts from it again), :meth:`forward_kwargs` to
    hand the cache to the model under the name its ``forward`` takes (``cache`` in
    recent transformers, ``past_key_values`` before), :meth:`update` with the cache a
    forward returned, and :meth:`keep_rows` to drop the rows that finished.
    """

    def __init__(self, kwarg: str):
        self._kwarg = kwarg  # common.shared_prefix.cache_kwarg(model)
        self._cache: Any = None

    def start(self, prefix: Any, rows: int) -> None:
        """Begin a batch of ``rows`` rows on ``prefix`` (a batch-1 cache), or empty (None)."""
        self._cache = None
        if prefix is not None:
            cache = copy.deepcopy(prefix)
            cache.batch_repeat_interleave(rows)
            self._cache = cache

    def forward_kwargs(self) -> dict[str, Any]:
        """The model's keyword argument that carries the cache (none while it is empty)."""
        return {} if self._cache is None else {self._kwarg: self._cache}

    def update(self, out: Any) -> None:
        """Keep the cache a forward with ``use_cache=True`` returned."""
        self._cache = output_cache(out)

    def keep_rows(self, rows_K: torch.Tensor) -> None:
        """Keep only the batch rows ``rows_K`` (ascending), in that order."""
        self._cache.batch_select_indices(rows_K)


def left_padded(
    prompts: Sequence[list[int]], shared: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``ids_B_L``, ``mask_B_S`` and ``pos_B_L`` of prompts whose first ``shared`` ids sit
    in a prefix cache: each row's own ids left-padded to ``L``, the mask over the
    ``S = shared + L`` cached-and-new positions, the position ids of the new ones.

    Padding sits between the shared prefix and each row's own ids; the position ids skip
    it, so every id keeps the position it has unpadded.
    """
    B, L = len(prompts), max(len(p) for p in prompts) - shared
    ids_B_L = torch.full((B, L), pad_id, dtype=torch.long)  # host: filled, then moved
    mask_B_S = torch.zeros((B, shared + L), dtype=torch.long)  # host: filled, then moved
    mask_B_S[:, :shared] = 1
    for b, p in enumerate(prompts):
        rest = p[shared:]
        ids_B_L[b, L - len(rest) :] = torch.tensor(rest, dtype=torch.long)  # host:
        mask_B_S[b, shared + L - len(rest) :] = 1
    pos_B_L = (mask_B_S.cumsum(-1) - 1).clamp(min=0)[:, shared:]
    return ids_B_L, mask_B_S, pos_B_L


class HFEngine:
    """Samples turns with a transformers causal LM (the policy) over a KV cache."""

    def __init__(self, model: Any, *, pad_id: int, device: torch.device):
        self.model = model
        self.pad_id = pad_id
        self.device = device
        self._cache_kwarg = cache_kwarg(model)
        self._prefix: tuple[list[int], Any] | None = None

    def reset(self) -> None:
        self._prefix = None  # computed from weights that may have changed

    def release(self) -> None:
        """Nothing to free: the shared prefix's KV stays until the next reset."""

    @torch.inference_mode()
    def _shared_prefix(self, requests: Sequence[TurnRequest]) -> tuple[int, Any]:
        """(length, batch-1 KV cache) of the first request's system block when every
        request opens with it and goes past it, else (0, None); the cache is computed
        once until :meth:`reset` (or until another block comes)."""
        first = requests[0]
        if first.prefix_len == 0:
            return 0, None
        prefix = first.tokens[: first.prefix_len]
        P = len(prefix)
        if any(len(r.tokens) <= P or r.tokens[:P] != prefix for r in requests):
            return 0, None
        if self._prefix is None or self._prefix[0] != prefix:
            ids_1_P = torch.tensor([prefix], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids_1_P, use_cache=True, logits_to_keep=1)
            self._prefix = (prefix, output_cache(out))
        return P, self._prefix[1]

    @torch.inference_mode()
    def sample(self, requests: Sequence[TurnRequest], sampling: Sampling) -> list[SampledTurn]:
        """One turn per request: prefill the batch, then one token per active row per
        step until every row has sampled a stop id or reached its budget."""
        stop_ids = torch.tensor(sorted(sampling.stop_ids), device=self.device)
        P, prefix_cache = self._shared_prefix(requests)
        ids_B_L, mask_B_S, pos_B_L = (t.to(self.device) for t in
                                      left_padded([r.tokens for r in requests], P, self.pad_id))
        cache = KVCache(self._cache_kwarg)
        cache.start(prefix_cache, len(requests))
        # The prefill first, then one id per row still decoding.
        inputs = {"input_ids": ids_B_L, "attention_mask": mask_B_S, "position_ids": pos_B_L}
        next_pos_B = pos_B_L[:, -1] + 1
        ids: list[list[int]] = [[] for _ in requests]
        logq: list[list[float]] = [[] for _ in requests]  # stays empty under argmax
        rows = list(range(len(requests)))  # the request of each batch row still decoding
        while True:
            out = self.model(**inputs, use_cache=True, logits_to_keep=1, **cache.forward_kwargs())
            cache.update(out)
            next_B, logq_B = sample_with_logprobs(
                out.logits[:, -1, :], [requests[r].generator for r in rows],
                greedy=sampling.greedy, temperature=sampling.temperature, top_p=sampling.top_p)
            stopped_B = torch.isin(next_B, stop_ids) if len(stop_ids) else None
            next_list = next_B.tolist()
            logq_list = logq_B.float().tolist() if logq_B is not None else None
            stopped = stopped_B.tolist() if stopped_B is not None else [False] * len(rows)
            keep: list[int] = []
            for j, r in enumerate(rows):
                ids[r].append(next_list[j])
                if logq_list is not None:
                    logq[r].append(logq_list[j])
                if not stopped[j] and len(ids[r]) < requests[r].budget:
                    keep.append(j)
            if not keep:
                break
            if len(keep) < len(rows):
                keep_K = torch.tensor(keep, device=self.device)
                cache.keep_rows(keep_K)
                mask_B_S, next_pos_B, next_B = mask_B_S[keep_K], next_pos_B[keep_K], next_B[keep_K]
                rows = [rows[j] for j in keep]
            mask_B_S = torch.cat([mask_B_S, mask_B_S.new_ones((len(rows), 1))], dim=1)
            inputs = {"input_ids": next_B.unsqueeze(-1), "attention_mask": mask_B_S,
                      "position_ids": next_pos_B.unsqueeze(-1)}
            next_pos_B = next_pos_B + 1
        return [SampledTurn(ids=i, logprobs=q if len(q) == len(i) else None)
                for i, q in zip(ids, logq, strict=True)]
