"""Tokenizer identity: one fingerprint that student and teacher must share.

``tokenizer_fingerprint(dir)`` reads a saved Hugging Face tokenizer directory with
the standard library only (no torch, no transformers); ``fingerprint_tokenizer(tok)``
computes the same string from a loaded ``PreTrainedTokenizerFast``. Both hash the
canonical JSON of three things: the ``tokenizer.json`` model (vocabulary, merges,
added tokens, normalizer, pre-tokenizer, decoder), the named special tokens, and
the chat template. Any change that could turn the same ids into different text, or
the same conversation into different ids, changes the fingerprint.

This module does not load, train or compare tokenizers across vocabularies;
cross-tokenizer distillation is rejected, not mapped.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .errors import ConfigError

NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
)
EXTRA_SPECIAL_KEYS = ("additional_special_tokens", "extra_special_tokens")


def _content(token: Any) -> str | None:
    """Special tokens are saved as a string or an AddedToken dict ``{"content": ...}``."""
    if token is None:
        return None
    if isinstance(token, dict):
        return token.get("content")
    return str(token)


def _extras(value: Any) -> list[str]:
    if isinstance(value, dict):  # named extra tokens, e.g. {"image_token": "<image>"}
        value = list(value.values())
    return [c for c in (_content(v) for v in value or []) if c is not None]


def _canonical_template(template: Any) -> Any:
    """A template is a string, or a list of {name, template} / a dict of named ones."""
    if isinstance(template, list):
        return {item["name"]: item["template"] for item in template}
    return template or None


def _digest(tokenizer_json: dict, special: dict[str, Any], chat_template: Any) -> str:
    payload = {
        "tokenizer": tokenizer_json,
        "special_tokens": special,
        "chat_template": _canonical_template(chat_template),
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _special(named: dict[str, str | None], extras: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {name: named.get(name) for name in NAMED_SPECIAL_TOKENS}
    out["extra"] = sorted(set(extras))
    return out


def tokenizer_fingerprint(path: str | Path) -> str:
    """``sha256:<hex>`` identity of a saved tokenizer directory, computed without torch."""
    root = Path(path)
    tok_file = root / "tokenizer.json"
    if not tok_file.is_file():
        raise ConfigError(
            f"{root} has no tokenizer.json; only fast (tokenizers-backed) tokenizers can be "
            "fingerprinted; re-save it with PreTrainedTokenizerFast.save_pretrained"
        )
    tokenizer_json = json.loads(tok_file.read_text(encoding="utf-8"))
    config: dict[str, Any] = {}
    config_file = root / "tokenizer_config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
    special_map: dict[str, Any] = {}
    map_file = root / "special_tokens_map.json"
    if map_file.is_file():
        special_map = json.loads(map_file.read_text(encoding="utf-8"))
    named = {
        name: _content(config.get(name, special_map.get(name))) for name in NAMED_SPECIAL_TOKENS
    }
    extras: list[str] = []
    for key in EXTRA_SPECIAL_KEYS:
        extras += _extras(config.get(key)) + _extras(special_map.get(key))
    # Newer transformers save the template beside the config; older ones inside it.
    template: Any = config.get("chat_template")
    jinja = root / "chat_template.jinja"
    template_json = root / "chat_template.json"
    if jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    elif template_json.is_file():
        template = json.loads(template_json.read_text(encoding="utf-8")).get("chat_template")
    extra_dir = root / "additional_chat_templates"
    if extra_dir.is_dir() and any(extra_dir.glob("*.jinja")):
        named_templates = {} if template is None else {"default": template}
        for file in sorted(extra_dir.glob("*.jinja")):
            named_templates[file.stem] = file.read_text(encoding="utf-8")
        template = named_templates
    return _digest(tokenizer_json, _special(named, extras), template)


def fingerprint_tokenizer(tok: Any) -> str:
    """The same fingerprint as :func:`tokenizer_fingerprint`, from a loaded fast tokenizer."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(
            f"{type(tok).__name__} is not a fast tokenizer; load it with "
            "PreTrainedTokenizerFast / AutoTokenizer(use_fast=True)"
        )
    tokenizer_json = json.loads(backend.to_str())
    named = {name: _content(getattr(tok, name, None)) for name in NAMED_SPECIAL_TOKENS}
    extras: list[str] = []
    for key in EXTRA_SPECIAL_KEYS:
        try:
            extras += _extras(getattr(tok, key, None))
        except (AttributeError, ValueError):
            continue
    return _digest(tokenizer_json, _special(named, extras), getattr(tok, "chat_template", None))
