"""Byte-offset alignment of one episode rendered by two tokenizers (docs/cross-tokenizer.md).

A student and a teacher with different tokenizers each render the same messages and
tool results with their own chat template, and each tokenizes its own rendering. This
module finds which student positions and which teacher positions cover the same bytes
of the episode's *contents* (message texts, tool-call names and arguments, tool
results), so a cross-vocabulary target can be computed per group of positions.

Three steps, each a pure function (arrays in, arrays out, deterministic):

* :func:`render_pieces` renders a conversation with each content string replaced by a
  unique placeholder, so the rendered text splits into *pieces*: contents (with their
  provenance: prompt, model, environment) and template scaffolding between them. The
  real rendering must be the placeholder rendering with each content put back whole or
  trimmed (Qwen3's template drops a reply's leading newlines); bytes one side trimmed
  are that side's own. A template that rewrites a content otherwise is refused.
* :func:`token_byte_cuts` tokenizes a text and returns each token's UTF-8 byte span as
  a partition of the text's bytes: the tokenizer's character offsets turned into byte
  offsets, byte-level and byte-fallback tokens that share one character split by their
  byte lengths, bytes a normalizer folded into a neighbour (NFC composing ``e`` and
  U+0301) given to the token before them.
* :func:`align` walks the contents both sides share and closes a group where both
  sides start a new token, as TRL 1.16's GOLD trainer does on one completion
  (``ULDLoss._align_by_byte_offsets``). Template tokens, which exist on one side only,
  become one-sided groups. Every token of each side is in exactly one group; a group
  whose bytes are not all of one content provenance is not trainable.

Positions are token indices of each side's own rendering. Which logit predicts which
token (index ``j - 1`` predicts token ``j``) is the targets' business
(``student/train/teacher/cross_vocab.py``), not this module's. This module imports neither
torch nor transformers: it reads a ``tokenizers.Tokenizer`` (a fast tokenizer's
``backend_tokenizer``) and a transformers tokenizer's ``apply_chat_template`` only
through the objects it is handed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ConfigError

# Provenance of a byte. A content byte keeps the provenance of the message it came
# from; template bytes (role headers, special tokens, tool-call scaffolding) are
# TEMPLATE. A group's provenance is MIXED when its bytes are not all of one kind.
TEMPLATE, PROMPT, MODEL, ENVIRONMENT = 0, 1, 2, 3
MIXED = -1
PROVENANCE_NAMES = {TEMPLATE: "template", PROMPT: "prompt", MODEL: "model",
                    ENVIRONMENT: "environment", MIXED: "mixed"}
_ROLE_PROVENANCE = {"system": PROMPT, "user": PROMPT, "assistant": MODEL, "tool": ENVIRONMENT}

# Private-use code points: no chat template writes them, strips them or merges them.
_PLACEHOLDER = "\ue000{}\ue001"
_PLACEHOLDER_RE = re.compile("\ue000(\\d+)\ue001")
_BYTE_FALLBACK_RE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass(frozen=True)
class Rendering:
    """One side's rendering of an episode: its text and where the contents sit in it.

    ``piece_start_C``/``piece_end_C`` are UTF-8 byte offsets of what the template
    wrote of each content piece in ``text`` (in message order): all of it, or the part
    left after a trim, which starts ``piece_offset_C`` bytes into the content.
    ``piece_provenance_C`` is each piece's provenance and ``piece_text`` its full string;
    every byte outside the pieces is template.
    """

    text: str
    piece_text: tuple[str, ...]
    piece_start_C: np.ndarray
    piece_end_C: np.ndarray
    piece_offset_C: np.ndarray
    piece_provenance_C: np.ndarray


@dataclass(frozen=True)
class Alignment:
    """Groups of student and teacher positions that cover the same bytes.

    Group ``g`` holds student positions ``[student_start_G[g], student_end_G[g])`` and
    teacher positions ``[teacher_start_G[g], teacher_end_G[g])`` (an empty range on the
    side a template group does not exist on). Groups are ordered along the episode and
    each side's ranges tile its positions: every position in exactly one group.
    ``provenance_G`` is the one provenance of all the group's bytes or ``MIXED``;
    ``trainable_G`` is true where both sides are non-empty and the provenance is one
    content kind (not template, not mixed).
    """

    student_start_G: np.ndarray
    student_end_G: np.ndarray
    teacher_start_G: np.ndarray
    teacher_end_G: np.ndarray
    provenance_G: np.ndarray
    trainable_G: np.ndarray

    @property
    def num_groups(self) -> int:
        return int(self.student_start_G.shape[0])

    def student_group_T(self) -> np.ndarray:
        """The group index of every student position ``[T_s]``."""
        return np.repeat(np.arange(self.num_groups), self.student_end_G - self.student_start_G)

    def teacher_group_T(self) -> np.ndarray:
        """The group index of every teacher position ``[T_t]``."""
        return np.repeat(np.arange(self.num_groups), self.teacher_end_G - self.teacher_start_G)

    def digest(self) -> str:
        """``sha256:<hex>`` of the group arrays: what a cross-tokenizer reply is checked
        against, so a reply computed for another text or another split is refused."""
        h = hashlib.sha256()
        for arr in (self.student_start_G, self.student_end_G, self.teacher_start_G,
                    self.teacher_end_G, self.provenance_G, self.trainable_G):
            h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
        return "sha256:" + h.hexdigest()


def _content_string(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        # What transformers' ``tojson`` filter writes for a dict.
        return json.dumps(value, ensure_ascii=False)
    raise ConfigError(f"{what} is {type(value).__name__}; a chat message field must be a "
                      "string (or a dict for tool-call arguments)")


def render_pieces(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                  tools: Sequence[Mapping[str, Any]] | None = None) -> Rendering:
    """Render ``messages`` with ``tokenizer``'s chat template and locate every content.

    Contents are each message's ``content`` and each assistant tool call's ``name`` and
    ``arguments`` (a dict is rendered as ``tojson`` writes it); the provenance is the
    message role's (system and user: prompt, assistant: model, tool: environment). The
    tool schemas in ``tools`` are template: each chat template writes them its own way.
    """
    real: list[dict[str, Any]] = []
    marked: list[dict[str, Any]] = []
    pieces: list[tuple[str, int]] = []

    def mark(text: str, provenance: int) -> str:
        if not text:  # an empty string stays empty: templates test contents for truth
            return text
        pieces.append((text, provenance))
        return _PLACEHOLDER.format(len(pieces) - 1)

    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in _ROLE_PROVENANCE:
            raise ConfigError(f"message {i} has role {role!r}; cross-tokenizer alignment "
                              f"knows the roles {sorted(_ROLE_PROVENANCE)}")
        provenance = _ROLE_PROVENANCE[role]
        content = message.get("content") or ""
        content = _content_string(content, f"message {i} content")
        copy_real = dict(message, content=content)
        copy_marked = dict(message, content=mark(content, provenance))
        calls_real, calls_marked = [], []
        for j, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function", call)
            name = _content_string(fn.get("name", ""), f"message {i} tool call {j} name")
            args = _content_string(fn.get("arguments", ""), f"message {i} tool call {j} arguments")
            real_fn = dict(fn, name=name, arguments=args)
            marked_fn = dict(fn, name=mark(name, provenance), arguments=mark(args, provenance))
            wrap = "function" in call
            calls_real.append(dict(call, function=real_fn) if wrap else real_fn)
            calls_marked.append(dict(call, function=marked_fn) if wrap else marked_fn)
        if calls_real:
            copy_real["tool_calls"] = calls_real
            copy_marked["tool_calls"] = calls_marked
        real.append(copy_real)
        marked.append(copy_marked)

    kwargs: dict[str, Any] = {"tokenize": False}
    if tools:
        kwargs["tools"] = list(tools)
    text = tokenizer.apply_chat_template(real, **kwargs)
    template_text = tokenizer.apply_chat_template(marked, **kwargs)

    parts = _PLACEHOLDER_RE.split(template_text)
    order = [int(k) for k in parts[1::2]]
    if order != list(range(len(pieces))):
        raise ConfigError(
            f"the chat template renders contents {order} where {list(range(len(pieces)))} "
            "was expected (each once, in message order); cross-tokenizer alignment needs a "
            "template that writes every content verbatim"
        )
    starts, ends, offsets = _locate(text, parts[0::2], [p for p, _ in pieces])
    return Rendering(
        text=text,
        piece_text=tuple(p for p, _ in pieces),
        piece_start_C=np.asarray(starts, dtype=np.int64),
        piece_end_C=np.asarray(ends, dtype=np.int64),
        piece_offset_C=np.asarray(offsets, dtype=np.int64),
        piece_provenance_C=np.asarray([p for _, p in pieces], dtype=np.int64),
    )


def _locate(text: str, gaps: list[str], pieces: list[str]) -> tuple[list, list, list]:
    """Byte spans of each piece in ``text`` = ``gaps[0] piece[0] gaps[1] ... gaps[n]``.

    A template may trim a content (Qwen3's drops an assistant reply's leading newlines):
    then what it wrote must be one contiguous part of the content, and the span is that
    part, with its byte offset into the content. Any other rewrite is refused.
    """
    starts, ends, offsets = [], [], []
    cursor = 0  # in characters
    for k, piece in enumerate(pieces):
        gap, nxt = gaps[k], gaps[k + 1]
        if not text.startswith(gap, cursor):
            raise ConfigError(f"the chat template writes around content {k} differently when "
                              "it holds the real text; cross-tokenizer alignment needs a "
                              "template that writes contents verbatim")
        cursor += len(gap)
        written: str | None
        if text.startswith(piece + nxt, cursor):
            written = piece
        else:
            stop = len(text) - len(nxt) if k == len(pieces) - 1 else text.find(nxt, cursor) if nxt else -1
            written = text[cursor:stop] if stop >= cursor else None
            if written is None or piece.find(written) < 0:
                raise ConfigError(
                    f"the chat template rewrites content {k} ({piece[:40]!r}) beyond trimming "
                    "it; cross-tokenizer alignment needs a template that writes contents "
                    "verbatim"
                )
        head = len(text[:cursor].encode("utf-8"))
        starts.append(head)
        ends.append(head + len(written.encode("utf-8")))
        offsets.append(len(piece[:piece.find(written)].encode("utf-8")))
        cursor += len(written)
    if text[cursor:] != gaps[-1]:
        raise ConfigError("the chat template ends the conversation differently when it holds "
                          "the real text; cross-tokenizer alignment needs a template that "
                          "writes contents verbatim")
    return starts, ends, offsets


def _is_byte_level(backend: Any) -> bool:
    return "ByteLevel" in repr(backend.pre_tokenizer) or "ByteLevel" in repr(backend.decoder)


def _piece_byte_len(piece: str, special: bool, byte_level: bool) -> int:
    """UTF-8 bytes one token stands for, read from its piece string."""
    if special:
        return len(piece.encode("utf-8"))
    if byte_level:  # one GPT-2 byte-to-unicode character per byte
        return len(piece)
    if _BYTE_FALLBACK_RE.fullmatch(piece):
        return 1
    return len(piece.replace("\u2581", " ").encode("utf-8"))  # SentencePiece's word mark


def token_byte_cuts(backend: Any, text: str) -> tuple[np.ndarray, np.ndarray]:
    """``(ids_T, cuts_T1)``: the token ids of ``text`` and their byte spans as cuts.

    Token ``i`` covers the UTF-8 bytes ``[cuts[i], cuts[i + 1])`` of ``text``;
    ``cuts[0] == 0`` and ``cuts[-1] == len(text.encode())``, so the spans tile the
    bytes (a token may be empty: an added token a normalizer folded away). ``backend``
    is a ``tokenizers.Tokenizer``; no special tokens are added (the chat template
    wrote them).
    """
    enc = backend.encode(text, add_special_tokens=False)
    n_bytes = len(text.encode("utf-8"))
    char_to_byte = np.zeros(len(text) + 1, dtype=np.int64)
    if text:
        char_to_byte[1:] = np.cumsum([len(ch.encode("utf-8")) for ch in text])
    offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
    start_T = char_to_byte[offsets[:, 0]]
    end_T = char_to_byte[offsets[:, 1]]
    byte_level = _is_byte_level(backend)
    special = set(backend.get_added_tokens_decoder()) if hasattr(
        backend, "get_added_tokens_decoder") else set()
    n = len(enc.ids)
    # Tokens whose spans overlap (one character holding several byte tokens: an emoji
    # split by byte-level BPE, a byte-fallback run) share the character's span; split it
    # by the tokens' own byte lengths where they add up to it.
    i = 0
    while i < n:
        j, run_end = i + 1, end_T[i]
        while j < n and start_T[j] < run_end:
            run_end = max(run_end, end_T[j])
            j += 1
        if j - i > 1:
            lengths = [_piece_byte_len(enc.tokens[k], enc.ids[k] in special, byte_level)
                       for k in range(i, j)]
            run_start = start_T[i]
            if sum(lengths) == run_end - run_start:
                edges = run_start + np.concatenate([[0], np.cumsum(lengths)])
                start_T[i:j] = edges[:-1]
            else:  # lengths disagree (a normalizer rewrote the bytes): the first takes all
                start_T[i + 1:j] = run_end
        i = j
    # A partition: each token starts where the offsets say (never before the previous
    # one) and runs to the next token's start, so bytes a normalizer folded into a
    # token (U+0301 composed into "é") belong to the token before them.
    cuts = np.empty(n + 1, dtype=np.int64)
    if n:
        cuts[:n] = np.maximum.accumulate(start_T)
        cuts[0] = 0
    cuts[n] = n_bytes
    return np.asarray(enc.ids, dtype=np.int64), cuts


def _shared_bytes(student: Rendering, teacher: Rendering) -> tuple[list, list]:
    """Per side, ``(piece, byte indices)`` of the content bytes both sides wrote, in order.

    Where one template trimmed a content the other wrote whole, the bytes only one side
    holds are not shared (they count as that side's template).
    """
    s_idx, t_idx = [], []
    for k in range(len(student.piece_text)):
        s0, t0 = student.piece_offset_C[k], teacher.piece_offset_C[k]
        s_len = student.piece_end_C[k] - student.piece_start_C[k]
        t_len = teacher.piece_end_C[k] - teacher.piece_start_C[k]
        lo, hi = max(s0, t0), min(s0 + s_len, t0 + t_len)
        if hi > lo:
            s_idx.append((k, np.arange(lo, hi) - s0 + student.piece_start_C[k]))
            t_idx.append((k, np.arange(lo, hi) - t0 + teacher.piece_start_C[k]))
    return s_idx, t_idx


def _side(rendering: Rendering, cuts_T1: np.ndarray, shared: list[tuple[int, np.ndarray]]
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per byte: token index and provenance; and the byte index of each shared byte."""
    n_bytes = int(cuts_T1[-1])
    if n_bytes != len(rendering.text.encode("utf-8")):
        raise ConfigError(f"token cuts end at byte {n_bytes} but the rendering has "
                          f"{len(rendering.text.encode('utf-8'))} bytes; tokenize the same text")
    token_B = np.repeat(np.arange(cuts_T1.shape[0] - 1), np.diff(cuts_T1))
    prov_B = np.zeros(n_bytes, dtype=np.int64)
    for k, idx in shared:
        prov_B[idx] = rendering.piece_provenance_C[k]
    shared_S = np.concatenate([idx for _, idx in shared]) if shared else np.zeros(0, np.int64)
    return token_B, prov_B, shared_S


def align(student: Rendering, student_cuts_T1: np.ndarray,
          teacher: Rendering, teacher_cuts_T1: np.ndarray) -> Alignment:
    """Group the two sides' positions by the content bytes they cover (see the module doc).

    Both renderings must hold the same content pieces (the same strings with the same
    provenance, in the same order): the same messages rendered by two templates.
    """
    if student.piece_text != teacher.piece_text or not np.array_equal(
            student.piece_provenance_C, teacher.piece_provenance_C):
        diff = next((k for k, (a, b) in enumerate(
            zip(student.piece_text, teacher.piece_text, strict=False))
                     if a != b), min(len(student.piece_text), len(teacher.piece_text)))
        raise ConfigError(f"student and teacher renderings differ at content piece {diff}; "
                          "align renderings of the same messages and tool results")
    s_idx, t_idx = _shared_bytes(student, teacher)
    s_token_B, s_prov_B, s_shared_S = _side(student, student_cuts_T1, s_idx)
    t_token_B, t_prov_B, t_shared_S = _side(teacher, teacher_cuts_T1, t_idx)
    s_tok_S, t_tok_S = s_token_B[s_shared_S], t_token_B[t_shared_S]
    # A shared group closes where both sides start a new token.
    opens_S = np.ones(s_tok_S.shape[0], dtype=bool)
    opens_S[1:] = (s_tok_S[1:] != s_tok_S[:-1]) & (t_tok_S[1:] != t_tok_S[:-1])
    starts_S = np.flatnonzero(opens_S)
    ends_S = np.append(starts_S[1:], s_tok_S.shape[0])[:starts_S.shape[0]] - 1
    # Tokens are monotone in the shared bytes, so a group's first and last tokens are
    # those of its first and last byte; a token between them (template bytes only) is in it.
    first = (s_tok_S[starts_S], t_tok_S[starts_S])
    last = (s_tok_S[ends_S], t_tok_S[ends_S])
    cuts = (student_cuts_T1, teacher_cuts_T1)
    counts: list[list[int]] = []  # [student tokens, teacher tokens] per group, in order
    cursor, latest = [0, 0], [-1, -1]  # per side: next token; latest group holding one

    def one_sided(side: int, stop: int) -> None:
        """Each side's tokens before ``stop`` that hold no shared byte: a group each,
        except an empty token, which joins the group of the token before it."""
        while cursor[side] < stop:
            i = cursor[side]
            if cuts[side][i + 1] == cuts[side][i] and latest[side] >= 0:
                counts[latest[side]][side] += 1  # the groups since have none of this side
            else:
                counts.append([1, 0] if side == 0 else [0, 1])
                latest[side] = len(counts) - 1
            cursor[side] += 1

    for g in range(starts_S.shape[0]):
        one_sided(0, int(first[0][g]))
        one_sided(1, int(first[1][g]))
        counts.append([int(last[0][g] - first[0][g]) + 1, int(last[1][g] - first[1][g]) + 1])
        latest[0] = latest[1] = len(counts) - 1
        cursor[0], cursor[1] = int(last[0][g]) + 1, int(last[1][g]) + 1
    one_sided(0, student_cuts_T1.shape[0] - 1)
    one_sided(1, teacher_cuts_T1.shape[0] - 1)

    count_G2 = np.asarray(counts, dtype=np.int64).reshape(-1, 2)
    se, te = np.cumsum(count_G2[:, 0]), np.cumsum(count_G2[:, 1])
    ss, ts = se - count_G2[:, 0], te - count_G2[:, 1]
    # The provenances present in each group's bytes, both sides, from prefix counts.
    present_G4 = np.zeros((count_G2.shape[0], 4), dtype=bool)
    for prov_B, c, lo, hi in ((s_prov_B, student_cuts_T1, ss, se),
                              (t_prov_B, teacher_cuts_T1, ts, te)):
        prefix_B4 = np.zeros((prov_B.shape[0] + 1, 4), dtype=np.int64)
        prefix_B4[1:] = np.cumsum(prov_B[:, None] == np.arange(4), axis=0)
        present_G4 |= (prefix_B4[c[hi]] - prefix_B4[c[lo]]) > 0
    n_kinds_G = present_G4.sum(1)
    prov_G = np.where(n_kinds_G == 1, present_G4.argmax(1), TEMPLATE)
    prov_G = np.where(n_kinds_G > 1, MIXED, prov_G)
    trainable_G = (se > ss) & (te > ts) & (prov_G != TEMPLATE) & (prov_G != MIXED)
    return Alignment(ss, se, ts, te, prov_G.astype(np.int64), trainable_G)


def align_episode(student_tokenizer: Any, teacher_tokenizer: Any,
                  messages: Sequence[Mapping[str, Any]],
                  tools: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Render, tokenize and align one episode for two fast tokenizers.

    Returns the two renderings, each side's ``(ids_T, cuts_T1)`` and the
    :class:`Alignment`; a convenience over :func:`render_pieces`,
    :func:`token_byte_cuts` and :func:`align`.
    """
    s_render = render_pieces(student_tokenizer, messages, tools)
    t_render = render_pieces(teacher_tokenizer, messages, tools)
    s_ids, s_cuts = token_byte_cuts(student_tokenizer.backend_tokenizer, s_render.text)
    t_ids, t_cuts = token_byte_cuts(teacher_tokenizer.backend_tokenizer, t_render.text)
    return {
        "student": s_render, "teacher": t_render,
        "student_ids": s_ids, "student_cuts": s_cuts,
        "teacher_ids": t_ids, "teacher_cuts": t_cuts,
        "alignment": align(s_render, s_cuts, t_render, t_cuts),
    }
