"""A real ``python -m miniverl.teacher_server`` process over ipc and tcp loopback.

One teacher per transport is started (each start costs seconds of imports): the ipc
teacher answers the hand-written HELLO/SCORE, the equality checks against an
in-process reference forward, the CLI status, and finally the reloads; the tcp
teacher is killed with SIGKILL mid-request and replaced at the same endpoint, and the
replacement is shut down with a request still open.
"""

from __future__ import annotations

import json
import signal
import socket
from contextlib import ExitStack
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from tests.toy_kit import ONE_LAYER, alien_tokenizer_copy, spawn_teacher, toy_dir

pytestmark = pytest.mark.integration

HEARTBEAT = ["--heartbeat-ms", "200"]
# The kill -9 test packs four sequences of 1,000 tokens (each within the toy's 1,024-token
# context) into one long request: the packed total is above max_tokens' default (the context).
PACKED = ["--max-tokens", "4000"]


@pytest.fixture(scope="module")
def toy_dirs(tmp_path_factory):
    """Teacher A, teacher B (same tokenizer, other weights), and an alien tokenizer."""
    first = toy_dir(ONE_LAYER, seed=0)
    return {"first": first, "second": toy_dir(ONE_LAYER, seed=1),
            "alien": alien_tokenizer_copy(first, tmp_path_factory.mktemp("alien") / "model")}


def dealer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def hand_written_hello(sock: zmq.Socket, fp: str, vocab: int, client: str) -> dict:
    """A HELLO framed by hand with msgpack, as docs/protocol.md describes it; the reply header."""
    sock.send_multipart([msgpack.packb({"v": 1, "t": "HELLO", "id": 1, "client": client,
                                        "tokenizer_fp": fp, "vocab_size": vocab})])
    assert sock.poll(10_000)
    return msgpack.unpackb(sock.recv_multipart()[0])


def hand_written_score(sock: zmq.Socket, tokens, cu, positions, k: int) -> None:
    """A SCORE framed by hand: the header lists each array's name, dtype and shape, and
    one raw little-endian frame per array follows it."""
    arrays = {"tokens": tokens, "cu_seqlens": cu, "positions": positions}
    header = {"v": 1, "t": "SCORE", "id": 2, "student_version": 0, "kind": "topk", "k": k,
              "temperature": 1.0,
              "arrays": [[name, "i4", [len(a)]] for name, a in arrays.items()]}
    sock.send_multipart([msgpack.packb(header),
                         *(np.asarray(a).astype("<i4").tobytes() for a in arrays.values())])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def teachers(tmp_path_factory, toy_dirs):
    """The ipc and the tcp teacher, started together so their imports overlap."""
    root = tmp_path_factory.mktemp("teachers")
    endpoints = {"ipc": f"ipc://{root}/sock/teacher.sock",
                 "tcp": f"tcp://127.0.0.1:{free_port()}"}
    with ExitStack() as stack:
        served = {}
        for name, endpoint in endpoints.items():
            served[name] = spawn_teacher(toy_dirs["first"], root, name, endpoint=endpoint,
                                         extra=[*HEARTBEAT, *PACKED])
            stack.callback(served[name].stop)
        for teacher in served.values():
            teacher.wait_ready()
        yield served


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
    # The "done when": docs/protocol.md is enough to talk to the teacher.
    fp, vocab = fingerprint(toy_dirs["first"])
    sock = dealer(ipc_teacher.endpoint)
    try:
        ok = hand_written_hello(sock, fp, vocab, "by-hand")
        assert ok["t"] == "HELLO_OK" and ok["tokenizer_fp"] == fp and ok["vocab_size"] == vocab
        tokens = np.array([5, 17, 99, 3, 42, 7], "<i4")
        cu = np.array([0, 6], "<i4")
        positions = np.array([0, 2, 4], "<i4")
        hand_written_score(sock, tokens, cu, positions, k=5)
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

    fp, vocab = fingerprint(toy_dirs["first"])
    tokens, cu, positions = sample_request(vocab)
    with SyncTeacherClient(ipc_teacher.endpoint, tokenizer_fp=fp, vocab_size=vocab) as client:
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

    result = CliRunner().invoke(app, ["teacher", "status", ipc_teacher.endpoint, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["state"] == "READY" and info["counters"]["requests"] >= 1


def test_reload_bumps_gen_and_refuses_another_tokenizer(ipc_teacher, toy_dirs):
    # Runs last on the ipc teacher: it changes the served model.
    from miniverl.common.errors import TeacherError
    from miniverl.protocol.sync_client import SyncTeacherClient

    fp, vocab = fingerprint(toy_dirs["first"])
    tokens, cu, positions = sample_request(vocab, seed=1)
    with SyncTeacherClient(ipc_teacher.endpoint, tokenizer_fp=fp, vocab_size=vocab) as client:
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
    events = ipc_teacher.events()
    assert "reloaded" in events and "reload_failed" in events


def test_kill9_mid_request_then_a_new_teacher_at_the_same_endpoint(tmp_path, toy_dirs, teachers):
    # Users rely on: a crashed teacher costs a re-handshake, not the training run.
    from miniverl.protocol.sync_client import SyncTeacherClient

    first = teachers["tcp"]
    endpoint = first.endpoint
    fp, vocab = fingerprint(toy_dirs["first"])
    second = None
    try:
        old = first.wait_ready()
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
            cu = np.array([0, 1000, 2000, 3000, 4000], np.int32)
            positions = np.arange(0, 3999, 2, dtype=np.int32)  # even: no sequence's last token
            rid = client.submit(tokens, cu, positions, k=16)
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(10)
            second = spawn_teacher(toy_dirs["first"], tmp_path, "second", endpoint=endpoint,
                                   extra=[*HEARTBEAT, *PACKED])
            new = second.wait_ready()
            assert new["instance"] != old["instance"]
            result = client.wait([rid], timeout_s=120)[rid]
            assert result.instance == new["instance"]
            assert client.counters["reconnects"] + client.counters["retries"] >= 1
        ref = reference(toy_dirs["first"], tokens, cu, positions, kind="topk", k=16)
        np.testing.assert_allclose(result.arrays["logprobs"], ref["logprobs"], atol=1e-5, rtol=0)

        # SHUTDOWN drain: the open request is answered before SHUTDOWN_OK.
        sock = dealer(endpoint)
        try:
            assert hand_written_hello(sock, fp, vocab, "drain")["t"] == "HELLO_OK"
            hand_written_score(sock, tokens, cu, positions, k=16)
            # An admin message: it carries the token the teacher wrote beside its log.
            token = second.log.with_suffix(".admin-token").read_text().strip()
            sock.send_multipart(
                [msgpack.packb({"v": 1, "t": "SHUTDOWN", "id": 3, "mode": "drain",
                                "auth": token})]
            )
            kinds = []
            for _ in range(2):
                assert sock.poll(60_000)
                kinds.append(msgpack.unpackb(sock.recv_multipart()[0])["t"])
        finally:
            sock.close(0)
        assert kinds == ["SCORE_OK", "SHUTDOWN_OK"]
        assert second.proc.wait(30) == 0
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_sigterm_drains_and_exits_zero(ipc_teacher):
    # Runs last: `up` stops its teacher with SIGTERM and expects a clean exit.
    ipc_teacher.proc.send_signal(signal.SIGTERM)
    assert ipc_teacher.proc.wait(30) == 0
    assert ipc_teacher.events()[-2:] == ["shutdown_started", "stopped"]
