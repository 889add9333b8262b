"""Byte-offset alignment of one episode rendered by two tokenizers (common/alignment.py).

For the three tokenizer pairs of docs/cross-tokenizer.md (and a byte-fallback
tokenizer none of them is), on episodes full of emoji, combining marks, tool JSON,
characters a vocabulary lacks and whitespace runs: every byte is covered exactly once
on each side, a group's two sides cover the same content bytes, and no trainable group
crosses a provenance boundary (tests/common/cross_tokenizer_kit.py states each
property). Hypothesis draws random text for the pairs that load in a second.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miniverl.common.alignment import (
    ENVIRONMENT,
    MIXED,
    MODEL,
    TEMPLATE,
    Rendering,
    align,
    align_episode,
    render_pieces,
    token_byte_cuts,
)
from miniverl.common.errors import ConfigError
from tests.common.cross_tokenizer_kit import (
    HOSTILE,
    LOADERS,
    SKIPS,
    check_alignment,
    hostile_episode,
)

PAIRS = [("toy", "qwen3"), ("qwen3", "smollm2"), ("toy", "smollm2"),
         ("byte_fallback", "qwen3"), ("byte_fallback", "toy")]


def _load(name: str):
    tok = LOADERS[name]()
    if tok is None:
        pytest.skip(SKIPS[name])
    return tok


# Reading SmolLM2's tokenizer from its GGUF takes over 2 s, paid by the first pair that
# asks: its pairs are in the slow tier (tests/tiers.py).
@pytest.mark.parametrize("student,teacher", [
    pytest.param(*pair, marks=pytest.mark.slow) if "smollm2" in pair else pair
    for pair in PAIRS], ids=["-".join(p) for p in PAIRS])
@pytest.mark.parametrize("text", HOSTILE, ids=["emoji", "combining", "fallback", "whitespace",
                                               "newlines"])
def test_hostile_text_aligns(student, teacher, text):
    result = check_alignment(_load(student), _load(teacher), hostile_episode(text))
    a = result["alignment"]
    # The model's own contents and the tool results are trained somewhere in each episode.
    assert (a.trainable_G & (a.provenance_G == MODEL)).any()
    assert (a.trainable_G & (a.provenance_G == ENVIRONMENT)).any()


@pytest.mark.slow
@pytest.mark.parametrize("student,teacher", [("toy", "qwen3"), ("qwen3", "toy"),
                                             ("byte_fallback", "qwen3")])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_text_aligns(student, teacher, data):
    text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
    episode = [
        {"role": "user", "content": data.draw(text)},
        {"role": "assistant", "content": data.draw(text)},
        {"role": "tool", "content": data.draw(text)},
        {"role": "assistant", "content": data.draw(text)},
    ]
    check_alignment(_load(student), _load(teacher), episode, tools=None)


def test_same_tokenizer_gives_one_token_groups():
    """A tokenizer aligned with itself: every content token is a group of its own,
    paired with itself, so cross-vocabulary targets reduce to the same-tokenizer ones;
    template tokens are one-sided groups (each side's own scaffolding)."""
    tok = _load("qwen3")
    a = check_alignment(tok, tok, hostile_episode(HOSTILE[0]))["alignment"]
    s_n, t_n = a.student_end_G - a.student_start_G, a.teacher_end_G - a.teacher_start_G
    two = (s_n > 0) & (t_n > 0)
    assert (s_n[two] == 1).all() and (t_n[two] == 1).all()
    assert (a.student_start_G[two] == a.teacher_start_G[two]).all()
    assert (a.provenance_G[~two] == TEMPLATE).all()


def test_template_and_mixed_groups_are_not_trainable():
    """Qwen3 writes the system text's final "." and its template's "\\n\\n# Tools" as
    one token ".\\n\\n"; the group holding it mixes provenance and is not trained on."""
    toy, qwen = _load("toy"), _load("qwen3")
    a = check_alignment(toy, qwen, [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hi."},
                                    {"role": "assistant", "content": "Done."}])["alignment"]
    assert (a.provenance_G == MIXED).any() and not a.trainable_G[a.provenance_G == MIXED].any()
    assert not a.trainable_G[a.provenance_G == TEMPLATE].any()


def test_cuts_split_a_character_shared_by_byte_tokens():
    """The toy tokenizer gives each byte of 👍 its own token, all with the one
    character's offsets; the cuts give each token one byte."""
    ids, cuts = token_byte_cuts(_load("toy").backend_tokenizer, "a👍b")
    assert cuts.tolist() == [0, 1, 2, 3, 4, 5, 6] and len(ids) == 6


def test_cuts_give_a_composed_mark_to_the_token_before():
    """Qwen3's NFC normalizer composes e + U+0301 into one token whose offsets skip the
    mark; the mark's bytes go to that token, so nothing is left uncovered."""
    text = "e\u0301x"
    _, cuts = token_byte_cuts(_load("qwen3").backend_tokenizer, text)
    assert cuts[0] == 0 and cuts[-1] == len(text.encode()) and cuts[1] >= 3


def test_renderings_of_other_messages_are_refused():
    toy = _load("toy")
    one = render_pieces(toy, [{"role": "user", "content": "a"}])
    other = render_pieces(toy, [{"role": "user", "content": "b"}])
    _, cuts1 = token_byte_cuts(toy.backend_tokenizer, one.text)
    _, cuts2 = token_byte_cuts(toy.backend_tokenizer, other.text)
    with pytest.raises(ConfigError, match="differ at content piece 0"):
        align(one, cuts1, other, cuts2)


class _Template:
    """A stand-in chat template that applies ``edit`` to every content it writes."""

    def __init__(self, edit):
        self.edit = edit

    def apply_chat_template(self, messages, tokenize=False, **_):
        return "".join(f"<{m['role']}>{self.edit(m['content'])}" for m in messages)


def test_a_template_that_rewrites_contents_is_refused():
    with pytest.raises(ConfigError, match="rewrites content 0"):
        render_pieces(_Template(str.upper), [{"role": "user", "content": "quiet"}])


def test_bytes_one_template_trims_are_not_shared():
    """Qwen3's template drops a reply's leading newlines; a template that trims is
    read as writing part of the content, and the part only one side wrote is that
    side's own (never in a trainable group)."""
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\n\n  ok"}]
    trimmed = render_pieces(_Template(str.strip), msgs)
    assert trimmed.piece_offset_C.tolist() == [0, 4]
    assert trimmed.text.encode()[trimmed.piece_start_C[1]:trimmed.piece_end_C[1]] == b"ok"
    whole = render_pieces(_Template(lambda c: c), msgs)
    cuts_w = np.arange(len(whole.text.encode()) + 1)
    cuts_t = np.arange(len(trimmed.text.encode()) + 1)
    a = align(whole, cuts_w, trimmed, cuts_t)
    trained = a.student_start_G[a.trainable_G]
    assert [whole.text.encode()[i:i + 1] for i in trained] == [b"q", b"o", b"k"]


def test_digest_changes_with_the_split():
    toy, qwen = _load("toy"), _load("qwen3")
    msgs = hostile_episode(HOSTILE[3])
    a = align_episode(toy, qwen, msgs)["alignment"]
    b = align_episode(toy, qwen, msgs)["alignment"]
    assert a.digest() == b.digest()
    piece = Rendering("ab", ("ab",), np.array([0]), np.array([2]), np.array([0]),
                      np.array([MODEL]))
    whole = align(piece, np.array([0, 2]), piece, np.array([0, 2]))
    split = align(piece, np.array([0, 1, 2]), piece, np.array([0, 2]))
    assert whole.digest() != split.digest()


def test_an_empty_token_joins_the_group_before_it():
    """A token with no bytes (an offset run whose byte lengths did not add up) is kept:
    in the group of the token before it, so positions still tile."""
    text = "xab"
    student = Rendering(text, ("ab",), np.array([1]), np.array([3]), np.array([0]),
                        np.array([MODEL]))
    a = align(student, np.array([0, 1, 1, 3]), student, np.array([0, 1, 3]))
    assert list(zip(a.student_start_G, a.student_end_G, strict=True)) == [(0, 2), (2, 2), (2, 3)]
    assert list(zip(a.teacher_start_G, a.teacher_end_G, strict=True)) == [(0, 0), (0, 1), (1, 2)]
    assert a.trainable_G.tolist() == [False, False, True]
