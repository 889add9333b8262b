"""A hub teacher adapter at a pinned revision: resolved offline from the local Hugging
Face cache, merged, and identified by the same sha256 as the files themselves.

Users rely on: ``teacher.adapter: ORG/NAME`` + ``adapter_revision`` gives the same
teacher identity (``adapter_sha256``) wherever the files come from, an unpinned hub
adapter is refused, and offline mode names the missing files instead of downloading.
"""

from __future__ import annotations

import pytest

pytest.importorskip("peft")

from miniverl.common.errors import ConfigError  # noqa: E402
from miniverl.teacher_server.loader import (  # noqa: E402
    TeacherSpec,
    adapter_sha256,
    load_teacher,
)
from tests.toy_kit import ONE_LAYER, seeded  # noqa: E402

SPEC = seeded(ONE_LAYER, 5)
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def toy_dir():
    from miniverl.common.toy import toy_model_dir

    return toy_model_dir(SPEC)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, toy_dir):
    """A local HF cache holding ``org/teacher-lora`` at ``REVISION`` (no network)."""
    import huggingface_hub.constants as hf_constants
    import torch
    from peft import LoraConfig, get_peft_model

    from miniverl.common.modeling import load_causal_lm

    torch.manual_seed(0)
    model = get_peft_model(load_causal_lm(toy_dir, dtype="float32", device="cpu"),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    local = tmp_path / "local-adapter"
    model.save_pretrained(local)
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--teacher-lora" / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for f in local.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (cache / "models--org--teacher-lora" / "refs").mkdir()
    (cache / "models--org--teacher-lora" / "refs" / "main").write_text(REVISION)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return local


def test_hub_adapter_at_pinned_revision_has_the_local_digest(hub_cache, toy_dir):
    loaded = load_teacher(TeacherSpec(model=str(toy_dir), adapter="org/teacher-lora",
                                      adapter_revision=REVISION, device="cpu", offline=True))
    assert loaded.info["adapter_sha256"] == adapter_sha256(hub_cache)
    assert loaded.info["adapter_sha256"].startswith("sha256:")


def test_unpinned_or_missing_hub_adapters_are_refused(hub_cache, toy_dir):
    with pytest.raises(ConfigError, match="needs a pinned 40-hex"):
        load_teacher(TeacherSpec(model=str(toy_dir), adapter="org/teacher-lora",
                                 adapter_revision="main", device="cpu", offline=True))
    with pytest.raises(ConfigError, match="missing from the local cache: adapter_model"):
        load_teacher(TeacherSpec(model=str(toy_dir), adapter="org/other-lora",
                                 adapter_revision=REVISION, device="cpu", offline=True))


def test_reload_onto_a_pinned_hub_adapter(hub_cache, toy_dir):
    # RELOAD's request carries adapter_revision to the same loader the start used.
    from miniverl.teacher_server.scorers import make_loader

    load = make_loader(TeacherSpec(model=str(toy_dir), device="cpu", offline=True))
    request = {"model": str(toy_dir), "revision": None, "adapter": "org/teacher-lora",
               "adapter_revision": REVISION}
    backend = load(request)
    assert backend.info["adapter_sha256"] == adapter_sha256(hub_cache)
    with pytest.raises(ConfigError, match="needs a pinned 40-hex"):
        load({**request, "adapter_revision": None})
