"""Checkpoints: exact resume, pickle-free files, atomic writes, LoRA adapters."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from miniverl.common.errors import ConfigError, ProvenanceError
from miniverl.student import checkpoint as ckpt
from tests.toy_kit import FOUR_HEAD, bare_qwen3

torch.set_num_threads(1)


@pytest.fixture
def deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


def _seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _build():
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Dropout(0.2), torch.nn.GELU(), torch.nn.Linear(16, 2)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    return model, optimizer, scheduler


def _train(model, optimizer, scheduler, steps):
    # Draws from all three RNGs (torch data + dropout, numpy, python) so resume must
    # restore every one of them to stay bitwise equal.
    for _ in range(steps):
        x = torch.randn(8, 4)
        y = torch.randn(8, 2) * float(np.random.rand()) + random.random()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def test_resume_is_bitwise_equal_to_an_uninterrupted_run(tmp_path, deterministic):
    n, m = 4, 5
    _seed_all(0)
    ref_model, ref_opt, ref_sched = _build()
    _train(ref_model, ref_opt, ref_sched, n + m)

    _seed_all(0)
    model, opt, sched = _build()
    _train(model, opt, sched, n)
    path = ckpt.save(
        tmp_path / "checkpoints",
        model=model,
        optimizer=opt,
        scheduler=sched,
        step=n,
        version=n,
        data_cursor={"epoch": 1, "offset": 17},
        recipe_digest="sha256:r",
        extra={"note": "x"},
    )
    assert path.name == f"step_{n}"
    # No pickle anywhere: only JSON and safetensors files.
    assert {p.suffix for p in path.iterdir()} == {".json", ".safetensors"}

    _seed_all(123)  # a fresh process: different init, different RNG state
    model2, opt2, sched2 = _build()
    state = ckpt.load(path, model2, opt2, sched2)
    assert (state.step, state.version, state.data_cursor) == (n, n, {"epoch": 1, "offset": 17})
    assert state.recipe_digest == "sha256:r" and state.extra == {"note": "x"}
    _train(model2, opt2, sched2, m)

    for a, b in zip(ref_model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(ref_opt.state.values(), opt2.state.values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    assert ref_sched.get_last_lr() == sched2.get_last_lr()


def test_state_structure_round_trips_exactly():
    obj = {
        "state": {0: {"step": torch.tensor(3.0), "m": torch.randn(2, 2, dtype=torch.bfloat16)}},
        "groups": [{"betas": (0.9, 0.999), "params": [0], "lr": 1e-3, "x": None}],
        "floats": [math.inf, -math.inf, 0.1],
        "rng": ("MT19937", np.arange(5, dtype=np.uint32), 2),
        "__odd": 1,
    }
    tree, tensors = ckpt.flatten_state(obj)
    back = ckpt.unflatten_state(tree, tensors)
    assert back["groups"] == obj["groups"] and back["floats"] == obj["floats"]
    assert torch.equal(back["state"][0]["m"], obj["state"][0]["m"])
    assert back["rng"][0] == "MT19937" and back["rng"][1].dtype == np.uint32
    assert back["__odd"] == 1
    with pytest.raises(TypeError, match="without pickle"):
        ckpt.flatten_state({"f": lambda: 0})


def test_rng_states_round_trip():
    _seed_all(5)
    state = ckpt.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1))
    _seed_all(6)
    ckpt.set_rng_state(state)
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(1), expected[2])


def test_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, sched = _build()
    root = tmp_path / "checkpoints"
    first = ckpt.save(root, model=model, optimizer=opt, scheduler=sched, step=1, version=1)

    def boom(directory, stem, obj):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_write_state", boom)
    with pytest.raises(OSError):
        ckpt.save(root, model=model, optimizer=opt, scheduler=sched, step=2, version=2)
    assert [p.name for p in root.iterdir()] == ["step_1"]  # no half checkpoint, no temp dir
    assert ckpt.latest(root) == first
    assert ckpt.latest(tmp_path / "none") is None


def test_latest_orders_numerically_and_overwrite_is_atomic(tmp_path):
    model, opt, _ = _build()
    root = tmp_path / "checkpoints"
    for step in (2, 10, 9):
        ckpt.save(root, model=model, optimizer=opt, step=step, version=step)
    assert ckpt.latest(root).name == "step_10"
    ckpt.save(root, model=model, step=10, version=11)
    assert ckpt.read_state(root / "step_10").version == 11
    assert sorted(p.name for p in root.iterdir()) == ["step_10", "step_2", "step_9"]


def test_damaged_checkpoint_is_refused(tmp_path):
    model, opt, sched = _build()
    path = ckpt.save(tmp_path, model=model, optimizer=opt, scheduler=sched, step=1, version=1)
    target = path / "optimizer.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(ProvenanceError, match="optimizer.safetensors"):
        ckpt.load(path, *_build())
    wrong = torch.nn.Linear(3, 3)
    path2 = ckpt.save(tmp_path, model=model, step=2, version=2)
    with pytest.raises(ProvenanceError, match="do not fit"):
        ckpt.load(path2, wrong)


def test_resume_with_another_recipe_is_refused():
    from miniverl.common.recipe import Recipe, recipe_digest

    base = {"run": {"name": "t", "mode": "sft"}, "student": {"model": {"toy": {}}}}
    saved = Recipe.model_validate(base)
    changed = Recipe.model_validate({**base, "loss": {"temperature": 2.0}})
    state = ckpt.CheckpointState(path=ckpt.Path("c"), step=1, version=1)
    state.recipe_digest = recipe_digest(saved)
    ckpt.check_recipe_digest(state, recipe_digest(saved))
    with pytest.raises(ConfigError, match="differing fields: loss.temperature"):
        ckpt.check_recipe_digest(
            state, recipe_digest(changed), saved_recipe=saved, current_recipe=changed
        )
    with pytest.raises(ConfigError, match="written under recipe"):
        ckpt.check_recipe_digest(state, "sha256:other")


def _tiny_lora(seed):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)  # the same frozen base weights every time
    base = bare_qwen3(FOUR_HEAD, vocab=64, max_positions=64)
    torch.manual_seed(seed)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return get_peft_model(base, lora)


def test_lora_adapter_round_trip(tmp_path):
    from peft import get_peft_model_state_dict

    model = _tiny_lora(seed=1)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 64, (2, 10))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()  # lora_B leaves zero, so the round trip is not trivially all-zeros
    path = ckpt.save(tmp_path, model=model, optimizer=opt, step=1, version=1)
    assert (path / "adapter_model.safetensors").is_file()
    assert (path / "adapter_config.json").is_file()
    assert not (path / "model.safetensors").exists()

    fresh = _tiny_lora(seed=2)
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    state = ckpt.load(path, fresh, fresh_opt)
    assert state.weights == "adapter"
    saved, loaded = get_peft_model_state_dict(model), get_peft_model_state_dict(fresh)
    assert saved.keys() == loaded.keys() and len(saved) == 8
    assert any(v.abs().sum() > 0 for k, v in saved.items() if "lora_B" in k)
    for key in saved:
        assert torch.equal(saved[key], loaded[key]), key
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, fresh(input_ids=ids).logits)
    with pytest.raises(ProvenanceError, match="not a PEFT model"):
        ckpt.load(path, torch.nn.Linear(2, 2))
