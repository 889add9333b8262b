"""Redaction: planted secrets and local paths never reach shareable output."""

from __future__ import annotations

import json
from pathlib import Path

from miniverl.common.redact import SECRET, is_secret_key, redact, redact_text

HF_TOKEN = "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ012345"


def test_planted_secrets_and_paths_are_removed():
    manifest = {
        "models": {"student": {"id": "/root/models/qwen3-0.6b", "revision": "abc"}},
        "env": {"HF_TOKEN": HF_TOKEN, "note": f"pulled with token {HF_TOKEN}"},
        "log": "loaded /home/alice/checkpoints/v3/adapter.safetensors",
        "cmd": ["--password=hunter2", "--model", "/data/shared/weights/teacher"],
        "endpoint": "tcp://127.0.0.1:5555",
        "socket": "ipc:///tmp/run-1/teacher.sock",
        "hub": "https://huggingface.co/Qwen/Qwen3-0.6B",
        "creds": "https://bob:s3cret@example.com/repo.git",
        "step": 3,
    }
    out = redact(manifest)
    text = json.dumps(out)
    for leaked in (HF_TOKEN, "/root", "alice", "hunter2", "/data/shared", "s3cret", "/tmp/run-1"):
        assert leaked not in text, leaked
    assert out["env"]["HF_TOKEN"] == SECRET
    assert out["models"]["student"]["id"].endswith("qwen3-0.6b")  # basename kept for humans
    assert out["endpoint"] == "tcp://127.0.0.1:5555"
    assert out["hub"] == "https://huggingface.co/Qwen/Qwen3-0.6B"
    assert out["step"] == 3
    assert manifest["env"]["HF_TOKEN"] == HF_TOKEN  # input untouched


def test_own_home_directory_is_removed():
    home = str(Path.home())
    assert home not in redact_text(f"cache at {home}/.cache/miniverl/toy")


def test_ordinary_words_survive():
    for text in ("Qwen/Qwen3-0.6B", "120 km/h", "max_tokens: 5", "a/b", "sha256:abcdef"):
        assert redact_text(text) == text
    assert not is_secret_key("max_tokens") and not is_secret_key("tokenizer_fp")
    assert is_secret_key("hf_token") and is_secret_key("api_key") and is_secret_key("password")


def test_paths_can_be_kept():
    assert redact_text("/opt/models/x", paths=False) == "/opt/models/x"
    assert HF_TOKEN not in redact_text(HF_TOKEN, paths=False)
