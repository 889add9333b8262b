"""The toy stack: an exact real tokenizer, a Qwen-style template, cached tiny Qwen3 models."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from miniverl.common import toy  # noqa: E402
from miniverl.common.errors import ConfigError  # noqa: E402
from miniverl.common.modeling import (  # noqa: E402
    load_causal_lm,
    load_tokenizer,
    resolve_dtype,
    resolve_model_dir,
)
from tests.toy_kit import CALCULATOR_TOOLS, FOUR_HEAD  # noqa: E402

torch.set_num_threads(1)
TINY = FOUR_HEAD
TOOLS = CALCULATOR_TOOLS


_TOK = toy.build_toy_tokenizer()


@pytest.fixture(scope="module")
def tok():
    return _TOK


# Users rely on exact decoding: sampled ids are shown and verified as text.
@settings(max_examples=200, deadline=None)
@given(st.text())
def test_decode_encode_roundtrip_any_string(s):
    assert _TOK.decode(_TOK.encode(s, add_special_tokens=False)) == s


def test_printable_ascii_is_one_token_per_char(tok):
    s = "".join(chr(c) for c in range(32, 127)) + "\n\t"
    assert len(tok.encode(s, add_special_tokens=False)) == len(s)


def test_special_tokens_are_single_ids(tok):
    for special in toy.SPECIAL_TOKENS:
        ids = tok.encode(special, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == special
    assert tok.eos_token == toy.IM_END and tok.pad_token == toy.ENDOFTEXT


def test_template_renders_tools_tool_messages_and_generation(tok):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}
            ],
        },
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\nTools:\n- calculator(expression)")
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" in text
    out = tok.apply_chat_template(
        msgs, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    trained = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tok.decode(trained).count("<|im_end|>") == 2
    assert "tool_response" not in tok.decode(trained)
    prompt = tok.apply_chat_template(msgs[:2], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_toy_model_is_deterministic_in_seed(tok):
    a = toy.build_toy_model(TINY, tok)
    b = toy.build_toy_model(TINY, tok)
    c = toy.build_toy_model({**TINY, "seed": 1}, tok)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.config.vocab_size == len(tok)


def test_unset_optional_fields_keep_the_spec_hash():
    from miniverl.common.recipe_models import ToySpec

    # The hash of the default spec before init_std/rope_theta existed: every cached
    # toy model (and every figure measured with one) stays valid.
    assert toy.toy_spec_hash(ToySpec()) == toy.toy_spec_hash({}) == "60440e71380af1c9"
    assert toy.toy_spec_hash(ToySpec(init_std=0.1)) != toy.toy_spec_hash(ToySpec())
    with pytest.raises(ConfigError, match="unknown fields"):
        toy.toy_spec_hash({"init": 0.1})


def test_init_std_and_rope_theta_reach_the_model_and_survive_a_reload(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVERL_CACHE", str(tmp_path))
    spec = {**TINY, "init_std": 0.1, "rope_theta": 500.0}
    model = toy.build_toy_model(spec)
    weight = model.model.layers[0].mlp.up_proj.weight.detach()
    assert 0.09 < float(weight.std()) < 0.11  # transformers' default would be 0.02
    loaded = load_causal_lm(resolve_model_dir({"toy": spec}), dtype="auto", device="cpu")
    inv = loaded.model.rotary_emb.inv_freq
    dim = 2 * inv.shape[0]
    assert torch.allclose(inv[1], torch.tensor(500.0 ** (-2 / dim)))
    assert torch.equal(loaded.model.layers[0].mlp.up_proj.weight, weight)


def test_toy_model_dir_is_cached_and_loads_like_a_real_model(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVERL_CACHE", str(tmp_path))
    d1 = resolve_model_dir({"toy": TINY})
    assert (d1 / "config.json").is_file() and (d1 / "tokenizer.json").is_file()
    mtime = (d1 / "config.json").stat().st_mtime_ns
    assert resolve_model_dir({"toy": TINY}) == d1
    assert (d1 / "config.json").stat().st_mtime_ns == mtime
    assert toy.toy_model_dir({**TINY, "seed": 3}) != d1
    tok = load_tokenizer(d1)
    assert tok.chat_template == toy.TOY_CHAT_TEMPLATE
    model = load_causal_lm(d1, dtype="auto", device="cpu")
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.dtype == torch.float32 and not model.training
    ref = toy.build_toy_model(TINY)
    assert torch.equal(model.model.embed_tokens.weight, ref.model.embed_tokens.weight)


def test_concurrent_builders_produce_one_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVERL_CACHE", str(tmp_path))
    spec = {**TINY, "seed": 7}
    found: list = []
    threads = [threading.Thread(target=lambda: found.append(toy.toy_model_dir(spec))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(found)) == 1
    leftovers = [p.name for p in (tmp_path / "toy").iterdir() if p.name.startswith(".")]
    assert leftovers == []
    assert json.loads((found[0] / "miniverl_toy.json").read_text())["spec"]["seed"] == 7


def test_model_source_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        resolve_model_dir({"path": str(tmp_path)})
    with pytest.raises(ConfigError, match="exactly one"):
        resolve_model_dir({"path": str(tmp_path), "toy": TINY})
    with pytest.raises(ConfigError, match="offline"):
        resolve_model_dir(
            {"hub_id": "nobody/not-a-model", "revision": "0" * 40}, offline=True
        )
    with pytest.raises(ConfigError, match="divisible"):
        toy.build_toy_model({**TINY, "heads": 3})


def test_auto_dtype_on_cpu_is_float32():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ConfigError):
        resolve_dtype("float8", "cpu")


def test_common_toy_and_modeling_import_without_torch():
    # shared_prefix runs both processes' decoder passes and imports torch inside them.
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "import miniverl.common.toy, miniverl.common.modeling, miniverl.common.shared_prefix\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
