"""A standalone mvl-score/1 teacher: numpy + pyzmq + msgpack, no miniverl import.

    python teacher.py --bind tcp://127.0.0.1:5555 --tokenizer-fp sha256:... \
        --vocab-size 263 [--corpus tokens.npy] [--name bigram] [--alpha 0.1]

It shows that the wire (docs/protocol.md) is the whole contract: any program that
answers HELLO, PING and SCORE like this can supervise a miniverl student. The model
is a bigram table over the vocabulary, counted from ``--corpus`` (a ``.npy`` file of
int token ids, sequences concatenated) with add-``alpha`` smoothing; without a
corpus it is uniform. ``P(next | previous)`` is the row of the token at the scored
position.

Served: HELLO -> HELLO_OK (or ERROR TOKENIZER_MISMATCH), PING -> PONG,
SCORE kind=topk -> SCORE_OK (kind=exact -> ERROR UNSUPPORTED), SHUTDOWN carrying the
admin token -> SHUTDOWN_OK and exit (without it: ERROR UNAUTHORIZED, nothing changes;
the token is written to ``--admin-token-file``, 0600, as miniverl's own teacher does, so
`miniverl teacher shutdown ENDPOINT --admin-token FILE` stops it); anything else -> ERROR BAD_REQUEST (unknown types included),
a header with v != 1 -> ERROR VERSION_MISMATCH. SIGTERM exits. One request at a
time, no batching, no CURVE: an example, not a production server.
"""

from __future__ import annotations

import argparse
import hmac
import os
import secrets
import signal
import sys
import time
import uuid

import msgpack
import numpy as np
import zmq

K_MAX = 256
MAX_TOKENS = 1 << 20
MAX_POSITIONS = 1 << 18
DTYPES = {"i4": "<i4", "i8": "<i8", "f4": "<f4", "f2": "<f2"}


class BadRequest(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def bigram_logprobs(vocab: int, corpus: np.ndarray | None, alpha: float) -> np.ndarray:
    """``[V, V]`` float32 table of ``log P(next | previous)`` with add-``alpha`` smoothing."""
    counts = np.full((vocab, vocab), alpha, dtype=np.float64)
    if corpus is not None and corpus.size > 1:
        ok = (corpus[:-1] < vocab) & (corpus[1:] < vocab) & (corpus[:-1] >= 0) & (corpus[1:] >= 0)
        np.add.at(counts, (corpus[:-1][ok], corpus[1:][ok]), 1.0)
    return np.log(counts / counts.sum(axis=1, keepdims=True)).astype(np.float32)


def decode(frames: list[bytes]) -> tuple[dict, dict[str, np.ndarray]]:
    header = msgpack.unpackb(frames[0], raw=False, strict_map_key=True, max_bin_len=0,
                             max_ext_len=0)
    if not isinstance(header, dict):
        raise BadRequest("BAD_REQUEST", "the header is not a map")
    specs = header.get("arrays") or []
    if len(specs) != len(frames) - 1:
        raise BadRequest("BAD_REQUEST", f"{len(specs)} arrays declared, {len(frames) - 1} sent")
    arrays = {}
    for (name, dtype, shape), frame in zip(specs, frames[1:], strict=True):
        if dtype not in DTYPES:
            raise BadRequest("BAD_REQUEST", f"array {name}: dtype {dtype!r} is not served here")
        arr = np.frombuffer(frame, dtype=DTYPES[dtype])
        if arr.size != int(np.prod(shape)):
            raise BadRequest("BAD_REQUEST", f"array {name}: {len(frame)} bytes for shape {shape}")
        arrays[name] = arr.reshape(shape)
    return header, arrays


def encode(header: dict, arrays: dict[str, np.ndarray] | None = None) -> list:
    arrays = arrays or {}
    header = {"v": 1, **header, "arrays": []}
    frames = []
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        code = {"<i4": "i4", "<f4": "f4"}[arr.dtype.str]
        header["arrays"].append([name, code, list(arr.shape)])
        frames.append(arr)
    return [msgpack.packb(header, use_bin_type=True), *frames]


class StandaloneTeacher:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.instance = uuid.uuid4().hex
        corpus = np.load(args.corpus, allow_pickle=False).astype(np.int64) if args.corpus else None
        self.table = bigram_logprobs(args.vocab_size, corpus, args.alpha)
        self.hello: set[bytes] = set()
        self.last_progress = time.monotonic()
        self.running = True
        self.admin_token = secrets.token_hex(32)
        fd = os.open(args.admin_token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.admin_token + "\n")

    def error(self, rid, code: str, message: str, retryable: bool = False) -> list:
        return encode({"t": "ERROR", "id": rid, "ref_id": rid, "code": code,
                       "message": message, "retryable": retryable,
                       "instance": self.instance, "gen": 0})

    def handle(self, client: bytes, header: dict, arrays: dict) -> list:
        rid = header.get("id")
        rid = rid if isinstance(rid, int) and not isinstance(rid, bool) and rid >= 0 else None
        if header.get("v") != 1:
            return self.error(rid, "VERSION_MISMATCH", f"protocol v{header.get('v')}; I speak v1")
        kind = header.get("t")
        if kind == "HELLO":
            return self.on_hello(client, rid, header)
        if kind == "PING":
            return encode({"t": "PONG", "id": rid, "instance": self.instance, "gen": 0,
                           "state": "READY", "inflight": 0, "queue_depth": 0,
                           "last_progress_ms": (time.monotonic() - self.last_progress) * 1e3})
        if kind == "SCORE":
            if client not in self.hello:
                return self.error(rid, "NEED_HELLO", "say HELLO first")
            return self.on_score(rid, header, arrays)
        if kind == "SHUTDOWN":
            auth = header.get("auth")
            if not isinstance(auth, str) or not hmac.compare_digest(auth, self.admin_token):
                return self.error(rid, "UNAUTHORIZED", "SHUTDOWN needs this teacher's admin "
                                  "token in 'auth'; nothing was changed")
            self.running = False
            return encode({"t": "SHUTDOWN_OK", "id": rid})
        return self.error(rid, "BAD_REQUEST", f"unknown or unsupported message type {kind!r}")

    def on_hello(self, client: bytes, rid, header: dict) -> list:
        fp, vocab = header.get("tokenizer_fp"), header.get("vocab_size")
        if fp != self.args.tokenizer_fp or vocab != self.args.vocab_size:
            return self.error(rid, "TOKENIZER_MISMATCH",
                              f"student tokenizer {fp} (vocab {vocab}) != teacher "
                              f"{self.args.tokenizer_fp} (vocab {self.args.vocab_size})")
        self.hello.add(client)
        return encode({
            "t": "HELLO_OK", "id": rid,
            "teacher": {"name": self.args.name, "model": "bigram-table", "revision": None,
                        "adapter_sha256": None},
            "instance": self.instance, "gen": 0, "tokenizer_fp": self.args.tokenizer_fp,
            "vocab_size": self.args.vocab_size, "kinds": {"topk": {"k_max": K_MAX}, "exact": None},
            "limits": {"max_tokens": MAX_TOKENS, "max_positions": MAX_POSITIONS,
                       "max_inflight": 64},
            "heartbeat_ms": 1000, "server_version": "standalone-bigram/0.1",
        })

    def on_score(self, rid, header: dict, arrays: dict) -> list:
        t0 = time.monotonic()
        if header.get("kind") != "topk":
            return self.error(rid, "UNSUPPORTED", "this teacher serves kind=topk only")
        k, temperature = header.get("k"), header.get("temperature", 1.0)
        tokens, cu, positions = (arrays.get(n) for n in ("tokens", "cu_seqlens", "positions"))
        if tokens is None or cu is None or positions is None:
            return self.error(rid, "BAD_REQUEST", "SCORE needs tokens, cu_seqlens, positions")
        vocab = self.args.vocab_size
        if not isinstance(k, int) or not 1 <= k <= min(K_MAX, vocab):
            return self.error(rid, "TOO_LARGE", f"k {k!r} must be in [1, {min(K_MAX, vocab)}]")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
            return self.error(rid, "BAD_REQUEST", f"token ids must lie in [0, {vocab})")
        seq = np.searchsorted(cu, positions, side="right") - 1
        if positions.size == 0 or np.any(seq < 0) or np.any(seq >= len(cu) - 1) or np.any(
            positions >= cu[np.clip(seq + 1, 0, len(cu) - 1)] - 1
        ):
            return self.error(rid, "BAD_REQUEST", "a position does not predict a token of its sequence")
        logits = self.table[tokens[positions]] / np.float32(temperature)
        logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
        ids = np.argsort(-logp, axis=1, kind="stable")[:, :k].astype(np.int32)
        top = np.take_along_axis(logp, ids, axis=1).astype(np.float32)
        top_mass = np.logaddexp.reduce(top.astype(np.float64), axis=1)
        tail = np.where(k == vocab, -np.inf, np.log(-np.expm1(np.minimum(top_mass, -1e-12))))
        target = np.take_along_axis(logp, tokens[positions + 1][:, None], axis=1)[:, 0]
        self.last_progress = time.monotonic()
        return encode(
            {"t": "SCORE_OK", "id": rid, "student_version": header.get("student_version", 0),
             "instance": self.instance, "gen": 0, "kind": "topk", "k": k,
             "timing": {"queue_ms": 0.0, "compute_ms": (time.monotonic() - t0) * 1e3}},
            {"ids": ids, "logprobs": top, "tail_logmass": tail.astype(np.float32),
             "target_logprobs": target.astype(np.float32)},
        )

    def serve(self) -> int:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.bind(self.args.bind)
        print(f"standalone teacher {self.args.name} serving on {self.args.bind}", flush=True)
        while self.running:
            if not sock.poll(200):
                continue
            frames = sock.recv_multipart(copy=True)
            client, payload = frames[0], frames[1:]
            try:
                header, arrays = decode(payload)
            except BadRequest as exc:
                sock.send_multipart([client, *self.error(None, exc.code, str(exc))])
                continue
            except Exception:
                continue  # a header that does not even parse gets no reply
            try:
                reply = self.handle(client, header, arrays)
            except Exception as exc:  # never let one request kill the loop
                reply = self.error(header.get("id"), "INTERNAL", f"{type(exc).__name__}: {exc}")
            sock.send_multipart([client, *reply])
        sock.close()
        ctx.term()
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A standalone bigram teacher speaking mvl-score/1.")
    p.add_argument("--bind", default="tcp://127.0.0.1:5555")
    p.add_argument("--tokenizer-fp", required=True, help="The student's tokenizer fingerprint.")
    p.add_argument("--vocab-size", type=int, required=True, help="The student's vocabulary size.")
    p.add_argument("--corpus", default=None, help=".npy of int token ids to count bigrams from.")
    p.add_argument("--alpha", type=float, default=0.1, help="Add-alpha smoothing.")
    p.add_argument("--name", default="bigram")
    p.add_argument("--admin-token-file", default="standalone-teacher.admin-token",
                   help="Where to write the admin token SHUTDOWN must carry (0600).")
    args = p.parse_args(argv)
    teacher = StandaloneTeacher(args)
    signal.signal(signal.SIGTERM, lambda *_: setattr(teacher, "running", False))
    return teacher.serve()


if __name__ == "__main__":
    sys.exit(main())
