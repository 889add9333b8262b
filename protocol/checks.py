"""What the arrays of a ``SCORE`` and a ``SCORE_OK`` must satisfy (DESIGN §3).

The one place on the wire that looks at a position: :func:`check_limits` holds a
decoded message to the negotiated limits (token, sequence and position counts, ``k``,
the exact vocabulary, the teacher model's context), whoever receives it;
:func:`validate_score` checks a SCORE against the teacher's vocabulary: offsets, token
ids, and that every position predicts a token of its own sequence. The client runs
``validate_score`` before it sends, the teacher when it receives.

This module does not parse headers (``messages.py``) or touch bytes (``codec.py``).
"""

from __future__ import annotations

import numpy as np

from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import (
    SCORE_ARRAYS,
    ErrorCode,
    Message,
    ProtocolViolation,
    Score,
)


def check_limits(msg: Message, arrays: dict[str, np.ndarray], limits: Limits) -> None:
    """Negotiated limits that hold for a message no matter who receives it."""
    rid = msg.id

    def too_large(text: str) -> ProtocolViolation:
        return ProtocolViolation(text, ErrorCode.TOO_LARGE, rid)

    if msg.t == "SCORE":
        n, p = arrays["tokens"].shape[0], arrays["positions"].shape[0]
        check_sequence_lengths(arrays["cu_seqlens"], limits, rid)
        if n > limits.max_tokens:
            raise too_large(f"SCORE has {n} tokens; the limit is {limits.max_tokens}")
        if p > limits.max_positions:
            raise too_large(f"SCORE has {p} positions; the limit is {limits.max_positions}")
        if arrays["cu_seqlens"].shape[0] - 1 > limits.max_sequences:
            raise too_large(f"SCORE has too many sequences; the limit is {limits.max_sequences}")
        if msg.kind == "topk" and msg.k > limits.max_k:
            raise too_large(f"k={msg.k} exceeds k_max={limits.max_k}")
    elif msg.t == "SCORE_OK":
        p = arrays["target_logprobs"].shape[0]
        if p > limits.max_positions:
            raise too_large(f"SCORE_OK has {p} positions; the limit is {limits.max_positions}")
        width = arrays["logprobs"].shape[1]
        if any(arr.shape[0] != p for arr in arrays.values()):
            raise ProtocolViolation("SCORE_OK arrays disagree on P", ErrorCode.BAD_REQUEST, rid)
        if msg.kind == "topk":
            if width != msg.k or arrays["ids"].shape != arrays["logprobs"].shape:
                raise ProtocolViolation(
                    f"SCORE_OK topk arrays must be [P, k={msg.k}]", ErrorCode.BAD_REQUEST, rid
                )
            if msg.k > limits.max_k:
                raise too_large(f"k={msg.k} exceeds k_max={limits.max_k}")
        elif width > limits.max_exact_vocab:
            raise too_large(f"exact reply V={width} exceeds {limits.max_exact_vocab}")


def check_sequence_lengths(cu_seqlens: np.ndarray, limits: Limits, rid: int | None) -> None:
    """``TOO_LARGE`` for a sequence longer than ``limits.max_seq_len`` (the teacher
    model's context); nothing when that limit is unset or ``cu_seqlens`` is too short
    to hold a sequence (``validate_score`` names that)."""
    if limits.max_seq_len is None or cu_seqlens.shape[0] < 2:
        return
    lengths = np.diff(cu_seqlens.astype(np.int64))
    longest = int(lengths.argmax())
    if int(lengths[longest]) > limits.max_seq_len:
        raise ProtocolViolation(
            f"sequence {longest} of the SCORE has {int(lengths[longest])} tokens; the teacher "
            f"model's context is {limits.max_seq_len} tokens; send sequences of at most "
            f"{limits.max_seq_len} tokens (lower rollout.max_total_tokens)",
            ErrorCode.TOO_LARGE,
            rid,
        )


def validate_score(
    msg: Score,
    arrays: dict[str, np.ndarray],
    vocab_size: int,
    limits: Limits | None = None,
) -> None:
    """Check a decoded SCORE against the teacher's vocabulary and limits.

    Rules (DESIGN §3): ``cu_seqlens`` starts at 0, never decreases and ends at N;
    every token id is in ``[0, vocab_size)``; every position ``p`` predicts a token of
    its own sequence, ``cu_seqlens[b] <= p < cu_seqlens[b+1] - 1``; ``k <= k_max`` and
    ``k <= vocab_size``; N, B and P within limits (``TOO_LARGE``); exact scoring only
    when ``vocab_size <= max_exact_vocab`` (``UNSUPPORTED``). Raises
    :class:`ProtocolViolation` with ``ref_id = msg.id``.
    """
    limits = limits or Limits()
    rid = msg.id

    def bad(text: str, code: ErrorCode = ErrorCode.BAD_REQUEST) -> ProtocolViolation:
        return ProtocolViolation(text, code, rid)

    for name, (dtype, ndim) in SCORE_ARRAYS.items():
        arr = arrays.get(name)
        if arr is None or arr.ndim != ndim or arr.dtype != np.dtype("<" + dtype):
            raise bad(f"SCORE needs array {name!r} as {dtype}[{'N' if ndim == 1 else '...'}]")
    tokens, cu, positions = arrays["tokens"], arrays["cu_seqlens"], arrays["positions"]
    n, b, p = len(tokens), len(cu) - 1, len(positions)
    if n > limits.max_tokens:
        raise bad(f"SCORE has {n} tokens; the limit is {limits.max_tokens}", ErrorCode.TOO_LARGE)
    if b > limits.max_sequences:
        raise bad(f"SCORE has {b} sequences; limit {limits.max_sequences}", ErrorCode.TOO_LARGE)
    if p > limits.max_positions:
        raise bad(
            f"SCORE has {p} positions; the limit is {limits.max_positions}", ErrorCode.TOO_LARGE
        )
    if b < 1:
        raise bad("cu_seqlens must hold B+1 >= 2 offsets")
    if p < 1:
        raise bad("positions is empty; send at least one position")
    cu64 = cu.astype(np.int64)
    if cu64[0] != 0 or cu64[-1] != n:
        raise bad(f"cu_seqlens must start at 0 and end at N={n}, got {cu64[0]}..{cu64[-1]}")
    if np.any(np.diff(cu64) < 0):
        raise bad("cu_seqlens must be non-decreasing")
    if n and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise bad(f"token ids must lie in [0, {vocab_size}), got {tokens.min()}..{tokens.max()}")
    pos64 = positions.astype(np.int64)
    seq = np.searchsorted(cu64, pos64, side="right") - 1
    inside = (pos64 >= 0) & (pos64 < n)
    seq = np.clip(seq, 0, b - 1)
    ok = inside & (cu64[seq] <= pos64) & (pos64 < cu64[seq + 1] - 1)
    if not bool(np.all(ok)):
        first = int(pos64[np.argmin(ok)])
        raise bad(
            f"position {first} does not predict a token of its own sequence "
            "(need cu_seqlens[b] <= p < cu_seqlens[b+1] - 1)"
        )
    if msg.kind == "topk":
        if msg.k > limits.max_k:
            raise bad(f"k={msg.k} exceeds the teacher's k_max={limits.max_k}", ErrorCode.TOO_LARGE)
        if msg.k > vocab_size:
            raise bad(f"k={msg.k} exceeds the vocabulary size {vocab_size}")
    elif vocab_size > limits.max_exact_vocab:
        raise bad(
            f"exact scoring needs V <= max_exact_vocab={limits.max_exact_vocab}, "
            f"but V={vocab_size}; ask for kind=topk",
            ErrorCode.UNSUPPORTED,
        )

