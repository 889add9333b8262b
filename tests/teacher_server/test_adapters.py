"""Several PEFT adapters over one base in one teacher process (issue #42).

What a user relies on (docs/teacher-server.md, "Several adapters in one process";
docs/protocol.md, "Adapters"): a SCORE for adapter A gets what a teacher that merged A
alone sends, for B likewise, and A's targets are not B's; HELLO_OK lists every served
adapter with its digest and gives each client its own adapter's identity; SCOREs of A
and B arriving interleaved are never computed in one forward pass, and the prefix cache
never hands one adapter's block to another, so each reply is its adapter's; a
deterministic SCORE stays bitwise the same; the process holds the base weights once; an
xvocab SCORE naming an adapter is scored with that adapter.

A one-layer toy Qwen3 and two LoRA adapters on different modules, served in process by
the real server (``miniverl.testing.TeacherHarness``); no sockets, no child process.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("peft")

from miniverl.common.errors import ConfigError  # noqa: E402
from miniverl.teacher_server.loader import (  # noqa: E402
    TeacherSpec,
    adapter_sha256,
    load_teacher,
)
from miniverl.teacher_server.scoring import score_positions  # noqa: E402
from miniverl.teacher_server.torch_backend import TorchTeacher  # noqa: E402
from miniverl.testing import TeacherHarness  # noqa: E402
from miniverl.testing.backends import BatchGate  # noqa: E402
from tests.toy_kit import ONE_LAYER, recipe_dict, toy_dir, write_recipe  # noqa: E402

NAMES = ("calc", "chat")
# Every episode opens with the same block, long enough for the prefix cache to keep it.
SYSTEM_TOKENS = 40


def make_lora(base_dir: Path, dest: Path, *, seed: int, targets: list[str]) -> str:
    """A LoRA adapter of the toy base saved with save_pretrained; its B is not zero (a
    zero B would make it a no-op)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from miniverl.common.modeling import load_causal_lm

    torch.manual_seed(seed)
    model = get_peft_model(load_causal_lm(base_dir, dtype="float32", device="cpu"),
                           LoraConfig(r=2, lora_alpha=4, target_modules=targets))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    model.save_pretrained(dest)
    return str(dest)


@pytest.fixture(scope="module")
def base_dir() -> Path:
    return toy_dir(ONE_LAYER)


@pytest.fixture(scope="module")
def adapter_dirs(base_dir, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {"calc": make_lora(base_dir, root / "calc", seed=1, targets=["q_proj", "v_proj"]),
            "chat": make_lora(base_dir, root / "chat", seed=2,
                              targets=["k_proj", "o_proj", "up_proj"])}


@pytest.fixture(scope="module")
def merged(base_dir, adapter_dirs) -> dict:
    """The reference: per adapter, a teacher that merged it alone (``--adapter DIR``)."""
    return {name: load_teacher(TeacherSpec(model=str(base_dir), adapter=path, device="cpu",
                                           dtype="float32")).model
            for name, path in adapter_dirs.items()}


class Recording(BatchGate, TorchTeacher):
    """The torch backend, recording the adapters each batch asked for; ``hold()`` keeps
    the next batch waiting inside ``score_batch`` until ``release()`` (``BatchGate``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_adapters: list[list[str | None]] = []
        self.entered = threading.Event()

    def score_batch(self, jobs):
        self.batch_adapters.append([job.adapter for job in jobs])
        self.enter_batch()
        return super().score_batch(jobs)


@pytest.fixture(scope="module")
def loaded(base_dir, adapter_dirs):
    return load_teacher(TeacherSpec(model=str(base_dir), device="cpu", dtype="float32",
                                    adapters=adapter_dirs))


@pytest.fixture(scope="module")
def served(loaded):
    backend = Recording(loaded, exact_max_vocab=1 << 20, max_batch_tokens=4096)
    with TeacherHarness(backend=backend) as h:
        yield h, backend


def episode(seed: int, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One sequence: the shared block, then 12-20 tokens of its own; positions in both."""
    system = np.random.default_rng(99).integers(0, vocab, SYSTEM_TOKENS)
    rng = np.random.default_rng(seed)
    tokens = np.concatenate([system, rng.integers(0, vocab, rng.integers(12, 20))])
    positions = np.sort(rng.choice(len(tokens) - 1, 10, replace=False))
    return (tokens.astype(np.int32), np.array([0, len(tokens)], np.int32),
            positions.astype(np.int32))


def reference(merged, name: str, seed: int, vocab: int) -> np.ndarray:
    return score_positions(merged[name], *episode(seed, vocab), kind="exact")["logprobs"]


def test_each_adapter_scores_as_the_teacher_that_merged_it_alone(served, merged, loaded):
    h, backend = served
    vocab = loaded.vocab_size
    hits = backend.prefix_cache.hits
    got: dict[tuple[str, int], np.ndarray] = {}
    clients = {name: h.client(adapter=name) for name in NAMES}
    for client in clients.values():
        client.connect()
    # Interleaved, all opening with one block: the prefix cache keeps that block per
    # adapter, and a block calc computed must not serve chat (other weights, other states).
    for seed in range(3):
        for name in NAMES:
            got[name, seed] = clients[name].score(*episode(seed, vocab), kind="exact") \
                .arrays["logprobs"]
    for (name, seed), logprobs in got.items():
        np.testing.assert_allclose(logprobs, reference(merged, name, seed, vocab),
                                   atol=1e-5, rtol=0, err_msg=f"{name} seed {seed}")
        assert not np.allclose(got["calc", seed], got["chat", seed], atol=1e-3)
    assert backend.prefix_cache.hits >= hits + 2  # the third episode of each reused its block
    assert {entry.key for entry in backend.prefix_cache.entries} == set(NAMES)
    for client in clients.values():
        client.close()


def test_hello_ok_lists_the_adapters_and_gives_each_client_its_adapters_identity(
        served, adapter_dirs, base_dir, loaded):
    h, _ = served
    digests = {name: adapter_sha256(Path(path)) for name, path in adapter_dirs.items()}
    for name in NAMES:
        with h.client(adapter=name) as client:
            hello = client.hello
            assert [(a.name, a.adapter_sha256) for a in hello.adapters] == list(digests.items())
            assert hello.teacher.adapter_sha256 == digests[name]
            assert hello.teacher.name == f"{base_dir.name}/{name}"
            assert hello.teacher.model == str(base_dir) and hello.teacher.revision is None
            status = client.status()
            assert status["adapters"] == [{"name": n, "adapter_sha256": d}
                                          for n, d in digests.items()]
            assert status["teacher"]["adapter_sha256"] is None  # the process: the base
    # A HELLO naming none (a client looking around) gets the base's identity and the list.
    plain = h.raw().hello(loaded.tokenizer_fp, loaded.vocab_size)
    assert plain.t == "HELLO_OK" and plain.teacher.adapter_sha256 is None
    assert plain.teacher.name == base_dir.name
    assert [a.name for a in plain.adapters] == list(NAMES)


def test_interleaved_adapters_are_never_coalesced_and_each_reply_is_its_adapters(
        served, merged, loaded):
    h, backend = served
    vocab = loaded.vocab_size
    conns = {name: h.raw() for name in NAMES}
    for name, conn in conns.items():
        assert conn.hello(loaded.tokenizer_fp, vocab, adapter=name).t == "HELLO_OK"
    backend.hold()
    first = len(backend.batch_adapters)
    order = [("calc", 0), ("chat", 1), ("calc", 2), ("chat", 3), ("calc", 4), ("chat", 5),
             ("chat", 6), ("calc", 7)]
    for rid, (name, seed) in enumerate(order, start=10):
        tokens, cu, positions = episode(seed, vocab)
        conns[name].send({"v": 1, "t": "SCORE", "id": rid, "student_version": 0,
                          "kind": "exact", "adapter": name},
                         {"tokens": tokens, "cu_seqlens": cu, "positions": positions})
        if rid == 10:
            assert backend.entered.wait(10)  # the first batch is inside: the rest queue
    # Release only once all seven are queued: read off the sockets later (a loaded machine),
    # one would run alone and the batches would say when the server read, not how it batched.
    deadline = time.monotonic() + 10
    while len(h.server.srv.queue) < len(order) - 1:
        assert time.monotonic() < deadline, f"{len(h.server.srv.queue)} of 7 queued after 10 s"
        time.sleep(0.005)
    backend.release()
    replies = {}
    for name, conn in conns.items():
        for _ in range(sum(1 for n, _ in order if n == name)):
            msg, arrays = conn.recv(timeout_s=30)
            assert msg.t == "SCORE_OK", msg
            replies[msg.id] = arrays["logprobs"]
    for rid, (name, seed) in enumerate(order, start=10):
        np.testing.assert_allclose(replies[rid], reference(merged, name, seed, vocab),
                                   atol=1e-5, rtol=0, err_msg=f"id {rid} ({name})")
    batches = backend.batch_adapters[first:]
    assert all(len(set(batch)) == 1 for batch in batches), batches
    # Queued behind the first, each adapter's jobs still share a pass with each other.
    assert sorted(len(batch) for batch in batches) == [1, 3, 4], batches


def test_a_deterministic_score_is_bitwise_the_same_whatever_came_between(served, loaded):
    h, _ = served
    vocab = loaded.vocab_size
    with h.client(adapter="calc") as calc, h.client(adapter="chat") as chat:
        first = calc.score(*episode(0, vocab), kind="exact", deterministic=True)
        for seed in range(3):
            chat.score(*episode(seed, vocab), kind="exact")
            calc.score(*episode(seed + 5, vocab), kind="exact")
        again = calc.score(*episode(0, vocab), kind="exact", deterministic=True)
    for name in first.arrays:
        assert np.array_equal(first.arrays[name], again.arrays[name])


def test_the_process_holds_the_base_weights_once(loaded, base_dir):
    # Users rely on: N adapters cost N adapters' memory, not N models (no deepcopy).
    base = load_teacher(TeacherSpec(model=str(base_dir), device="cpu", dtype="float32")).model
    params = dict(loaded.model.named_parameters())
    lora = {name: p for name, p in params.items() if "lora_" in name}
    weights = {name: p for name, p in params.items() if "lora_" not in name}
    assert sum(p.numel() for p in weights.values()) == sum(p.numel() for p in base.parameters())
    assert len({p.data_ptr() for p in weights.values()}) == len(weights)
    assert {name.split("lora_")[1].split(".")[1] for name in lora} == set(NAMES)
    assert not any(p.requires_grad for p in params.values())


def test_a_recipes_teacher_adapters_are_what_teacher_serve_recipe_loads(tmp_path, adapter_dirs):
    from miniverl.teacher_server.loader import spec_from_recipe

    data = recipe_dict("opd", tmp_path)
    del data["environment"]
    data["teacher"]["adapters"] = adapter_dirs
    data["environments"] = [
        {"name": "calculator", "train_tasks": 8, "eval_tasks": 2, "adapter": "calc"},
        {"name": "jsonnav", "train_tasks": 8, "eval_tasks": 2, "adapter": "chat"}]
    spec = spec_from_recipe(write_recipe(tmp_path / "r.yaml", data))
    assert spec.adapters == adapter_dirs and spec.adapter is None


def test_a_reload_serves_the_same_adapters_over_the_new_model(base_dir, adapter_dirs):
    # RELOAD names a model (and revision), not adapters: a teacher serving --adapters
    # keeps serving them, so its clients' adapters stay there after the new gen.
    from miniverl.teacher_server.scorers import make_loader

    load = make_loader(TeacherSpec(model=str(base_dir), device="cpu", dtype="float32",
                                   adapters=adapter_dirs))
    first = load(None)
    again = load({"model": str(base_dir), "revision": None, "adapter": None,
                  "adapter_revision": None})
    assert again.adapters == first.adapters and list(again.adapters) == list(NAMES)
    with pytest.raises(ConfigError, match="do not go together"):
        load({"model": str(base_dir), "adapter": adapter_dirs["calc"]})


def test_a_lora_runs_checkpoint_is_an_adapter_a_teacher_serves_by_name(tmp_path, base_dir):
    # How a user makes a specialist adapter today (docs/several-teachers.md): train the
    # base with student.lora in sft; the run's checkpoint folder holds the adapter only
    # (adapter_model.safetensors + adapter_config.json), and teacher.adapters serves it.
    import torch

    from miniverl.common.recipe import Recipe
    from miniverl.student.train.trainer import Trainer
    from tests.toy_kit import recipe_dict

    data = recipe_dict("sft", tmp_path / "runs", student=ONE_LAYER, teacher=None, cycles=3,
                       save_every=3)
    data["student"]["lora"] = {"r": 4, "alpha": 8, "dropout": 0.0,
                               "target_modules": ["q_proj", "v_proj"]}
    with Trainer(Recipe.model_validate(data), show_progress=False,
                 write_report=False) as trainer:
        result = trainer.train()
        trained = trainer.state.policy.model
        tokens = torch.arange(1, 13).unsqueeze(0)
        with torch.no_grad():
            want = trained(input_ids=tokens).logits
    checkpoint = result.run_dir / "checkpoints" / "step_3"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    served = load_teacher(TeacherSpec(model=str(base_dir), device="cpu", dtype="float32",
                                      adapters={"calc": str(checkpoint)}))
    served.model.set_adapter("calc")
    with torch.no_grad():
        got = served.model(input_ids=tokens).logits
        base = load_teacher(TeacherSpec(model=str(base_dir), device="cpu",
                                        dtype="float32")).model(input_ids=tokens).logits
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, base, atol=1e-3)
    assert served.adapters["calc"].startswith("sha256:")


def test_an_xvocab_score_of_an_adapter_is_that_adapters(served, merged, base_dir):
    # A route with tokenizer: other over one of a teacher's adapters
    # (docs/several-teachers.md, "Teachers with another tokenizer"): its xvocab SCORE
    # names the adapter, and the teacher's own tokens are scored by the base with that
    # adapter, as the teacher that merged it alone scores them.
    from miniverl.common.modeling import load_tokenizer
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.student.environments import make_tasks
    from miniverl.student.rollout.oracle import oracle_trajectories
    from miniverl.student.train.teacher.xvocab import XvocabRequests

    h, _ = served
    tok = load_tokenizer(base_dir)
    tasks = make_tasks("calculator", "train", 1, "easy", 0, {})
    traj = oracle_trajectories("calculator", tasks, tok, fingerprint_tokenizer(tok), {})[0]
    req = XvocabRequests(tok)(traj)
    assert req is not None
    got = {}
    for name in NAMES:
        with h.client(adapter=name, xvocab=True) as client:
            assert client.hello.kinds.xvocab is not None
            rid = client.submit_xvocab(req["episode"], req["student_cuts"],
                                       req["student_pieces"], k=4)
            arrays = client.wait([rid], 30)[rid].arrays
        ids = np.asarray(arrays["teacher_ids"], np.int32)
        positions = np.asarray(arrays["positions"], np.int32)
        alone = score_positions(merged[name], ids, np.array([0, len(ids)], np.int32),
                                positions, kind="topk", k=4)
        np.testing.assert_allclose(arrays["target_logprobs"], alone["target_logprobs"],
                                   atol=1e-5, rtol=0, err_msg=name)
        got[name] = np.asarray(arrays["target_logprobs"])
    assert not np.allclose(got["calc"], got["chat"], atol=1e-3)
