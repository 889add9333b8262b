"""Rollout throughput of the toy student at batch 1, 8 and 32.

Run:  python benchmarks/rollout_throughput.py [--tokens 64] [--threads 1] [--device cpu]

Every episode samples exactly ``--tokens`` tokens in one turn (the runner's
``ignore_stop`` mode never ends a turn at ``<|im_end|>``), so the batch sizes do the
same work per episode and episodes/s compare fairly. The prompt is the real
calculator prompt rendered by the toy chat template. Prints a table and writes
``rollout_throughput.json`` in ``--output-dir`` (default
``runs/benchmarks/rollout_throughput/``; the committed
``benchmarks/results/rollout_throughput.json`` with ``--update-committed``). Target: batch 32 reaches at least
8x the episodes/s of batch 1.

This measures the sampling loop only: no teacher, no training, no tool execution cost
beyond building the prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from miniverl.common.recipe_sections import RolloutConfig
from miniverl.common.toy import build_toy_model, build_toy_tokenizer
from miniverl.student.benchmark.outputs import add_output_options, script_output_file
from miniverl.student.environments import make_tasks
from miniverl.student.rollout.runner import RolloutRunner

RESULTS = Path(__file__).parent / "results" / "rollout_throughput.json"
TOY = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128}


def measure(model, tok, tasks, batch_size: int, tokens: int, device) -> dict:
    rollout = RolloutConfig(max_turns=1, max_new_tokens_per_turn=tokens, max_total_tokens=4096,
                            temperature=1.0, top_p=1.0, batch_size=batch_size)
    runner = RolloutRunner(
        model, tok, env_name="calculator", rollout=rollout, tokenizer_fp="bench",
        device=device, ignore_stop=True,
    )
    runner.run(tasks[:batch_size], policy_version=0, seeds=list(range(batch_size)))  # warm-up
    start = time.perf_counter()
    trajs = runner.run(tasks, policy_version=0, seeds=list(range(len(tasks))))
    wall = time.perf_counter() - start
    generated = sum(sum(t.loss_mask()) for t in trajs)
    assert generated == tokens * len(tasks), "every episode must sample exactly --tokens"
    return {
        "batch_size": batch_size,
        "episodes": len(tasks),
        "tokens_per_episode": tokens,
        "wall_s": round(wall, 4),
        "episodes_per_s": round(len(tasks) / wall, 3),
        "generated_tokens_per_s": round(int(generated) / wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="Sampled tokens per episode.")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    parser.add_argument("--device", default="cpu", help="cpu or cuda.")
    parser.add_argument("--batches", default="1,8,32", help="Comma-separated batch sizes.")
    add_output_options(parser, RESULTS)
    args = parser.parse_args()
    args.out = script_output_file(args, RESULTS, Path(__file__).resolve().parents[1])
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tok = build_toy_tokenizer()
    model = build_toy_model(TOY, tok).to(device).eval()
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for b in batches:
        # Enough episodes that each batch size runs at least two full batches.
        n = max(2 * b, 8)
        tasks = make_tasks("calculator", "train", n, "mixed", split_seed=0)
        rows.append(measure(model, tok, tasks, b, args.tokens, device))
        r = rows[-1]
        print(
            f"batch {b:>3}: {r['episodes_per_s']:>8.2f} episodes/s  "
            f"{r['generated_tokens_per_s']:>9.1f} tokens/s  ({r['episodes']} episodes, "
            f"{r['wall_s']:.2f} s)",
            flush=True,
        )
    base = rows[0]["episodes_per_s"]
    for r in rows:
        r["speedup_vs_first"] = round(r["episodes_per_s"] / base, 2)
    result = {
        "benchmark": "rollout_throughput",
        "model": {"toy": TOY, "vocab": len(tok)},
        "device": str(device),
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        # Other jobs on a shared machine slow batch 1 and batch 32 alike; record it.
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "rows": rows,
        "target": "batch 32 episodes/s >= 8x batch 1",
    }
    by_batch = {r["batch_size"]: r for r in rows}
    if 1 in by_batch and 32 in by_batch:
        ratio = by_batch[32]["episodes_per_s"] / by_batch[1]["episodes_per_s"]
        result["batch32_over_batch1"] = round(ratio, 2)
        result["target_met"] = ratio >= 8.0
    print()
    print(f"{'batch':>5} {'episodes/s':>11} {'tokens/s':>10} {'speedup':>8}")
    for r in rows:
        print(
            f"{r['batch_size']:>5} {r['episodes_per_s']:>11.2f} "
            f"{r['generated_tokens_per_s']:>10.1f} {r['speedup_vs_first']:>7.2f}x"
        )
    if "target_met" in result:
        print(f"batch 32 / batch 1 = {result['batch32_over_batch1']}x "
              f"(target >= 8x: {'met' if result['target_met'] else 'NOT met'})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
