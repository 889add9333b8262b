"""One decoder pass over a batch whose rows open with the same tokens; KV-cache helpers.

Every episode of an environment starts with the same system block (about half of a toy
calculator episode). A plain batched forward computes that block once per row; this
module computes it once, repeats its KV cache over the batch and runs only each row's
own tokens on top. The result equals the plain forward (same hidden states to float
rounding, same gradients: the repeated cache is differentiable, so every row's gradient
flows back into the one prefix pass). Training (``student.train.updates``) and teacher scoring
(``teacher_server.scoring``) both use it.

This module does not pad, select positions or apply the LM head. torch is imported by
the caller; nothing here runs at import time.
"""

from __future__ import annotations

import inspect
from typing import Any

# Below this many shared tokens the second decoder call costs more than it saves.
MIN_SHARED_TOKENS = 32


def shared_prefix_len(ids_B_T: Any, lengths: list[int]) -> int:
    """Tokens every row shares at its start, leaving each row at least one of its own."""
    import torch

    if ids_B_T.shape[0] < 2 or not lengths:
        return 0
    limit = min(lengths) - 1
    if limit <= 0:
        return 0
    same_T = (ids_B_T[:, :limit] == ids_B_T[:1, :limit]).all(dim=0)
    if bool(same_T.all()):
        return limit
    return int(torch.argmin(same_T.to(torch.int8)))


def cache_kwarg(decoder: Any) -> str:
    """The KV cache argument of ``decoder.forward``: ``cache`` (recent transformers 5.x) or
    ``past_key_values`` (older releases, 4.x included).

    Read from the model class, not the instance: a PEFT wrapper's (or a test's) forward
    takes ``**kwargs`` and would hide the name, and the deprecated one would be chosen.
    """
    base = decoder.get_base_model() if hasattr(decoder, "get_base_model") else decoder
    params = inspect.signature(type(base).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache of a model output (``cache`` in transformers 5.x, else ``past_key_values``)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def decoder_hidden(
    decoder: Any,
    ids_B_T: Any,
    mask_B_T: Any,
    lengths: list[int],
    *,
    min_shared: int = MIN_SHARED_TOKENS,
) -> Any:
    """``hidden_B_T_H`` of ``decoder`` over a right-padded batch, sharing the common prefix.

    ``lengths`` are the rows' unpadded lengths (``mask_B_T`` is 1 on exactly those).
    Falls back to one plain forward when fewer than ``min_shared`` tokens are shared.
    """

    n_shared = shared_prefix_len(ids_B_T, lengths)
    if n_shared < min_shared:
        return decoder(input_ids=ids_B_T, attention_mask=mask_B_T, use_cache=False).last_hidden_state
    head = decoder(input_ids=ids_B_T[:1, :n_shared], use_cache=True)
    return hidden_on_prefix(decoder, ids_B_T, mask_B_T, head.last_hidden_state, output_cache(head))


def hidden_on_prefix(decoder: Any, ids_B_T: Any, mask_B_T: Any, head_1_S_H: Any, cache: Any) -> Any:
    """``hidden_B_T_H`` of a batch whose first ``S`` tokens were run once (batch 1).

    ``head_1_S_H`` and ``cache`` are that pass's hidden states and KV cache; ``cache`` is
    repeated over the batch in place and extended by the rows' own tokens.
    """
    import torch

    B, S = ids_B_T.shape[0], head_1_S_H.shape[1]
    cache.batch_repeat_interleave(B)
    # Right padding: every row's own tokens continue at position S, so the default
    # positions (from the cache length) are the unpadded ones.
    tail = decoder(
        input_ids=ids_B_T[:, S:], attention_mask=mask_B_T, use_cache=True,
        **{cache_kwarg(decoder): cache},
    )
    return torch.cat([head_1_S_H.expand(B, -1, -1), tail.last_hidden_state], dim=1)
