"""Teachers worth trusting, over the real wire: adapters + the gate, custom scorers, and a
standalone teacher that imports nothing from miniverl.

Users rely on: a PEFT teacher adapter's sha256 travels from the loader through
``HELLO_OK`` into the run's manifest and targets-cache keys, ``qualify-teacher`` records
exactly that identity and ``teacher.min_success`` reads it back; a scorer installed by
entry point serves a student end to end; and any program that speaks ``mvl-score/1``
(here ``examples/standalone_teacher/teacher.py``) can supervise strict OPD through the
real ``SyncTeacherClient`` over ipc and tcp, and that example's README works as written.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.toy_kit import TEACHER, recipe_dict, toy_dir, write_recipe

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STANDALONE = ROOT / "examples" / "standalone_teacher" / "teacher.py"
README = STANDALONE.parent / "README.md"


def recipe_data(output_dir: Path, **teacher) -> dict:
    """Strict OPD, two rollouts a cycle, a resident teacher with ``teacher`` settings."""
    return recipe_dict("opd", output_dir, rollouts_per_cycle=2, sections={
        "run": {"name": "teachers", "deterministic": False},
        "teacher": {"memory": "resident", **teacher},
        "runtime": {"heartbeat_ms": 200, "request_timeout_s": 20, "unavailable_timeout_s": 60,
                    "teacher_startup_timeout_s": 120},
    })


class InProcessTeacher:
    """The real TeacherServer on its own event loop thread, bound to ``endpoint``."""

    def __init__(self, endpoint: str, loader):
        from miniverl.teacher_server.server import TeacherServer
        from miniverl.teacher_server.server_state import ServerConfig

        self.server = TeacherServer(ServerConfig(endpoint=endpoint, heartbeat_ms=200), loader)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()),
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while self.server.endpoint is None:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not bind"
            time.sleep(0.01)
        self.endpoint = self.server.endpoint

    def close(self) -> None:
        self.server.shutdown_threadsafe("abort")
        self.thread.join(15)


def train(recipe, endpoint: str):
    from miniverl.student.train.trainer import Trainer

    with Trainer(recipe, teacher_endpoint=endpoint, show_progress=False,
                 write_report=False) as trainer:
        return trainer.train()


def read_json(path: Path):
    return json.loads(path.read_text())


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# -- adapters + the competence gate ------------------------------------------------------


def make_adapter(model_dir: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model

    from miniverl.common.modeling import load_causal_lm

    torch.manual_seed(0)
    base = load_causal_lm(model_dir, dtype="float32", device="cpu")
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8,
                                                 target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.2)  # a zero B would make the adapter a no-op
    peft_model.save_pretrained(out)
    return out


def test_adapter_identity_and_gate_end_to_end(tmp_path):
    from typer.testing import CliRunner

    from miniverl.cli.app import app
    from miniverl.common.errors import MiniverlError
    from miniverl.common.recipe import Recipe
    from miniverl.student.qualify import TeacherNotQualified
    from miniverl.student.targets_cache import TargetsCache
    from miniverl.teacher_server.loader import adapter_sha256, spec_from_recipe
    from miniverl.teacher_server.scorers import make_loader

    adapter = make_adapter(toy_dir(TEACHER), tmp_path / "adapter")
    digest = adapter_sha256(adapter)
    strict = write_recipe(tmp_path / "strict.yaml", recipe_data(
        tmp_path / "runs", adapter=str(adapter), min_success=1.0))
    lenient_data = recipe_data(tmp_path / "runs", adapter=str(adapter), min_success=0.0)

    teacher = InProcessTeacher(f"ipc://{tmp_path}/t.sock",
                               make_loader(lambda: spec_from_recipe(strict)))
    try:
        # Never qualified: refused at connect, before any update.
        with pytest.raises(TeacherNotQualified, match="no qualification record"):
            train(Recipe.model_validate(read_json_yaml(strict)), teacher.endpoint)

        out = tmp_path / "qualification.json"
        result = CliRunner().invoke(app, ["qualify-teacher", str(strict), "--out", str(out)])
        # Measured below min_success 1.0: the command says so and exits 1.
        assert result.exit_code == 1, result.output
        assert "NOT qualified" in result.output
        record = read_json(out)
        assert record["teacher"]["adapter_sha256"] == digest
        assert record["split"] == "eval" and record["n"] == 2
        assert record["model_dir_sha256"].startswith("sha256:")

        # Under-qualified: the one-line error carries the measured value.
        with pytest.raises(TeacherNotQualified) as refused:
            train(Recipe.model_validate(read_json_yaml(strict)), teacher.endpoint)
        assert f"measured success {record['success']:.3f}" in str(refused.value)
        assert digest[:19] in str(refused.value)
        assert isinstance(refused.value, MiniverlError) and "\n" not in str(refused.value)

        # Qualified (min_success 0): trains, and the adapter digest is everywhere.
        done = train(Recipe.model_validate(lenient_data), teacher.endpoint)
    finally:
        teacher.close()
    assert done.status == "completed" and done.steps == 3
    manifest = read_json(done.run_dir / "manifest.json")
    assert manifest["teachers"][0]["adapter_sha256"] == digest
    (connected,) = [e for e in rows(done.run_dir / "events.jsonl")
                    if e["event"] == "teacher_connected"]
    assert connected["teacher"]["adapter_sha256"] == digest
    keys = TargetsCache(done.run_dir / "targets").keys()
    assert keys and all(k.teacher.endswith(f"+adapter:{digest}") for k in keys)


def read_json_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# -- a custom scorer by entry point ------------------------------------------------------


def test_student_trains_against_the_sharpen_scorer(tmp_path, monkeypatch):
    from miniverl.common.recipe import Recipe
    from miniverl.teacher_server.loader import spec_from_recipe
    from miniverl.teacher_server.scorers import make_loader

    site = tmp_path / "site" / "miniverl_sharpen_teacher-0.1.0.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: miniverl-sharpen-teacher\nVersion: 0.1.0\n")
    (site / "entry_points.txt").write_text(
        "[miniverl.scorers]\nsharpen = sharpen_teacher:make_scorer\n")
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "custom_teacher"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))

    data = recipe_data(tmp_path / "runs", scorer="sharpen", scorer_options={"tau": 0.5})
    path = write_recipe(tmp_path / "r.yaml", data)
    recipe = Recipe.model_validate(data)
    teacher = InProcessTeacher(
        f"ipc://{tmp_path}/s.sock",
        make_loader(lambda: spec_from_recipe(path), scorer=recipe.teacher.scorer,
                    scorer_options=recipe.teacher.scorer_options),
    )
    try:
        done = train(recipe, teacher.endpoint)
    finally:
        teacher.close()
    assert done.status == "completed" and done.steps == 3
    manifest = read_json(done.run_dir / "manifest.json")
    assert manifest["teachers"][0]["name"] == "toy-teacher+sharpen(tau=0.5)"
    train_rows = [r for r in rows(done.run_dir / "metrics.jsonl") if r.get("phase") == "train"]
    assert len(train_rows) == 3 and all(np.isfinite(r["loss"]) for r in train_rows)
    assert all(r["teacher"]["name"].endswith("+sharpen(tau=0.5)") for r in train_rows)


# -- a standalone teacher (no miniverl import) -----------------------------------------


def load_standalone():
    spec = importlib.util.spec_from_file_location("standalone_teacher", STANDALONE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_standalone_teacher_imports_only_numpy_zmq_msgpack():
    tree = ast.parse(STANDALONE.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    third_party = names - set(sys.stdlib_module_names)
    assert third_party <= {"msgpack", "numpy", "zmq"}, names


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def toy_vocab():
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.common.toy import build_toy_tokenizer

    tok = build_toy_tokenizer()
    return tok, fingerprint_tokenizer(tok), len(tok)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, toy_vocab):
    from miniverl.student.environments import make_tasks
    from miniverl.student.rollout.oracle import oracle_trajectories

    tok, fp, _ = toy_vocab
    trajs = oracle_trajectories("calculator", make_tasks("calculator", "train", 16, "easy", 0),
                                tok, fp)
    path = tmp_path_factory.mktemp("corpus") / "tokens.npy"
    np.save(path, np.concatenate([np.asarray(t.tokens, np.int32) for t in trajs]),
            allow_pickle=False)
    return path


def start_standalone(endpoint: str, fp: str, vocab: int, corpus: Path) -> subprocess.Popen:
    token_file = corpus.parent / f"standalone-{abs(hash(endpoint))}.admin-token"
    proc = subprocess.Popen(
        [sys.executable, str(STANDALONE), "--bind", endpoint, "--tokenizer-fp", fp,
         "--vocab-size", str(vocab), "--corpus", str(corpus), "--name", "bigram",
         "--admin-token-file", str(token_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    line = proc.stdout.readline()
    assert "serving on" in line, line + (proc.stdout.read() if proc.poll() is not None else "")
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_student_trains_against_the_standalone_teacher(tmp_path, toy_vocab, corpus, transport):
    from miniverl.common.recipe import Recipe

    _, fp, vocab = toy_vocab
    endpoint = (f"ipc://{tmp_path}/bigram.sock" if transport == "ipc"
                else f"tcp://127.0.0.1:{free_port()}")
    proc = start_standalone(endpoint, fp, vocab, corpus)
    try:
        done = train(Recipe.model_validate(recipe_data(tmp_path / "runs")), endpoint)
    finally:
        stop(proc)
    assert done.status == "completed" and done.steps == 3
    manifest = read_json(done.run_dir / "manifest.json")
    assert manifest["teachers"][0]["name"] == "bigram"
    train_rows = [r for r in rows(done.run_dir / "metrics.jsonl") if r.get("phase") == "train"]
    assert len(train_rows) == 3
    assert all(np.isfinite(r["loss"]) and r["positions"] > 0 for r in train_rows)
    assert all(r["stale_dropped"] == 0 for r in train_rows)


def test_the_standalone_readme_works_as_written(tmp_path):
    # A user who runs examples/standalone_teacher/README.md block by block gets what it
    # says: a corpus and the teacher's flags, a completed run against the teacher, the
    # gate's refusal with a 0% record from `qualify-teacher --teacher`, a clean stop.
    # Only the port differs (a free one, so parallel runs do not collide).
    from tests.docs.doc_blocks import parse_page
    from tests.docs.doc_runner import page_failures

    text = README.read_text()
    assert text.count("tcp://127.0.0.1:5555") >= 5
    page = tmp_path / "README.md"
    page.write_text(text.replace("tcp://127.0.0.1:5555", f"tcp://127.0.0.1:{free_port()}"))
    kinds = [b.marker.kind for b in parse_page(page).blocks if b.marker]
    assert kinds == ["run"] * 5, kinds  # nothing on the page is left unchecked
    failures = page_failures(page, tmp_path / "scratch")
    assert not failures, "\n\n".join(failures)


def test_standalone_teacher_wire_behaviour(tmp_path, toy_vocab, corpus):
    import msgpack
    import zmq

    from miniverl.common.errors import TokenizerMismatch
    from miniverl.protocol.sync_client import SyncTeacherClient

    _, fp, vocab = toy_vocab
    endpoint = f"ipc://{tmp_path}/wire.sock"
    proc = start_standalone(endpoint, fp, vocab, corpus)
    try:
        # Scores equal the bigram table it was built from, and the tail closes the mass.
        with SyncTeacherClient(endpoint, tokenizer_fp=fp, vocab_size=vocab,
                               request_timeout_s=10, unavailable_timeout_s=20) as client:
            tokens = np.load(corpus)[:60].astype(np.int32)
            positions = np.arange(0, 59, dtype=np.int32)
            got = client.score(tokens, np.array([0, 60], np.int32), positions, k=5)
        table = load_standalone().bigram_logprobs(vocab, np.load(corpus).astype(np.int64), 0.1)
        want = table[tokens[positions]]
        np.testing.assert_allclose(got.arrays["logprobs"][:, 0], want.max(axis=1), atol=1e-5)
        np.testing.assert_allclose(got.arrays["target_logprobs"],
                                   want[np.arange(59), tokens[1:]], atol=1e-5)
        mass = np.logaddexp(np.logaddexp.reduce(got.arrays["logprobs"], axis=1),
                            got.arrays["tail_logmass"])
        np.testing.assert_allclose(mass, 0.0, atol=1e-4)
        # A student with another tokenizer is refused at HELLO.
        with pytest.raises(TokenizerMismatch):
            SyncTeacherClient(endpoint, tokenizer_fp="sha256:" + "0" * 64, vocab_size=vocab,
                              request_timeout_s=5, unavailable_timeout_s=5).connect(10)
        # Unknown types and other protocol versions get ERROR, not silence or a crash.
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        for header, code in (({"v": 1, "t": "FROB", "id": 7}, "BAD_REQUEST"),
                             ({"v": 2, "t": "PING", "id": 8}, "VERSION_MISMATCH"),
                             ({"v": 1, "t": "SCORE", "id": 9, "student_version": 0,
                               "kind": "topk", "k": 4}, "NEED_HELLO")):
            sock.send(msgpack.packb(header))
            assert sock.poll(5000)
            reply = msgpack.unpackb(sock.recv_multipart()[0])
            assert reply["t"] == "ERROR" and reply["code"] == code and reply["ref_id"] == header["id"]
        sock.send(msgpack.packb({"v": 1, "t": "PING", "id": 10}))
        assert sock.poll(5000)
        assert msgpack.unpackb(sock.recv_multipart()[0])["t"] == "PONG"
        # Every message a server obeys is authorised: SHUTDOWN without the admin token
        # changes nothing; with the token from its 0600 file it stops the teacher.
        token_file = corpus.parent / f"standalone-{abs(hash(endpoint))}.admin-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        for auth in (None, "0" * 64):
            sock.send(msgpack.packb({"v": 1, "t": "SHUTDOWN", "id": 11,
                                     **({"auth": auth} if auth else {})}))
            assert sock.poll(5000)
            assert msgpack.unpackb(sock.recv_multipart()[0])["code"] == "UNAUTHORIZED"
        assert proc.poll() is None
        sock.send(msgpack.packb({"v": 1, "t": "SHUTDOWN", "id": 12,
                                 "auth": token_file.read_text().strip()}))
        assert sock.poll(5000)
        assert msgpack.unpackb(sock.recv_multipart()[0])["t"] == "SHUTDOWN_OK"
        assert proc.wait(10) == 0
        sock.close()
        ctx.term()
    finally:
        stop(proc)
