"""What does the wire cost? Teacher scoring latency in-process vs over ipc:// vs tcp://.

    python benchmarks/teacher_protocol.py [--reps 3] [--large-reps N] [--threads 1] [--full]

For two teachers — the toy teacher of ``recipes/toy_cpu_opd.yaml`` (V = 263) and a
random-init Qwen3 with a 151,669-token vocabulary and a small hidden size (so it runs
on a CPU) — and for 512 and 4,096 positions with ``topk`` (k = 64) and ``exact``, it
times :func:`~miniverl.teacher_server.scoring.score_positions` called directly and the
same request through a :class:`~miniverl.protocol.client.SyncTeacherClient` to a
:class:`~miniverl.teacher_server.server.TeacherServer` over ipc and over tcp loopback. It
prints the median latencies, the ratio (over the wire / in-process) and the reply
bytes per scored position, and writes ``teacher_protocol.json`` in ``--output-dir`` (default ``runs/benchmarks/teacher_protocol/``; the committed ``benchmarks/results/teacher_protocol.json`` with ``--update-committed``).

The servers run in this process on their own event-loop threads with the real torch
backend; the bytes still cross real ipc/tcp sockets, but the client and the server
share one interpreter. Exact replies for 4,096 positions of the large vocabulary are
2.5 GB each and are skipped unless ``--full``. Targets (docs/teacher-server.md, "What the
wire costs"): the wire adds at most 5% at 2k+ top-k positions; top-k bytes per position =
8·k + 8.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from miniverl.student.benchmark.outputs import add_output_options, script_output_file

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "teacher_protocol.json"
TOY_TEACHER = {
    "hidden": 128,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 256,
    "seed": 1,
}
LARGE_VOCAB = 151669
K = 64


def build_large_vocab_teacher(root: Path) -> Path:
    """A random-init Qwen3 (hidden 64, 2 layers) with V = 151,669, saved with a tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from miniverl.common.toy import build_toy_tokenizer

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=LARGE_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    out = root / "qwen3-v151669"
    Qwen3ForCausalLM(config).save_pretrained(out)
    build_toy_tokenizer().save_pretrained(out)
    return out


def request(positions: int, vocab: int, seed: int = 0):
    """``positions / 512`` sequences of 513 tokens; every position predicts a token."""
    rng = np.random.default_rng(seed)
    n_seq = max(1, positions // 512)
    tokens = rng.integers(0, vocab, n_seq * 513).astype(np.int32)
    cu = (np.arange(n_seq + 1) * 513).astype(np.int32)
    pos = np.concatenate([np.arange(cu[b], cu[b + 1] - 1) for b in range(n_seq)]).astype(np.int32)
    return tokens, cu, pos


def start_server(endpoint: str, loaded, exact_max_vocab: int):
    from miniverl.protocol.limits import Limits
    from miniverl.teacher_server.server import TeacherServer
    from miniverl.teacher_server.server_state import ServerConfig
    from miniverl.teacher_server.torch_backend import TorchTeacher

    backend = TorchTeacher(loaded, exact_max_vocab=exact_max_vocab, max_batch_tokens=8192)
    limits = Limits(max_exact_vocab=exact_max_vocab, max_array_bytes=2**33)
    server = TeacherServer(
        ServerConfig(endpoint=endpoint, limits=limits, dedup_max_bytes=0), lambda request: backend
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    while server.endpoint is None:
        time.sleep(0.01)
    return server, thread


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def interleaved_times(calls: dict, reps: int) -> tuple[dict, dict]:
    """Median wall time per call over ``reps`` rounds after a warm-up round.

    The calls take turns within each round, so load drift on a shared machine hits all
    alike, and the round's first call rotates: with a fixed order the call that follows
    another one's large reply (allocator, caches) was measured up to 10% slower.
    """
    results = {name: fn() for name, fn in calls.items()}
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            t0 = time.perf_counter()
            results[name] = calls[name]()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in samples.items()}, results


def timed_score(client, added: list[float], tokens, cu, pos, kind: str):
    """One SCORE; appends latency minus the teacher's reported queue + compute time."""
    t0 = time.perf_counter()
    result = client.score(tokens, cu, pos, kind=kind, k=K)
    elapsed = time.perf_counter() - t0
    added.append(elapsed - (result.timing["compute_ms"] + result.timing["queue_ms"]) / 1e3)
    return result


def bench_model(label: str, model_dir: Path, args, tmp: Path, reps: int) -> list[dict]:
    from miniverl.protocol.sync_client import SyncTeacherClient
    from miniverl.teacher_server.loader import TeacherSpec, load_teacher
    from miniverl.teacher_server.scoring import score_positions

    loaded = load_teacher(TeacherSpec(model=str(model_dir), device="cpu", dtype="float32"))
    vocab = loaded.vocab_size
    endpoints = {"ipc": f"ipc://{tmp}/{label}.sock", "tcp": f"tcp://127.0.0.1:{free_port()}"}
    servers = {
        name: start_server(ep, loaded, exact_max_vocab=2**20) for name, ep in endpoints.items()
    }
    clients = {
        name: SyncTeacherClient(
            server.endpoint,
            tokenizer_fp=loaded.tokenizer_fp,
            vocab_size=vocab,
            request_timeout_s=600,
            unavailable_timeout_s=600,
        )
        for name, (server, _) in servers.items()
    }
    rows = []
    try:
        for client in clients.values():
            client.connect()
        for n_pos in (512, 4096):
            tokens, cu, pos = request(n_pos, vocab)
            for kind in ("topk", "exact"):
                k = K if kind == "topk" else 0
                if kind == "exact" and n_pos * vocab * 4 > 2**30 and not args.full:
                    rows.append(
                        {
                            "model": label,
                            "vocab": vocab,
                            "positions": n_pos,
                            "kind": kind,
                            "skipped": f"{n_pos * vocab * 4 / 2**30:.1f} GiB reply; --full",
                        }
                    )
                    print(f"{label:>10} V={vocab:<6} P={n_pos:<5} {kind:<5} skipped (--full)")
                    continue
                calls = {
                    "in_process": functools.partial(
                        score_positions, loaded.model, tokens, cu, pos, kind, K, 1.0, 2**20
                    )
                }
                wire: dict[str, list[float]] = {name: [] for name in clients}
                for name, client in clients.items():
                    calls[name] = functools.partial(
                        timed_score, client, wire[name], tokens, cu, pos, kind
                    )
                before = {name: c.counters["bytes_received"] for name, c in clients.items()}
                times, results = interleaved_times(calls, reps)
                local = times["in_process"]
                row = {
                    "model": label,
                    "vocab": vocab,
                    "positions": n_pos,
                    "kind": kind,
                    "k": k,
                    "in_process_s": round(local, 5),
                }
                for name, client in clients.items():
                    received = (client.counters["bytes_received"] - before[name]) / (reps + 1)
                    array_bytes = sum(a.nbytes for a in results[name].arrays.values())
                    row[f"{name}_s"] = round(times[name], 5)
                    row[f"{name}_ratio"] = round(times[name] / local, 4)
                    # Per call, the reply's own compute time subtracted from the client's
                    # latency: what the wire added to that call, free of the drift between
                    # two separate calls that the ratio above is subject to.
                    added = statistics.median(wire[name][1:])  # [0] is the warm-up round
                    row[f"{name}_wire_added_s"] = round(added, 5)
                    row[f"{name}_wire_added_ratio"] = round(1 + added / local, 4)
                    row["array_bytes_per_position"] = array_bytes / n_pos
                    row[f"{name}_wire_bytes_per_position"] = round(received / n_pos, 2)
                rows.append(row)
                print(
                    f"{label:>10} V={vocab:<6} P={n_pos:<5} {kind:<5} in-proc {local * 1e3:9.1f} ms"
                    f"  ipc {row['ipc_s'] * 1e3:9.1f} ms (x{row['ipc_ratio']:.3f}, wire "
                    f"+{row['ipc_wire_added_s'] * 1e3:.1f} ms)"
                    f"  tcp {row['tcp_s'] * 1e3:9.1f} ms (x{row['tcp_ratio']:.3f}, wire "
                    f"+{row['tcp_wire_added_s'] * 1e3:.1f} ms)"
                    f"  {row['array_bytes_per_position']:.0f} B/pos arrays, "
                    f"{row['tcp_wire_bytes_per_position']:.1f} B/pos on the wire",
                    flush=True,
                )
    finally:
        for client in clients.values():
            client.close()
        for server, thread in servers.values():
            server.shutdown_threadsafe("abort")
            thread.join(30)
    return rows


def parse_pinned(parser: argparse.ArgumentParser, committed: Path) -> argparse.Namespace:
    """The arguments (with the output options; ``out`` the file to write), and the BLAS
    thread counts pinned to ``--threads`` before torch loads: the server's worker thread
    takes its OpenMP thread count from the environment (torch.set_num_threads only
    reaches the calling thread)."""
    add_output_options(parser, committed)
    args = parser.parse_args()
    args.out = script_output_file(args, committed, ROOT)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="Timed repetitions (median).")
    parser.add_argument(
        "--large-reps", type=int, default=None,
        help="Repetitions for the 151,669-token teacher (default --reps; its 4,096-position "
        "calls take about a minute each on one CPU thread).",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    parser.add_argument("--full", action="store_true", help="Include 2.5 GB exact replies.")
    args = parse_pinned(parser, RESULTS)

    import torch

    from miniverl.common.recipe_models import ToySpec
    from miniverl.common.toy import toy_model_dir

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="mvl-bench-") as tmp:
        tmp_path = Path(tmp)
        rows = bench_model("toy", toy_model_dir(ToySpec(**TOY_TEACHER)), args, tmp_path,
                           args.reps)
        rows += bench_model("qwen3-151k", build_large_vocab_teacher(tmp_path), args, tmp_path,
                            args.large_reps or args.reps)
    topk_big = [r for r in rows if r["kind"] == "topk" and r["positions"] >= 2048]
    summary = {
        "target_wire_overhead_at_2k_topk": 1.05,
        "worst_ratio_at_2k_topk": max(max(r["ipc_ratio"], r["tcp_ratio"]) for r in topk_big),
        "worst_wire_added_ratio_at_2k_topk": max(
            max(r["ipc_wire_added_ratio"], r["tcp_wire_added_ratio"]) for r in topk_big
        ),
        "topk_bytes_per_position_expected": 8 * K + 8,
        "topk_bytes_per_position_measured": sorted(
            {r["array_bytes_per_position"] for r in rows if r["kind"] == "topk"}
        ),
    }
    report = {
        "benchmark": "teacher_protocol",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": args.threads,
        "reps": args.reps,
        "large_reps": args.large_reps or args.reps,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "rows": rows,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
