"""Tokenizer fingerprint: the directory and the loaded tokenizer agree; any change shows."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from miniverl.common.errors import ConfigError  # noqa: E402
from miniverl.common.tokenizer_id import fingerprint_tokenizer, tokenizer_fingerprint  # noqa: E402

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)


def build(template: str = TEMPLATE, extra: tuple[str, ...] = ("<|im_start|>",)):
    vocab = {tok: i for i, tok in enumerate(["<unk>", "<|im_start|>", "<|im_end|>", *"abcdef \n"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        additional_special_tokens=list(extra),
        chat_template=template,
    )


def test_directory_and_loaded_tokenizer_agree(tmp_path):
    # Student (loaded object) and teacher (directory) must compute the same identity.
    tok = build()
    tok.save_pretrained(tmp_path)
    fp = tokenizer_fingerprint(tmp_path)
    assert fp.startswith("sha256:") and len(fp) == 7 + 64
    assert fp == fingerprint_tokenizer(tok)
    assert fp == fingerprint_tokenizer(PreTrainedTokenizerFast.from_pretrained(tmp_path))


def test_chat_template_changes_fingerprint(tmp_path):
    a, b = build(), build(template=TEMPLATE.replace("\n", " "))
    assert fingerprint_tokenizer(a) != fingerprint_tokenizer(b)
    b.save_pretrained(tmp_path)
    assert tokenizer_fingerprint(tmp_path) == fingerprint_tokenizer(b)


def test_special_tokens_change_fingerprint(tmp_path):
    a = build()
    b = build()
    b.pad_token = "<unk>"
    assert fingerprint_tokenizer(a) != fingerprint_tokenizer(b)
    b.save_pretrained(tmp_path)
    assert tokenizer_fingerprint(tmp_path) == fingerprint_tokenizer(b)


def test_template_inside_config_is_read(tmp_path):
    # Older transformers keep the chat template inside tokenizer_config.json.
    tok = build()
    tok.save_pretrained(tmp_path)
    jinja = tmp_path / "chat_template.jinja"
    if jinja.exists():
        config = json.loads((tmp_path / "tokenizer_config.json").read_text())
        config["chat_template"] = jinja.read_text()
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
        jinja.unlink()
    assert tokenizer_fingerprint(tmp_path) == fingerprint_tokenizer(tok)


def test_vocabulary_edit_changes_fingerprint(tmp_path):
    tok = build()
    tok.save_pretrained(tmp_path)
    before = tokenizer_fingerprint(tmp_path)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data["model"]["vocab"]["g"] = len(data["model"]["vocab"])
    (tmp_path / "tokenizer.json").write_text(json.dumps(data, indent=4))
    assert tokenizer_fingerprint(tmp_path) != before


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(ConfigError, match="tokenizer.json"):
        tokenizer_fingerprint(tmp_path)
