"""Loading a teacher (local dir, toy recipe, adapter, offline hub refusals), the backend
adapter (errors per job, park/wake on CPU) and the JSON-lines log."""

from __future__ import annotations

import json

import numpy as np
import pytest

from miniverl.common.errors import ConfigError
from miniverl.protocol import messages as m
from miniverl.protocol.limits import Limits
from miniverl.teacher_server.jsonlog import JsonLog
from miniverl.teacher_server.loader import TeacherSpec, load_teacher, spec_from_recipe
from miniverl.teacher_server.scorers import make_loader
from miniverl.teacher_server.torch_backend import TorchTeacher
from tests.teacher_server.harness import hello, recv, score_header, send
from tests.toy_kit import ONE_LAYER, toy_dir, write_recipe

SPEC = ONE_LAYER


@pytest.fixture(scope="module")
def model_dir():
    return toy_dir(SPEC)


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_teacher(TeacherSpec(model=str(model_dir), device="cpu"))


def test_local_dir_is_frozen_eval_fp32_with_identity(loaded, model_dir):
    from miniverl.common.tokenizer_id import tokenizer_fingerprint

    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded.dtype == "float32" and loaded.device == "cpu"
    assert loaded.tokenizer_fp == tokenizer_fingerprint(model_dir)
    assert loaded.vocab_size == loaded.model.config.vocab_size
    assert loaded.info == {
        "name": model_dir.name,
        "model": str(model_dir),
        "revision": None,
        "adapter_sha256": None,
    }


def test_adapter_is_merged_and_its_digest_recorded(model_dir, loaded, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    base = load_teacher(TeacherSpec(model=str(model_dir), device="cpu")).model
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # a zero B would make the adapter a no-op
    peft_model.save_pretrained(tmp_path / "adapter")
    with_adapter = load_teacher(
        TeacherSpec(model=str(model_dir), adapter=str(tmp_path / "adapter"), device="cpu")
    )
    digest = with_adapter.info["adapter_sha256"]
    assert digest.startswith("sha256:") and len(digest) == 7 + 64
    assert not any(p.requires_grad for p in with_adapter.model.parameters())
    ids = torch.arange(12)[None]
    with torch.no_grad():
        assert not torch.allclose(with_adapter.model(ids).logits, loaded.model(ids).logits)


def test_bad_sources_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="neither a local directory nor a hub id"):
        load_teacher(TeacherSpec(model=str(tmp_path / "missing" / "dir")))
    with pytest.raises(ConfigError, match="40-hex"):
        load_teacher(TeacherSpec(model="org/model", revision="main"))
    with pytest.raises(ConfigError, match="config.json"):
        load_teacher(TeacherSpec(model=str(tmp_path)))


def test_offline_hub_model_names_the_missing_files(tmp_path, monkeypatch):
    # Users rely on: --offline never touches the network and says what to download.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as info:
        load_teacher(TeacherSpec(model="org/absent", revision="a" * 40, offline=True))
    message = str(info.value)
    assert (
        "config.json" in message and "tokenizer.json" in message and "model.safetensors" in message
    )


def test_recipe_teacher_section(tmp_path):
    recipe = {
        "run": {"name": "t", "mode": "opd"},
        "student": {"model": {"toy": {}}, "device": "cpu"},
        "teacher": {"model": {"toy": SPEC}, "device": "cpu", "dtype": "float32"},
    }
    path = write_recipe(tmp_path / "r.yaml", recipe)
    spec = spec_from_recipe(path)
    assert spec.device == "cpu" and spec.dtype == "float32" and spec.name == "toy-teacher"
    teacher = make_loader(lambda: spec_from_recipe(path))(None)
    assert teacher.info["name"] == "toy-teacher" and teacher.vocab_size > 256


def test_served_backend_refuses_bad_jobs_per_request_and_parks_on_cpu(loaded, harness):
    # The server checks each SCORE once, on receipt, before a job reaches the backend:
    # an exact SCORE above --exact-max-vocab is UNSUPPORTED, a position that predicts no
    # token of its sequence BAD_REQUEST, and the good SCORE beside them is answered.
    teacher = TorchTeacher(loaded, exact_max_vocab=100, max_batch_tokens=64)
    h, _ = harness(backend=teacher, limits=Limits(max_exact_vocab=100))
    sock = h.raw()
    assert isinstance(hello(sock, fp=loaded.tokenizer_fp, vocab=loaded.vocab_size), m.HelloOk)
    arrays = {"tokens": np.arange(10, dtype=np.int32), "cu_seqlens": np.array([0, 10], np.int32)}
    for rid, kind, positions in ((2, "topk", [0, 5]), (3, "exact", [1]), (4, "topk", [9])):
        send(sock, score_header(rid, kind=kind, k=4 if kind == "topk" else 0),
             {**arrays, "positions": np.array(positions, np.int32)})
    replies = {msg.id if msg.t == "SCORE_OK" else msg.ref_id: (msg, got)
               for msg, got in (recv(sock), recv(sock), recv(sock))}
    (good, got), (exact, _), (bad, _) = replies[2], replies[3], replies[4]
    assert good.t == "SCORE_OK" and got["ids"].shape == (2, 4)
    assert isinstance(exact, m.ErrorReply) and exact.code.value == "UNSUPPORTED"
    assert isinstance(bad, m.ErrorReply) and bad.code.value == "BAD_REQUEST"
    teacher.park()
    assert teacher.parked and teacher.memory() == {"device": "cpu"}
    teacher.wake()
    assert not teacher.parked


def test_json_lines_log(tmp_path):
    log = JsonLog(tmp_path / "logs" / "teacher.log", level="info")
    log("debug", "hidden")
    log("info", "ready", gen=0, event="clash")
    log("error", "load_failed", error="boom")
    log.close()
    lines = [
        json.loads(line) for line in (tmp_path / "logs" / "teacher.log").read_text().splitlines()
    ]
    assert [line["event"] for line in lines] == ["ready", "load_failed"]
    assert lines[0]["field_event"] == "clash" and lines[0]["level"] == "info" and "ts" in lines[0]
    with pytest.raises(ConfigError):
        JsonLog(level="loud")


def test_cli_serve_needs_exactly_one_source():
    from typer.testing import CliRunner

    from miniverl.cli.app import app

    result = CliRunner().invoke(app, ["teacher", "serve"])
    assert isinstance(result.exception, ConfigError) and "exactly one" in str(result.exception)
    result = CliRunner().invoke(
        app, ["teacher", "reload", "tcp://127.0.0.1:1", "--model", "m", "--mode", "later"]
    )
    assert isinstance(result.exception, ConfigError) and "drain or abort" in str(result.exception)


@pytest.mark.slow
def test_a_negative_prefix_cache_budget_is_refused_with_the_fix(tmp_path):
    import subprocess

    from miniverl.student.teacher_process import teacher_command

    proc = subprocess.run(
        teacher_command(["--model", str(tmp_path), "--prefix-cache-tokens", "-1"]),
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: --prefix-cache-tokens must be >= 0 (got -1); pass 0 to keep no prefix between "
        "requests"
    ]


def test_cli_reload_sends_the_adapter_revision(monkeypatch):
    from types import SimpleNamespace

    from typer.testing import CliRunner

    import miniverl.cli.teacher_cmds as teacher_cmds
    from miniverl.cli.app import app

    sent = {}

    class Admin:
        def reload(self, model, **kw):
            sent.update(model=model, **kw)
            return SimpleNamespace(gen=1, teacher=SimpleNamespace(name="t", model=model))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(teacher_cmds, "_admin", lambda *a, **kw: Admin())
    result = CliRunner().invoke(app, ["teacher", "reload", "tcp://127.0.0.1:1", "--model", "m",
                                      "--adapter", "org/lora", "--adapter-revision", "c" * 40])
    assert result.exit_code == 0, result.output
    assert sent["adapter"] == "org/lora" and sent["adapter_revision"] == "c" * 40


def test_park_copies_weights_through_pinned_host_memory(model_dir, monkeypatch):
    # Park copies through page-locked memory on an accelerator (full-speed, asynchronous
    # copies; wake copies back from it). Pinning needs CUDA: the copy is counted here.
    import torch

    from miniverl.teacher_server import torch_backend

    copies = []

    def host_copy(tensor):
        copies.append(tuple(tensor.shape))
        return tensor.detach().clone()

    monkeypatch.setattr(torch_backend, "pinned_host_copy", host_copy)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    loaded = load_teacher(TeacherSpec(model=str(model_dir), device="cpu"))
    backend = TorchTeacher(loaded, exact_max_vocab=4096, max_batch_tokens=256)
    monkeypatch.setattr(backend, "_on_accelerator", lambda: True)
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    backend.park()
    tensors = [*loaded.model.parameters(), *loaded.model.buffers()]
    assert len(copies) == len(tensors) > 0
    backend.wake()
    after = loaded.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
