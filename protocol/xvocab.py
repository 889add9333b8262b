"""The ``xvocab`` target kind of ``mvl-score/1``: a teacher with another tokenizer
(docs/protocol.md, "xvocab"; docs/cross-tokenizer.md).

A student whose tokenizer differs from the teacher's cannot send token ids the teacher
understands. An xvocab ``SCORE`` sends the episode instead: the messages and tool
schemas as UTF-8 JSON (the teacher renders them with its own chat template), the
student's own rendering of them, the byte cuts of the student's tokens over that
rendering and where each content sits in it. The teacher tokenizes its rendering,
aligns the two by byte offsets (``common/alignment.py``), scores its own positions and
returns its tokens, the alignment groups and top-k targets over its vocabulary, with
two digests: of the request it scored (``episode_sha256``) and of the groups
(``alignment_sha256``). A client trains only on a reply whose request digest is the
one it sent, like a reply for the version it asked for.

This module holds the rules both sides apply and the digests:

- :func:`check_xvocab_sizes`: the negotiated size limits of an xvocab SCORE or
  SCORE_OK (``checks.check_limits`` calls it; ``TOO_LARGE``, ``BAD_REQUEST``);
- :func:`parse_xvocab_score`: the content rules of an xvocab SCORE (the teacher on
  receipt, the client before it sends) and the parsed episode;
- :func:`alignment_of_groups` and :func:`tiles`, which ``checks.xvocab_reply_problem``
  (what the client checks in an xvocab SCORE_OK) reads the reply's groups with.

It does not render, tokenize or align (``common/alignment.py``), score
(``teacher_server/``) or turn targets into a loss (``student/train/teacher/cross_vocab.py``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from miniverl.common.alignment import Alignment, render_pieces, token_byte_cuts
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import ErrorCode, ProtocolViolation, Score, ScoreOk

GROUP_COLUMNS = 6  # student start, end, teacher start, end, provenance, trainable
EPISODE_KEYS = frozenset({"messages", "tools", "text"})


def episode_bytes(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  text: str) -> np.ndarray:
    """The ``episode`` array of an xvocab SCORE: UTF-8 JSON of the messages, the tool
    schemas and the student's rendering ``text``, as ``u1`` bytes."""
    data = json.dumps({"messages": messages, "tools": tools, "text": text},
                      ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return np.frombuffer(data.encode("utf-8"), dtype=np.uint8)


def xvocab_request(tokenizer: Any, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What a student sends for one episode: ``episode``, ``student_cuts`` and
    ``student_pieces`` (the arrays of an xvocab SCORE), with its own ``ids`` ``[T]``,
    its ``rendering`` and the request's ``digest``. ``tokenizer`` is the student's fast
    tokenizer with its chat template (``common/alignment.py``)."""
    rendering = render_pieces(tokenizer, messages, tools)
    ids, cuts = token_byte_cuts(tokenizer.backend_tokenizer, rendering.text)
    arrays = {
        "episode": episode_bytes(list(messages), list(tools) if tools else None, rendering.text),
        "student_cuts": cuts.astype(np.int32),
        "student_pieces": np.stack([rendering.piece_start_C, rendering.piece_end_C,
                                    rendering.piece_offset_C], axis=1).astype(np.int32
                                                                              ).reshape(-1, 3),
    }
    return {**arrays, "ids": ids, "rendering": rendering, "digest": request_digest(arrays)}


def request_digest(arrays: dict[str, np.ndarray]) -> str:
    """``sha256:<hex>`` of an xvocab SCORE's three arrays (shapes and bytes): the
    ``episode_sha256`` a reply for this request carries."""
    h = hashlib.sha256()
    for name in ("episode", "student_cuts", "student_pieces"):
        arr = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{list(arr.shape)}:".encode())
        h.update(arr.tobytes())
    return "sha256:" + h.hexdigest()


def alignment_of_groups(groups_G6: np.ndarray) -> Alignment:
    """The :class:`~miniverl.common.alignment.Alignment` a reply's ``groups`` hold."""
    g = np.asarray(groups_G6, dtype=np.int64)
    return Alignment(g[:, 0], g[:, 1], g[:, 2], g[:, 3], g[:, 4], g[:, 5].astype(bool))


def groups_of_alignment(alignment: Alignment) -> np.ndarray:
    """The ``groups`` array ``i4[G, 6]`` of an alignment."""
    a = alignment
    cols = (a.student_start_G, a.student_end_G, a.teacher_start_G, a.teacher_end_G,
            a.provenance_G, a.trainable_G)
    return np.stack([np.asarray(c, dtype=np.int64) for c in cols], axis=1).astype(np.int32)


def check_xvocab_sizes(msg: Score | ScoreOk, arrays: dict[str, np.ndarray],
                       limits: Limits) -> None:
    """``TOO_LARGE`` (or ``BAD_REQUEST`` for shapes that disagree) for an xvocab message
    beyond ``limits``: the episode's bytes, the student's tokens and pieces; a reply's
    positions, ``k``, teacher tokens and groups."""
    rid = msg.id

    def too_large(text: str) -> ProtocolViolation:
        return ProtocolViolation(text, ErrorCode.TOO_LARGE, rid)

    def bad(text: str) -> ProtocolViolation:
        return ProtocolViolation(text, ErrorCode.BAD_REQUEST, rid)

    if msg.k > limits.max_k:
        raise too_large(f"k={msg.k} exceeds the teacher's k_max={limits.max_k}")
    if isinstance(msg, Score):
        n_bytes = arrays["episode"].shape[0]
        if n_bytes > limits.max_episode_bytes:
            raise too_large(f"the xvocab episode has {n_bytes} bytes; the limit is "
                            f"max_episode_bytes={limits.max_episode_bytes}; send a shorter "
                            "episode")
        tokens = arrays["student_cuts"].shape[0] - 1
        if tokens > limits.max_tokens:
            raise too_large(f"SCORE has {tokens} student tokens; the limit is {limits.max_tokens}")
        pieces = arrays["student_pieces"]
        if pieces.shape[1] != 3:
            raise bad(f"student_pieces must be [C, 3] (start, end, offset); got "
                      f"{list(pieces.shape)}")
        if pieces.shape[0] > n_bytes:
            raise bad(f"student_pieces has {pieces.shape[0]} rows for an episode of "
                      f"{n_bytes} bytes")
        return
    p = arrays["positions"].shape[0]
    if p > limits.max_positions:
        raise too_large(f"SCORE_OK has {p} positions; the limit is {limits.max_positions}")
    if arrays["teacher_ids"].shape[0] > limits.max_tokens:
        raise too_large(f"SCORE_OK has {arrays['teacher_ids'].shape[0]} teacher tokens; the "
                        f"limit is {limits.max_tokens}")
    if any(arrays[name].shape[0] != p for name in
           ("ids", "logprobs", "tail_logmass", "target_logprobs")):
        raise bad("SCORE_OK xvocab arrays disagree on P")
    if arrays["ids"].shape != (p, msg.k) or arrays["logprobs"].shape != (p, msg.k):
        raise bad(f"SCORE_OK xvocab top-k arrays must be [P, k={msg.k}]")
    groups = arrays["groups"]
    if groups.shape[1] != GROUP_COLUMNS or groups.shape[0] > 2 * limits.max_tokens:
        raise bad(f"SCORE_OK groups must be [G, {GROUP_COLUMNS}] with G <= 2 * max_tokens; "
                  f"got {list(groups.shape)}")


def parse_xvocab_score(msg: Score, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The content rules of an xvocab SCORE; returns the parsed episode.

    Rules (docs/protocol.md, "xvocab"): ``episode`` is UTF-8 JSON of an object with
    exactly ``messages`` (a non-empty list of objects), ``tools`` (a list of objects or
    null) and ``text`` (the student's rendering); ``student_cuts`` starts at 0, never
    decreases and ends at the rendering's byte length; every row of ``student_pieces``
    has ``0 <= start <= end <= len(text)`` and ``offset >= 0``, in increasing order.
    Raises :class:`ProtocolViolation` (``BAD_REQUEST``) with ``ref_id = msg.id``.
    """
    rid = msg.id

    def bad(text: str) -> ProtocolViolation:
        return ProtocolViolation(text, ErrorCode.BAD_REQUEST, rid)

    try:
        episode = json.loads(arrays["episode"].tobytes().decode("utf-8"),
                             parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise bad(f"the xvocab episode is not UTF-8 JSON: {str(exc)[:120]}") from None
    if not isinstance(episode, dict) or set(episode) != EPISODE_KEYS:
        keys = sorted(episode) if isinstance(episode, dict) else type(episode).__name__
        raise bad(f"the xvocab episode must be an object with keys {sorted(EPISODE_KEYS)}; "
                  f"got {keys}")
    messages, tools, text = episode["messages"], episode["tools"], episode["text"]
    if not isinstance(messages, list) or not messages or not all(
            isinstance(x, dict) for x in messages):
        raise bad("the xvocab episode's messages must be a non-empty list of objects")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(x, dict) for x in tools)):
        raise bad("the xvocab episode's tools must be a list of objects or null")
    if not isinstance(text, str):
        raise bad("the xvocab episode's text (the student's rendering) must be a string")
    n_bytes = len(text.encode("utf-8"))
    cuts = arrays["student_cuts"].astype(np.int64)
    if cuts.shape[0] < 2 or cuts[0] != 0 or cuts[-1] != n_bytes or np.any(np.diff(cuts) < 0):
        raise bad(f"student_cuts must start at 0, never decrease and end at the rendering's "
                  f"{n_bytes} bytes, with at least one token")
    pieces = arrays["student_pieces"].astype(np.int64)
    if pieces.size:
        start, end, offset = pieces[:, 0], pieces[:, 1], pieces[:, 2]
        if (np.any(start < 0) or np.any(end < start) or np.any(end > n_bytes)
                or np.any(offset < 0) or np.any(start[1:] < end[:-1])):
            raise bad("student_pieces rows must hold 0 <= start <= end <= len(text), "
                      "offset >= 0, in increasing order")
    return episode


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def tiles(start_G: np.ndarray, end_G: np.ndarray, n: int) -> bool:
    """Whether the ranges ``[start, end)`` tile ``[0, n)`` in order."""
    if start_G.size == 0:
        return n == 0
    return bool(start_G[0] == 0 and end_G[-1] == n and np.all(end_G >= start_G)
                and np.all(start_G[1:] == end_G[:-1]))
