"""The teacher's half of an ``xvocab`` SCORE: its own rendering, tokens and alignment.

An xvocab request (docs/protocol.md, "xvocab"; ``protocol/xvocab.py``) carries an
episode, not token ids. :func:`plan_xvocab` turns it into work the backend already
knows: the teacher renders the messages with its own chat template
(``common/alignment.py``'s ``render_pieces``), tokenizes its rendering
(``token_byte_cuts``), rebuilds the student's rendering from the request (its text, the
pieces' byte spans, checked against the contents) and aligns the two (``align``). The
positions it scores are those predicting a teacher token of a trainable group, so the
backend computes a plain top-k request over the teacher's own tokens, and the batcher
sends the reply with the plan's tokens, groups and digests (:data:`XvocabPlan`).

It needs the backend's tokenizer (a fast ``transformers`` tokenizer with a chat
template, the backend's ``tokenizer`` attribute); a backend without one does not serve
the kind. This module neither parses the wire (``protocol/``) nor runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from miniverl.common.alignment import Rendering, align, render_pieces, token_byte_cuts
from miniverl.common.errors import ConfigError
from miniverl.protocol.xvocab import groups_of_alignment, request_digest


@dataclass(frozen=True)
class XvocabPlan:
    """What an xvocab reply carries besides the backend's top-k: the teacher's tokens
    ``i4[T_t]``, the groups ``i4[G, 6]``, the scored positions ``i4[P]`` (each predicts
    ``teacher_ids[p + 1]``) and the two digests of the reply header."""

    teacher_ids: np.ndarray
    groups: np.ndarray
    positions: np.ndarray
    episode_sha256: str
    alignment_sha256: str


def serves_xvocab(backend: Any) -> bool:
    """Whether ``backend`` can serve xvocab: it has a fast tokenizer with a chat template."""
    tokenizer = getattr(backend, "tokenizer", None)
    return (tokenizer is not None and hasattr(tokenizer, "backend_tokenizer")
            and getattr(tokenizer, "chat_template", None) is not None)


def plan_xvocab(tokenizer: Any, episode: dict[str, Any],
                arrays: dict[str, np.ndarray]) -> XvocabPlan:
    """The plan of one checked xvocab request (``protocol.xvocab.parse_xvocab_score``).

    Raises :class:`~miniverl.common.errors.ConfigError` with a one-line reason when the
    episode cannot be aligned: a template that rewrites a content, student pieces that
    do not hold the contents they claim, renderings of different contents.
    """
    messages, tools, text = episode["messages"], episode["tools"], episode["text"]
    teacher = render_pieces(tokenizer, messages, tools)
    ids_T, cuts_T1 = token_byte_cuts(tokenizer.backend_tokenizer, teacher.text)
    student = _student_rendering(text, teacher, arrays["student_pieces"])
    alignment = align(student, arrays["student_cuts"].astype(np.int64), teacher, cuts_T1)
    # Position p predicts token p + 1: score the tokens of trainable groups but the first.
    wanted = np.zeros(ids_T.shape[0], dtype=bool)
    for g in np.flatnonzero(alignment.trainable_G):
        wanted[alignment.teacher_start_G[g]:alignment.teacher_end_G[g]] = True
    wanted[0] = False
    positions = (np.flatnonzero(wanted) - 1).astype(np.int32)
    return XvocabPlan(
        teacher_ids=ids_T.astype(np.int32),
        groups=groups_of_alignment(alignment),
        positions=positions,
        episode_sha256=request_digest(arrays),
        alignment_sha256=alignment.digest(),
    )


def _student_rendering(text: str, teacher: Rendering, pieces_C3: np.ndarray) -> Rendering:
    """The student's :class:`Rendering` from its text and piece spans, each span checked
    to hold the bytes of its content it claims."""
    pieces = np.asarray(pieces_C3, dtype=np.int64).reshape(-1, 3)
    if pieces.shape[0] != len(teacher.piece_text):
        raise ConfigError(f"the request names {pieces.shape[0]} content pieces but the episode "
                          f"holds {len(teacher.piece_text)}; send one row per content "
                          "(common/alignment.py, render_pieces)")
    raw = text.encode("utf-8")
    for k, (start, end, offset) in enumerate(pieces.tolist()):
        content = teacher.piece_text[k].encode("utf-8")
        if raw[start:end] != content[offset:offset + end - start]:
            raise ConfigError(f"student piece {k} (bytes {start}..{end} of the rendering) does "
                              f"not hold content {k} from byte {offset}; send the spans "
                              "render_pieces found")
    return Rendering(text=text, piece_text=teacher.piece_text,
                     piece_start_C=pieces[:, 0].copy(), piece_end_C=pieces[:, 1].copy(),
                     piece_offset_C=pieces[:, 2].copy(),
                     piece_provenance_C=teacher.piece_provenance_C)
