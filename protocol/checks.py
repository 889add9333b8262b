"""What the arrays of a ``SCORE`` and a ``SCORE_OK`` must satisfy (docs/protocol.md,
"SCORE" and "SCORE_OK").

The one module on the wire that looks at a position or a target. Each check runs once
on each side, where docs/protocol.md ("Where each check runs") says:

- :func:`check_limits` holds a decoded message to the negotiated limits (token,
  sequence and position counts, ``k``, the exact vocabulary, the teacher model's
  context); the codec runs it on every message either side receives.
- :func:`check_score` checks a SCORE against the teacher's vocabulary: offsets, token
  ids, and that every position predicts a token of its own sequence. The teacher runs
  it once when it receives one (``teacher_server/server.py``); the client runs
  :func:`validate_score` (the codec's array and size rules, then :func:`check_score`)
  once before it sends (``client.py``). An ``xvocab`` SCORE has its own rules
  (``xvocab.py``: the episode, the student's cuts and pieces), which both call.
- :func:`nonfinite_report` is the finite-targets rule: every float of a reply is
  finite, except ``tail_logmass = -inf`` when ``k = V``. The teacher runs it once before
  it sends, whichever backend computed the reply (``teacher_server/batcher.py``); the
  client once on receipt, inside :func:`reply_problem`.
- :func:`reply_problem` is everything the client checks in a SCORE_OK that passed the
  staleness rule: it answers the request it names (kind, ``k``, positions, width),
  holds finite targets, and names no token id outside the vocabulary. The pending
  table runs it once per reply (``pending.py``, :meth:`PendingTable.on_score_ok`);
  :func:`xvocab_reply_problem` is its twin for an xvocab reply.

This module does not parse headers (``messages.py``), touch bytes (``codec.py``) or
decide staleness (``pending.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import (
    SCORE_ARRAYS,
    XVOCAB_SCORE_ARRAYS,
    ErrorCode,
    Message,
    ProtocolViolation,
    Score,
    ScoreOk,
)
from miniverl.protocol.xvocab import (
    alignment_of_groups,
    check_xvocab_sizes,
    parse_xvocab_score,
    tiles,
)


def check_limits(msg: Message, arrays: dict[str, np.ndarray], limits: Limits) -> None:
    """Negotiated limits that hold for a message no matter who receives it."""
    rid = msg.id

    def too_large(text: str) -> ProtocolViolation:
        return ProtocolViolation(text, ErrorCode.TOO_LARGE, rid)

    if isinstance(msg, (Score, ScoreOk)) and msg.kind == "xvocab":
        check_xvocab_sizes(msg, arrays, limits)
    elif isinstance(msg, Score):
        check_sequence_lengths(arrays["cu_seqlens"], limits, rid)
        _score_sizes(msg, arrays, limits)
    elif isinstance(msg, ScoreOk):
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


def _score_sizes(msg: Score, arrays: dict[str, np.ndarray], limits: Limits) -> None:
    """``TOO_LARGE`` for a SCORE with more tokens, sequences or positions, or a larger
    ``k``, than ``limits`` allow."""
    n, b, p = (arrays["tokens"].shape[0], arrays["cu_seqlens"].shape[0] - 1,
               arrays["positions"].shape[0])
    for what, count, limit in (("tokens", n, limits.max_tokens),
                               ("sequences", b, limits.max_sequences),
                               ("positions", p, limits.max_positions)):
        if count > limit:
            raise ProtocolViolation(f"SCORE has {count} {what}; the limit is {limit}",
                                    ErrorCode.TOO_LARGE, msg.id)
    if msg.kind == "topk" and msg.k > limits.max_k:
        raise ProtocolViolation(f"k={msg.k} exceeds the teacher's k_max={limits.max_k}",
                                ErrorCode.TOO_LARGE, msg.id)


def validate_score(msg: Score, arrays: dict[str, np.ndarray], vocab_size: int,
                   limits: Limits | None = None) -> None:
    """Everything a sender checks in a SCORE before it goes out (the client's one call).

    The arrays the codec requires (``tokens``, ``cu_seqlens``, ``positions`` as 1-D
    ``i4``), the size limits (N, B, P and ``k``: ``TOO_LARGE``), then
    :func:`check_score`. A receiver runs the first two as part of ``codec.decode``
    (:func:`check_limits`) and :func:`check_score` after it. Raises
    :class:`ProtocolViolation` with ``ref_id = msg.id``.
    """
    limits = limits or Limits()
    xvocab = msg.kind == "xvocab"
    for name, (dtype, ndim) in (XVOCAB_SCORE_ARRAYS if xvocab else SCORE_ARRAYS).items():
        arr = arrays.get(name)
        if arr is None or arr.ndim != ndim or arr.dtype != np.dtype("<" + dtype):
            raise ProtocolViolation(
                f"SCORE needs array {name!r} as {dtype}[{'N' if ndim == 1 else '...'}]",
                ErrorCode.BAD_REQUEST, msg.id)
    if xvocab:
        check_xvocab_sizes(msg, arrays, limits)
    else:
        _score_sizes(msg, arrays, limits)
    check_score(msg, arrays, vocab_size, limits)


def check_score(msg: Score, arrays: dict[str, np.ndarray], vocab_size: int,
                limits: Limits | None = None) -> None:
    """The content rules of a decoded SCORE, against the teacher's vocabulary.

    Rules (docs/protocol.md, "SCORE"): ``cu_seqlens`` holds B+1 >= 2 offsets, starts at
    0, never decreases and ends at N; P >= 1; every token id is in ``[0, vocab_size)``;
    every position ``p`` predicts a token of its own sequence,
    ``cu_seqlens[b] <= p < cu_seqlens[b+1] - 1``; ``k <= vocab_size``; exact scoring
    only when ``vocab_size <= max_exact_vocab`` (``UNSUPPORTED``). The teacher runs it
    once on receipt (``codec.decode`` has applied the sizes); the client through
    :func:`validate_score`. Raises :class:`ProtocolViolation` with ``ref_id = msg.id``.
    """
    limits = limits or Limits()
    rid = msg.id
    if msg.kind == "xvocab":  # no ids of the teacher's vocabulary: the episode's rules
        parse_xvocab_score(msg, arrays)
        return

    def bad(text: str, code: ErrorCode = ErrorCode.BAD_REQUEST) -> ProtocolViolation:
        return ProtocolViolation(text, code, rid)

    tokens, cu, positions = arrays["tokens"], arrays["cu_seqlens"], arrays["positions"]
    n, b, p = len(tokens), len(cu) - 1, len(positions)
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
        if msg.k > vocab_size:
            raise bad(f"k={msg.k} exceeds the vocabulary size {vocab_size}")
    elif vocab_size > limits.max_exact_vocab:
        raise bad(
            f"exact scoring needs V <= max_exact_vocab={limits.max_exact_vocab}, "
            f"but V={vocab_size}; ask for kind=topk",
            ErrorCode.UNSUPPORTED,
        )


def nonfinite_report(
    arrays: dict[str, np.ndarray], *, kind: str, k: int, vocab_size: int | None
) -> str | None:
    """``None`` when every float in a reply's ``arrays`` is allowed, else what was not.

    ``vocab_size`` is the teacher's ``V``; ``tail_logmass`` may be ``-inf`` (and only
    ``-inf``) when ``kind == "topk"`` and ``k >= vocab_size``. The report reads like
    ``"logprobs: 3 NaN, 1 +inf; target_logprobs: 2 NaN"``.
    """
    problems = []
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        if arr.dtype.kind != "f":
            continue
        finite = np.isfinite(arr)
        if bool(finite.all()):
            continue
        whole_vocab = kind == "topk" and vocab_size is not None and k >= vocab_size
        if name == "tail_logmass" and whole_vocab and bool(np.all(finite | (arr == -np.inf))):
            continue
        nan = int(np.isnan(arr).sum())
        pos = int((arr == np.inf).sum())
        neg = int((arr == -np.inf).sum())
        counts = [f"{n} {what}" for n, what in ((nan, "NaN"), (pos, "+inf"), (neg, "-inf")) if n]
        problems.append(f"{name}: {', '.join(counts)}")
    return "; ".join(problems) or None


class ReplyProblem(NamedTuple):
    """Why a SCORE_OK is not trained on: the counter it adds to and, when the request
    can no longer succeed, the error it ends with (None: it stays open and is resent)."""

    counter: str
    error: str | None


def reply_problem(
    msg: ScoreOk,
    arrays: dict[str, np.ndarray],
    *,
    kind: str,
    k: int,
    positions: int,
    vocab_size: int,
) -> ReplyProblem | None:
    """None when a reply to a request for ``positions`` positions of ``kind``/``k`` may be
    trained on, else the problem (see :class:`ReplyProblem`).

    A reply of another kind, ``k``, length or width (exact: ``V`` columns) is counted
    ``malformed`` and the request stays open. A NaN or an infinity the protocol forbids
    is ``nonfinite_replies`` and a top-k id outside ``[0, vocab_size)`` is ``malformed``:
    both end the request with a teacher error (an id past the vocabulary would index out
    of bounds in the loss's gather, a device-side assert on CUDA).
    """
    if msg.kind != kind or (kind == "topk" and msg.k != k):
        return ReplyProblem("malformed", None)
    if arrays["target_logprobs"].shape[0] != positions:
        return ReplyProblem("malformed", None)
    if kind == "exact" and arrays["logprobs"].shape[1] != vocab_size:
        return ReplyProblem("malformed", None)
    if problem := nonfinite_report(arrays, kind=msg.kind, k=msg.k, vocab_size=vocab_size):
        return ReplyProblem("nonfinite_replies", (
            f"teacher sent non-finite targets for SCORE {msg.id} ({problem}); the reply was "
            "dropped; check the teacher's weights, dtype and temperature"))
    ids = arrays.get("ids")
    if ids is not None and ids.size:
        bad = ids[(ids < 0) | (ids >= vocab_size)]
        if bad.size:
            return ReplyProblem("malformed", (
                f"teacher sent token ids outside [0, {vocab_size}) for SCORE {msg.id} (e.g. "
                f"{int(bad.flat[0])}); the reply was dropped; check the teacher's vocabulary "
                "and top-k"))
    return None


def xvocab_reply_problem(msg: ScoreOk, arrays: dict[str, np.ndarray], *, k: int,
                         request_sha256: str | None, student_tokens: int,
                         vocab_size: int) -> ReplyProblem | None:
    """None when an xvocab reply (``xvocab.py``) may be trained on, else the problem.

    A reply for another request (``episode_sha256`` not the digest of what was sent) is
    ``stale_dropped`` and the request stays open, as a reply for another version is. A
    reply whose groups do not tile the student's ``student_tokens`` positions and the
    teacher's tokens, whose ``alignment_sha256`` is not its groups' digest, or of another
    ``k`` is ``malformed`` (open); scored positions outside the teacher's tokens, ids
    outside ``[0, vocab_size)`` (the teacher's vocabulary) or non-finite floats end it.
    """
    if msg.kind != "xvocab" or msg.k != k:
        return ReplyProblem("malformed", None)
    if msg.episode_sha256 != request_sha256:
        return ReplyProblem("stale_dropped", None)
    groups = arrays["groups"].astype(np.int64)
    n_teacher = int(arrays["teacher_ids"].shape[0])
    if not (tiles(groups[:, 0], groups[:, 1], student_tokens)
            and tiles(groups[:, 2], groups[:, 3], n_teacher)):
        return ReplyProblem("malformed", None)
    if alignment_of_groups(groups).digest() != msg.alignment_sha256:
        return ReplyProblem("malformed", None)
    if problem := nonfinite_report(arrays, kind="topk", k=msg.k, vocab_size=vocab_size):
        return ReplyProblem("nonfinite_replies", (
            f"teacher sent non-finite targets for SCORE {msg.id} ({problem}); the reply was "
            "dropped; check the teacher's weights, dtype and temperature"))
    positions = arrays["positions"].astype(np.int64)
    if positions.size and (positions.min() < 0 or positions.max() >= n_teacher - 1):
        return ReplyProblem("malformed", (
            f"teacher scored positions outside its {n_teacher} tokens for SCORE {msg.id}; "
            "the reply was dropped"))
    for name in ("ids", "teacher_ids"):
        ids = arrays[name]
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            return ReplyProblem("malformed", (
                f"teacher sent {name} outside [0, {vocab_size}) for SCORE {msg.id}; the "
                "reply was dropped; check the teacher's vocabulary"))
    return None
