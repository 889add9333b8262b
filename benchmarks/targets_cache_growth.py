"""What a targets-cache put costs as a run's cache grows.

    python benchmarks/targets_cache_growth.py          # writes ``targets_cache_growth.json`` in ``--output-dir`` (default ``runs/benchmarks/targets_cache_growth/``; the committed ``benchmarks/results/targets_cache_growth.json`` with ``--update-committed``)

A strict OPD run stores each update's replies in one put (``TargetsCache.put_many``),
which writes one shard and rewrites the whole index. The index grows with the run, so
a put's cost grows too. This replays the shape of the recovery benchmark's 256-update
OPD cell (16 entries a put, 70 positions each, top-16 + tail: 4,096 entries, a 3.3 MB
index in the recovery run, 2-3 MB here) into a fresh cache and prints the mean put
time in each quarter of the run and the total, for the code as it is. Before the index
was written on one line (json's C encoder), this replay measured 0.046, 0.111, 0.148 and
0.205 s a put by quarter, 32.7 s in all (kept in
``results/targets_cache_growth_indented_index.json``); after, 0.008, 0.019, 0.035 and
0.051 s, 7.2 s in all. Each put still rewrites the whole index, so its cost still grows
with the run.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from miniverl.student.benchmark.outputs import add_output_options, script_output_file
from miniverl.student.targets_cache import TargetsCache
from miniverl.student.targets_entries import CacheIdentity, EntryKey

RESULT = Path(__file__).resolve().parent / "results" / "targets_cache_growth.json"


def entry(rng: np.random.Generator, positions: int, k: int, vocab: int) -> dict[str, np.ndarray]:
    logprobs = np.sort(np.log(rng.dirichlet(np.ones(k + 1), size=positions)), axis=1)[:, ::-1]
    return {
        "ids": rng.integers(0, vocab, size=(positions, k)).astype(np.int32),
        "logprobs": logprobs[:, :k].astype(np.float32),
        "tail_logmass": logprobs[:, k].astype(np.float32),
        "target_logprobs": logprobs[:, 0].astype(np.float32),
        "positions": np.arange(positions, dtype=np.int32),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--puts", type=int, default=256)
    parser.add_argument("--entries-per-put", type=int, default=16)
    parser.add_argument("--positions", type=int, default=70)
    add_output_options(parser, RESULT)
    args = parser.parse_args(argv)
    args.output = script_output_file(args, RESULT, Path(__file__).resolve().parents[1])
    k, vocab = 16, 263
    identity = CacheIdentity(tokenizer_fp="sha256:" + "0" * 64, vocab_size=vocab, kind="topk",
                             k=k, objective="bucketed_topk_tail", temperature=1.0)
    rng = np.random.default_rng(0)
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = TargetsCache(Path(tmp) / "targets", identity)
        for put in range(args.puts):
            items = [(EntryKey(trajectory_id=f"calculator/t{put}-{i}/v{put}/s{i}",
                               student_version=put, teacher="teacher", instance="bench", gen=0),
                      entry(rng, args.positions, k, vocab))
                     for i in range(args.entries_per_put)]
            start = time.perf_counter()
            cache.put_many(items)
            times.append(time.perf_counter() - start)
        index_bytes = (Path(tmp) / "targets" / "index.json").stat().st_size
    quarters = [float(np.mean(q)) for q in np.array_split(np.array(times), 4)]
    result = {
        "benchmark": "targets_cache_growth",
        "puts": args.puts, "entries_per_put": args.entries_per_put,
        "positions_per_entry": args.positions, "entries": args.puts * args.entries_per_put,
        "index_bytes": index_bytes,
        "mean_put_s_by_quarter": quarters, "last_put_s": times[-1], "total_s": float(sum(times)),
        "machine": {"python": platform.python_version(), "cpu": platform.processor()},
    }
    print(f"{result['entries']} entries, index {index_bytes / 1e6:.1f} MB: mean put "
          + ", ".join(f"{q:.3f}" for q in quarters) + f" s by quarter, {sum(times):.1f} s in all")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
