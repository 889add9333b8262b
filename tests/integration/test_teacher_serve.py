"""A real ``python -m miniverl.teacher_server`` process over ipc and tcp loopback.

One teacher per transport is started (each start costs seconds of imports): the ipc
teacher answers the hand-written HELLO/SCORE, the equality checks against an
in-process reference forward, the CLI status, and finally the reloads; the tcp
teacher is killed with SIGKILL mid-request and replaced at the same endpoint, and the
replacement is shut down with a request still open.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

pytestmark = pytest.mark.integration

SPEC = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64}


@pytest.fixture(scope="module")
def toy_dirs(tmp_path_factory):
    """Teacher A, teacher B (same tokenizer, other weights), and an alien tokenizer."""
    from miniverl.common.recipe_models import ToySpec
    from miniverl.common.toy import toy_model_dir

    first = toy_model_dir(ToySpec(**SPEC, seed=0))
    second = toy_model_dir(ToySpec(**SPEC, seed=1))
    alien = tmp_path_factory.mktemp("alien") / "model"
    shutil.copytree(first, alien)
    template = alien / "chat_template.jinja"
    if template.exists():
        template.write_text(template.read_text() + "{# another template #}")
    else:
        config = json.loads((alien / "tokenizer_config.json").read_text())
        config["chat_template"] = config.get("chat_template", "") + "{# another template #}"
        (alien / "tokenizer_config.json").write_text(json.dumps(config))
    return {"first": first, "second": second, "alien": alien}


def start_teacher(model_dir: Path, endpoint: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable,
        "-m",
        "miniverl.teacher_server",
        "--model",
        str(model_dir),
        "--bind",
        endpoint,
        "--log",
        str(log),
        "--threads",
        "1",
        "--device",
        "cpu",
        "--heartbeat-ms",
        "200",
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def raw_call(endpoint: str, header: dict, frames=(), timeout_s: float = 5.0):
    """One request on a fresh DEALER, hand-framed with msgpack; (header, frames) or None."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([msgpack.packb(header), *frames])
        if not sock.poll(int(timeout_s * 1000)):
            return None
        reply = sock.recv_multipart()
        return msgpack.unpackb(reply[0]), reply[1:]
    finally:
        sock.close(0)


def wait_ready(endpoint: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"teacher exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
        reply = raw_call(endpoint, {"v": 1, "t": "PING", "id": 1}, timeout_s=1.0)
        if reply is not None and reply[0]["state"] == "READY":
            return reply[0]
        time.sleep(0.2)
    raise AssertionError(f"teacher at {endpoint} not READY within {timeout_s} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def teachers(tmp_path_factory, toy_dirs):
    """The ipc and the tcp teacher, started together so their imports overlap."""
    root = tmp_path_factory.mktemp("teachers")
    ipc = f"ipc://{root}/sock/teacher.sock"
    tcp = f"tcp://127.0.0.1:{free_port()}"
    procs = {
        "ipc": (ipc, start_teacher(toy_dirs["first"], ipc, root / "ipc.log"), root / "ipc.log"),
        "tcp": (tcp, start_teacher(toy_dirs["first"], tcp, root / "tcp.log"), root / "tcp.log"),
    }
    try:
        for endpoint, proc, _ in procs.values():
            wait_ready(endpoint, proc)
        yield procs
    finally:
        for _, proc, _ in procs.values():
            stop(proc)


@pytest.fixture(scope="module")
def ipc_teacher(teachers):
    return teachers["ipc"]


def fingerprint(model_dir: Path) -> tuple[str, int]:
    from miniverl.common.tokenizer_id import tokenizer_fingerprint

    config = json.loads((Path(model_dir) / "config.json").read_text())
    return tokenizer_fingerprint(model_dir), int(config["vocab_size"])


def reference(model_dir: Path, tokens, cu, positions, **kw):
    """The in-process forward the wire must reproduce (fp32 on CPU)."""
    import torch

    from miniverl.common.modeling import load_causal_lm
    from miniverl.teacher_server.scoring import score_positions

    torch.set_num_threads(1)
    model = load_causal_lm(model_dir, dtype="float32", device="cpu")
    return score_positions(model, tokens, cu, positions, **kw)


def sample_request(vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = [40, 25, 60]
    tokens = rng.integers(0, vocab, sum(lengths)).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    positions = np.concatenate(
        [np.arange(cu[b], cu[b + 1] - 1, 3) for b in range(len(lengths))]
    ).astype(np.int32)
    return tokens, cu, positions


def test_hand_written_hello_and_score(ipc_teacher, toy_dirs):
    # The "done when": DESIGN §3 is enough to talk to the teacher.
    endpoint, _, _ = ipc_teacher
    fp, vocab = fingerprint(toy_dirs["first"])
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(
            [
                msgpack.packb(
                    {
                        "v": 1,
                        "t": "HELLO",
                        "id": 1,
                        "client": "by-hand",
                        "tokenizer_fp": fp,
                        "vocab_size": vocab,
                    }
                )
            ]
        )
        assert sock.poll(10_000)
        ok = msgpack.unpackb(sock.recv_multipart()[0])
        assert ok["t"] == "HELLO_OK" and ok["tokenizer_fp"] == fp and ok["vocab_size"] == vocab
        tokens = np.array([5, 17, 99, 3, 42, 7], "<i4")
        cu = np.array([0, 6], "<i4")
        positions = np.array([0, 2, 4], "<i4")
        header = {
            "v": 1,
            "t": "SCORE",
            "id": 2,
            "student_version": 0,
            "kind": "topk",
            "k": 5,
            "temperature": 1.0,
            "arrays": [["tokens", "i4", [6]], ["cu_seqlens", "i4", [2]], ["positions", "i4", [3]]],
        }
        sock.send_multipart(
            [msgpack.packb(header), tokens.tobytes(), cu.tobytes(), positions.tobytes()]
        )
        assert sock.poll(10_000)
        reply = sock.recv_multipart()
    finally:
        sock.close(0)
    head = msgpack.unpackb(reply[0])
    assert head["t"] == "SCORE_OK" and head["id"] == 2 and head["instance"] == ok["instance"]
    arrays = {
        name: np.frombuffer(frame, "<" + dtype).reshape(shape)
        for (name, dtype, shape), frame in zip(head["arrays"], reply[1:], strict=True)
    }
    assert arrays["ids"].shape == (3, 5) and arrays["tail_logmass"].shape == (3,)
    # top-k + tail is the whole distribution
    lse = np.logaddexp.reduce(arrays["logprobs"].astype(np.float64), axis=1)
    assert np.allclose(np.logaddexp(lse, arrays["tail_logmass"]), 0.0, atol=1e-5)
    # wire bytes per position: k int32 ids + k float32 logprobs + tail + target
    assert sum(len(frame) for frame in reply[1:]) == 3 * (8 * 5 + 8)


def test_topk_and_exact_equal_the_in_process_reference(ipc_teacher, toy_dirs):
    from miniverl.protocol.sync_client import SyncTeacherClient

    endpoint, _, _ = ipc_teacher
    fp, vocab = fingerprint(toy_dirs["first"])
    tokens, cu, positions = sample_request(vocab)
    with SyncTeacherClient(endpoint, tokenizer_fp=fp, vocab_size=vocab) as client:
        topk = client.score(tokens, cu, positions, kind="topk", k=16, temperature=0.8)
        exact = client.score(tokens, cu, positions, kind="exact")
    ref_topk = reference(
        toy_dirs["first"], tokens, cu, positions, kind="topk", k=16, temperature=0.8
    )
    ref_exact = reference(toy_dirs["first"], tokens, cu, positions, kind="exact")
    assert np.array_equal(topk.arrays["ids"], ref_topk["ids"])
    for name in ("logprobs", "tail_logmass", "target_logprobs"):
        np.testing.assert_allclose(topk.arrays[name], ref_topk[name], atol=1e-5, rtol=0)
    for name in ("logprobs", "target_logprobs"):
        np.testing.assert_allclose(exact.arrays[name], ref_exact[name], atol=1e-5, rtol=0)
    lse = np.logaddexp.reduce(topk.arrays["logprobs"].astype(np.float64), axis=1)
    np.testing.assert_allclose(np.logaddexp(lse, topk.arrays["tail_logmass"]), 0.0, atol=1e-5)


def test_cli_status(ipc_teacher):
    from typer.testing import CliRunner

    from miniverl.cli.app import app

    endpoint, _, _ = ipc_teacher
    result = CliRunner().invoke(app, ["teacher", "status", endpoint, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["state"] == "READY" and info["counters"]["requests"] >= 1


def test_reload_bumps_gen_and_refuses_another_tokenizer(ipc_teacher, toy_dirs):
    # Runs last on the ipc teacher: it changes the served model.
    from miniverl.common.errors import TeacherError
    from miniverl.protocol.sync_client import SyncTeacherClient

    endpoint, proc, log = ipc_teacher
    fp, vocab = fingerprint(toy_dirs["first"])
    tokens, cu, positions = sample_request(vocab, seed=1)
    with SyncTeacherClient(endpoint, tokenizer_fp=fp, vocab_size=vocab) as client:
        before = client.score(tokens, cu, positions, k=8)
        ok = client.reload(str(toy_dirs["second"]))
        assert ok.gen == before.gen + 1
        after = client.score(tokens, cu, positions, k=8)
        assert after.gen == ok.gen and after.instance == before.instance
        assert not np.allclose(after.arrays["logprobs"], before.arrays["logprobs"])
        with pytest.raises(TeacherError, match="TOKENIZER_MISMATCH"):
            client.reload(str(toy_dirs["alien"]))
        still = client.score(tokens, cu, positions, k=8)
        assert still.gen == ok.gen
        np.testing.assert_allclose(still.arrays["logprobs"], after.arrays["logprobs"], atol=1e-6)
    ref = reference(toy_dirs["second"], tokens, cu, positions, kind="topk", k=8)
    np.testing.assert_allclose(still.arrays["logprobs"], ref["logprobs"], atol=1e-5, rtol=0)
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert "reloaded" in events and "reload_failed" in events


def test_kill9_mid_request_then_a_new_teacher_at_the_same_endpoint(tmp_path, toy_dirs, teachers):
    # Users rely on: a crashed teacher costs a re-handshake, not the training run.
    from miniverl.protocol.sync_client import SyncTeacherClient

    endpoint, first, _ = teachers["tcp"]
    fp, vocab = fingerprint(toy_dirs["first"])
    second = None
    try:
        old = wait_ready(endpoint, first)
        client = SyncTeacherClient(
            endpoint,
            tokenizer_fp=fp,
            vocab_size=vocab,
            heartbeat_ms=200,
            request_timeout_s=5,
            unavailable_timeout_s=120,
        )
        with client:
            tokens = np.random.default_rng(2).integers(0, vocab, 4000).astype(np.int32)
            cu = np.array([0, 2000, 4000], np.int32)
            positions = np.arange(0, 3999, 2, dtype=np.int32)
            positions = positions[positions != 1999]
            rid = client.submit(tokens, cu, positions, k=16)
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            second = start_teacher(toy_dirs["first"], endpoint, tmp_path / "second.log")
            new = wait_ready(endpoint, second)
            assert new["instance"] != old["instance"]
            result = client.wait([rid], timeout_s=120)[rid]
            assert result.instance == new["instance"]
            assert client.counters["reconnects"] + client.counters["retries"] >= 1
        ref = reference(toy_dirs["first"], tokens, cu, positions, kind="topk", k=16)
        np.testing.assert_allclose(result.arrays["logprobs"], ref["logprobs"], atol=1e-5, rtol=0)

        # SHUTDOWN drain: the open request is answered before SHUTDOWN_OK.
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        try:
            sock.send_multipart(
                [
                    msgpack.packb(
                        {
                            "v": 1,
                            "t": "HELLO",
                            "id": 1,
                            "client": "drain",
                            "tokenizer_fp": fp,
                            "vocab_size": vocab,
                        }
                    )
                ]
            )
            assert (
                sock.poll(10_000) and msgpack.unpackb(sock.recv_multipart()[0])["t"] == "HELLO_OK"
            )
            header = {
                "v": 1,
                "t": "SCORE",
                "id": 2,
                "student_version": 0,
                "kind": "topk",
                "k": 16,
                "temperature": 1.0,
                "arrays": [
                    ["tokens", "i4", [4000]],
                    ["cu_seqlens", "i4", [3]],
                    ["positions", "i4", [len(positions)]],
                ],
            }
            sock.send_multipart(
                [
                    msgpack.packb(header),
                    tokens.astype("<i4").tobytes(),
                    cu.astype("<i4").tobytes(),
                    positions.astype("<i4").tobytes(),
                ]
            )
            sock.send_multipart(
                [msgpack.packb({"v": 1, "t": "SHUTDOWN", "id": 3, "mode": "drain"})]
            )
            kinds = []
            for _ in range(2):
                assert sock.poll(60_000)
                kinds.append(msgpack.unpackb(sock.recv_multipart()[0])["t"])
        finally:
            sock.close(0)
        assert kinds == ["SCORE_OK", "SHUTDOWN_OK"]
        assert second.wait(30) == 0
    finally:
        stop(first)
        if second is not None:
            stop(second)


def test_sigterm_drains_and_exits_zero(ipc_teacher):
    # Runs last: `up` stops its teacher with SIGTERM and expects a clean exit.
    endpoint, proc, log = ipc_teacher
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    events = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert events[-2:] == ["shutdown_started", "stopped"]
