"""The toy stack: a real tokenizer and tiny real Qwen3 models, built offline and cached.

``build_toy_tokenizer()`` makes a genuine ``PreTrainedTokenizerFast`` with the
``tokenizers`` library: byte level (every byte of UTF-8 is one token, so decoding is
exact for any string), plus the chat and tool special tokens, plus a compact
Qwen-style chat template (tools in the system block, Hermes ``<tool_call>`` rendering,
``tool`` messages wrapped in ``<tool_response>``, ``{% generation %}`` markers).
``build_toy_model(spec)`` makes a ``Qwen3ForCausalLM`` from a ``Qwen3Config``.
``toy_model_dir(spec)`` saves both as an ordinary Hugging Face directory in a per-user
cache keyed by a hash of the spec, so the toy and real models load through the same
``from_pretrained`` path (see ``common/modeling.py``).

This module defines no model classes and downloads nothing. torch and transformers are
imported inside the functions, so ``miniverl.common`` stays importable without them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import platformdirs
from filelock import FileLock

from .errors import ConfigError

# Bump when the tokenizer, the template or the model construction changes: cached
# directories built by an older layout must not be reused silently.
TOY_FORMAT_VERSION = 2

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
SPECIAL_TOKENS = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOL_RESPONSE_START,
    TOOL_RESPONSE_END,
)

# A Qwen2.5/Qwen3-style template, kept compact because every character is a token for
# the toy model: tools are listed one per line as ``name(arg, ...): description``
# instead of full JSON schemas, and no call instructions (the toy learns
# the Hermes format from oracle traces). Assistant turns render exactly like Qwen's Hermes
# format; consecutive ``tool`` messages share one user block like Qwen's template.
TOY_CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set sys = messages[0].content %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set sys = '' %}{%- set rest = messages %}{%- endif %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}{%- if sys %}{{- sys + '\\n' }}{%- endif %}"
    "{{- 'Tools:' }}"
    "{%- for tool in tools %}"
    "{%- set fn = tool.function if tool.function is defined else tool %}"
    "{%- set props = fn.parameters.properties if fn.parameters is defined"
    " and fn.parameters.properties is defined else {} %}"
    "{{- '\\n- ' + fn.name + '(' + (props.keys() | list | join(', ')) + ')' }}"
    "{%- if fn.description is defined and fn.description %}"
    "{{- ': ' + fn.description }}{%- endif %}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif sys %}"
    "{{- '<|im_start|>system\\n' + sys + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "{%- if message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tc in message.tool_calls %}"
    "{%- set call = tc.function if tc.function is defined else tc %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
    "{%- if call.arguments is string %}{{- call.arguments }}"
    "{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or rest[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or rest[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_toy_tokenizer():
    """A byte-level ``PreTrainedTokenizerFast`` with Qwen's chat and tool special tokens.

    Ids 0-255 are the 256 byte symbols (no merges), then the special tokens. Decoding
    is exact: ``decode(encode(s)) == s`` for every string.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    # No regex split: with no merges every byte is already its own token, and one
    # pre-token per string keeps encoding fast.
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    tok.chat_template = TOY_CHAT_TEMPLATE
    return tok


# Optional toy fields (None = the builder's default): the initial weight std and the
# rotary base; a larger std with a smaller base shortens the copy plateau.
OPTIONAL_FIELDS = ("init_std", "rope_theta")


def _spec_dict(spec: Any) -> dict[str, Any]:
    if isinstance(spec, dict):
        data = dict(spec)
    elif hasattr(spec, "model_dump"):
        data = spec.model_dump()
    else:
        data = dict(vars(spec))
    defaults = {
        "hidden": 64,
        "layers": 2,
        "heads": 4,
        "kv_heads": 2,
        "intermediate": 128,
        "seed": 0,
        "max_positions": 1024,
    }
    unknown = sorted(set(data) - set(defaults) - set(OPTIONAL_FIELDS))
    if unknown:
        raise ConfigError(
            f"toy spec has unknown fields {unknown}; allowed: "
            f"{sorted([*defaults, *OPTIONAL_FIELDS])}"
        )
    # An unset optional field is left out, so every spec written before it existed
    # keeps its hash and its cached model.
    data = {k: v for k, v in data.items() if not (k in OPTIONAL_FIELDS and v is None)}
    return {**defaults, **data}


def toy_spec_hash(spec: Any) -> str:
    """Short stable hash of a toy spec (seed included) and the toy format version."""
    payload = {"format": TOY_FORMAT_VERSION, "spec": _spec_dict(spec)}
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build_toy_model(spec: Any, tokenizer=None):
    """A freshly initialised ``Qwen3ForCausalLM`` for a toy spec; deterministic in ``seed``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    s = _spec_dict(spec)
    tok = tokenizer if tokenizer is not None else build_toy_tokenizer()
    if s["hidden"] % s["heads"] or s["heads"] % s["kv_heads"]:
        raise ConfigError(
            f"toy spec hidden={s['hidden']}, heads={s['heads']}, kv_heads={s['kv_heads']}: "
            "hidden must be divisible by heads and heads by kv_heads; pick e.g. 64/4/2"
        )
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=s["hidden"],
        intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["hidden"] // s["heads"],
        max_position_embeddings=s["max_positions"],
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids(IM_END),
        pad_token_id=tok.convert_tokens_to_ids(ENDOFTEXT),
        dtype="float32",
    )
    if s.get("init_std") is not None:
        config.initializer_range = float(s["init_std"])  # every weight matrix ~ N(0, std²)
    if s.get("rope_theta") is not None:
        theta = float(s["rope_theta"])
        if hasattr(config, "rope_parameters"):  # transformers >= 5
            config.rope_parameters = {"rope_type": "default", "rope_theta": theta}
        else:  # transformers 4.x reads config.rope_theta
            config.rope_theta = theta
    # A private RNG keeps building a model from disturbing the caller's global seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s["seed"])
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def cache_root() -> Path:
    """``$MINIVERL_CACHE`` if set, else the platform's per-user cache dir for miniverl."""
    env = os.environ.get("MINIVERL_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("miniverl"))


def toy_model_dir(spec: Any) -> Path:
    """The cached HF directory (model + tokenizer) for ``spec``; built on first use.

    Safe under concurrency: a file lock serialises builders, and the directory is
    written under a temporary name and renamed, so a reader never sees half of it.
    """
    root = cache_root() / "toy"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"qwen3-toy-{toy_spec_hash(spec)}"
    if (final / "config.json").is_file():
        return final
    with FileLock(str(root / f"{final.name}.lock")):
        if (final / "config.json").is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            from transformers.utils import logging as hf_logging

            tok = build_toy_tokenizer()
            model = build_toy_model(spec, tok)
            bars = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # a tiny toy save needs no progress bar
            try:
                model.save_pretrained(tmp)
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
            tok.save_pretrained(tmp)
            (tmp / "miniverl_toy.json").write_text(
                json.dumps({"format": TOY_FORMAT_VERSION, "spec": _spec_dict(spec)}, indent=2)
            )
            if final.exists():  # a broken leftover without config.json
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final
