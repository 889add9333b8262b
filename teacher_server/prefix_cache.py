"""The teacher's prefix cache: the system block's KV computed once, not once per request.

Every episode of an environment opens with the same system block (tool schemas, rules):
about half of a toy calculator episode, often more on a real one. Inside one coalesced
batch ``common/shared_prefix`` already computes it once. A pipelined student sends one
episode per ``SCORE`` as soon as it ends, so batches are small and the block was
recomputed for nearly every request. :class:`PrefixCache` keeps the block's hidden states
and KV cache between batches; a batch whose rows all start with a cached block runs only
their own tokens on top of it.

How a block is found without any hint on the wire: a batch's rows share a prefix with
each other, and a single row shares one with a row seen in a recent request. The cached block is
that common prefix (at least ``MIN_SHARED_TOKENS``), so it is a block two requests really
shared, never a guess. Entries are kept most recently used first, within a token budget.

The cache belongs to one loaded model: a ``RELOAD`` builds a new backend (and so a new,
empty cache), ``PARK`` clears it. A teacher serving named adapters keys every entry by
the adapter that computed it (:meth:`PrefixCache.keyed`): a block one adapter computed
is never reused under another, whose weights give other states. A reply equals the uncached one to float rounding (the
same computation split at another position); ``tests/teacher_server/test_prefix_cache.py``
checks it. Runs on the server's one worker thread; it is not thread-safe.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from typing import Any

from miniverl.common.shared_prefix import (
    MIN_SHARED_TOKENS,
    hidden_on_prefix,
    output_cache,
    shared_prefix_len,
)

# Total tokens kept across entries. One token costs 2 * layers * kv_heads * head_dim
# values: 2,048 tokens of an 8B Qwen3 in bf16 are about 300 MB of accelerator memory.
PREFIX_CACHE_TOKENS = 2048
MAX_ENTRIES = 4


@dataclass(eq=False)  # entries are compared by identity (list.remove)
class _Entry:
    ids_T: Any  # long [n] prefix tokens
    hidden_1_T_H: Any  # the decoder's last hidden states over the prefix
    kv: Any  # the decoder's KV cache over the prefix (batch 1)
    key: str | None = None  # the adapter that computed it (None: the model alone)


class PrefixCache:
    """Shared prefixes of recent requests: their hidden states and KV caches."""

    def __init__(self, max_tokens: int = PREFIX_CACHE_TOKENS, *, min_shared: int = MIN_SHARED_TOKENS):
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0; got {max_tokens}")
        self.max_tokens = max_tokens
        self.min_shared = min_shared
        self.entries: list[_Entry] = []
        self._recent_rows: deque = deque(maxlen=MAX_ENTRIES)  # (key, first row) of recent misses
        self.hits = 0
        self.misses = 0
        self.tokens_reused = 0

    @property
    def tokens(self) -> int:
        return sum(int(e.ids_T.shape[0]) for e in self.entries)

    def clear(self) -> None:
        self.entries.clear()
        self._recent_rows.clear()

    def stats(self) -> dict[str, int]:
        return {"entries": len(self.entries), "tokens": self.tokens, "hits": self.hits,
                "misses": self.misses, "tokens_reused": self.tokens_reused}

    def keyed(self, key: str | None) -> _Keyed:
        """This cache as seen by the adapter ``key``: it finds and stores only blocks that
        adapter computed (the token budget stays shared)."""
        return _Keyed(self, key)

    def hidden(self, decoder: Any, ids_B_T: Any, mask_B_T: Any, lengths: list[int],
               key: str | None = None) -> Any:
        """``hidden_B_T_H`` of ``decoder`` over a right-padded batch, reusing a cached prefix
        that the same ``key`` (adapter) computed.

        Same contract as :func:`miniverl.common.shared_prefix.decoder_hidden` (inference
        only: the cached tensors carry no graph).
        """
        B = ids_B_T.shape[0]
        row0 = ids_B_T[0, : lengths[0]]
        # Every row keeps at least one token of its own.
        n_batch = shared_prefix_len(ids_B_T, lengths) if B > 1 else max(lengths[0] - 1, 0)
        entry = self._lookup(row0, n_batch, key)
        if entry is not None:
            self.hits += 1
            self.tokens_reused += int(entry.ids_T.shape[0]) * B
        else:
            self.misses += 1
            n = self._new_prefix_len(row0, n_batch, B, key)
            self._recent_rows.append((key, row0.clone()))
            if n < self.min_shared:
                return decoder(input_ids=ids_B_T, attention_mask=mask_B_T,
                               use_cache=False).last_hidden_state
            head = decoder(input_ids=ids_B_T[:1, :n], use_cache=True)
            entry = _Entry(ids_B_T[0, :n].clone(), head.last_hidden_state, output_cache(head),
                           key)
            self._store(entry)  # kept only within the budget; this batch uses it anyway
        # The tail's forward repeats and extends the cache: work on a copy.
        return hidden_on_prefix(decoder, ids_B_T, mask_B_T, entry.hidden_1_T_H,
                                copy.deepcopy(entry.kv))

    def _lookup(self, row0: Any, n_batch: int, key: str | None) -> _Entry | None:
        """The longest prefix ``key`` cached that every row of the batch starts with."""
        best = None
        for entry in self.entries:
            if entry.key != key:
                continue
            n = int(entry.ids_T.shape[0])
            longer = best is None or n > best.ids_T.shape[0]
            if n <= n_batch and longer and bool((row0[:n] == entry.ids_T).all()):
                best = entry
        if best is not None:
            self.entries.remove(best)
            self.entries.insert(0, best)
        return best

    def _new_prefix_len(self, row0: Any, n_batch: int, B: int, key: str | None) -> int:
        """How much of this batch to cache: what it shares with an earlier request of the
        same ``key``, or, when nothing earlier matches, what its own rows share."""
        refs = ([e.ids_T for e in self.entries if e.key == key]
                + [row for row_key, row in self._recent_rows if row_key == key])
        n = max((_common_len(row0, ref) for ref in refs), default=0)
        n = min(n, n_batch)
        if n < self.min_shared and B > 1:
            n = n_batch
        return n

    def _store(self, entry: _Entry) -> None:
        if entry.ids_T.shape[0] > self.max_tokens:  # a block beyond the budget is not kept
            return
        self.entries.insert(0, entry)
        while len(self.entries) > MAX_ENTRIES or self.tokens > self.max_tokens:
            self.entries.pop()


@dataclass(frozen=True)
class _Keyed:
    """A :class:`PrefixCache` seen by one adapter (what ``gather_hidden`` calls)."""

    cache: PrefixCache
    key: str | None

    def hidden(self, decoder: Any, ids_B_T: Any, mask_B_T: Any, lengths: list[int]) -> Any:
        return self.cache.hidden(decoder, ids_B_T, mask_B_T, lengths, key=self.key)


def _common_len(a: Any, b: Any) -> int:
    n = min(int(a.shape[0]), int(b.shape[0]))
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0, 0]) if diff.numel() else n
