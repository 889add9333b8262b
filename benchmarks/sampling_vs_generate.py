"""Sampling speed against transformers' ``generate``: the same model, batch, prompts and settings.

    python benchmarks/sampling_vs_generate.py [--shapes 32x64,8x128] [--pairs 9]
        [--threads 1] [--device cpu] [--dtype float32] [--model-dir DIR] [--update-committed]

For each shape ``BxT`` the two arms sample ``B`` episodes of the calculator environment
at once (the first ``B`` training tasks, difficulty ``mixed``, split seed 0: the real
calculator prompt, about 304 tokens, rendered by the model's chat template), ``T`` new
tokens each, at temperature 1.0 with top-p 1.0 (no top-k):

- **ours**: :class:`~miniverl.student.rollout.runner.RolloutRunner` with one turn and
  ``ignore_stop`` (a turn never ends at ``<|im_end|>``), exactly as
  ``benchmarks/rollout_throughput.py`` times it: prompt building, the shared system
  prefix prefilled once, the rest left-padded, decode over the KV cache;
- **generate**: the same prompt token ids, built by the same
  :class:`~miniverl.student.rollout.chat.EpisodeBuilder` inside the timed region,
  left-padded with an attention mask, then ``model.generate(do_sample=True,
  temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=T)`` with no end-of-sequence id,
  so every row samples exactly ``T`` tokens too.

Each arm runs once untimed per shape (warm-up), then ``--pairs`` timed pairs, the first
arm alternating pair by pair so that drift in the machine's load hits both alike. The
figures are each arm's median tokens sampled per second (``B * T`` / wall seconds) and
the median of the pairs' ratios ours / generate (robust to a pair that another job on the
machine slowed; the two medians of tokens/s need not divide to it); the record also holds
every pair's seconds and ratio, and the ratio of the two arms' total seconds. Prints a table and writes
``sampling_vs_generate.json`` in ``--output-dir`` (default
``runs/benchmarks/sampling_vs_generate/``; the committed
``benchmarks/results/sampling_vs_generate.json`` with ``--update-committed``).

The model is the toy student of ``rollout_throughput.py`` (64 wide, 2 layers), or the
Hugging Face directory ``--model-dir`` (``benchmarks/gpu_check.py`` passes its
Qwen3-0.6B-shaped student and ``--device cuda``). Only the sampling loop is measured: no
teacher, no training, no tool call.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "sampling_vs_generate.json"
TOY = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128}
ARMS = ("ours", "generate")


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"32x64,8x128"`` -> ``[(32, 64), (8, 128)]``; ValueError naming the bad part."""
    shapes = []
    for part in text.split(","):
        batch, sep, tokens = part.strip().partition("x")
        if not sep or not batch.isdigit() or not tokens.isdigit() or min(int(batch), int(tokens)) < 1:
            raise ValueError(f"--shapes part {part.strip()!r} is not BATCHxTOKENS with both "
                             "at least 1; write e.g. --shapes 32x64,8x128")
        shapes.append((int(batch), int(tokens)))
    return shapes


def _args(argv: list[str] | None) -> argparse.Namespace:
    from miniverl.student.benchmark.outputs import add_output_options, script_output_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="32x64,8x128",
                        help="Comma-separated BATCHxTOKENS (episodes at once x sampled tokens).")
    parser.add_argument("--pairs", type=int, default=9, help="Timed pairs per shape.")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N.")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="A Hugging Face model directory (default: the toy student).")
    add_output_options(parser, RESULTS)
    args = parser.parse_args(argv)
    for name, least in (("pairs", 1), ("threads", 1)):
        if getattr(args, name) < least:
            parser.exit(1, f"error: --{name} {getattr(args, name)} must be at least {least}; "
                        f"pass --{name} {least} or more\n")
    try:
        args.shape_list = parse_shapes(args.shapes)
    except ValueError as exc:
        parser.exit(1, f"error: {exc}\n")
    if args.model_dir is not None and not (args.model_dir / "config.json").is_file():
        parser.exit(1, f"error: --model-dir {args.model_dir} holds no config.json; pass a "
                    "Hugging Face model directory (one saved with save_pretrained)\n")
    args.out = script_output_file(args, RESULTS, ROOT)
    return args


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


def _tasks(batch: int) -> list[Any]:
    from miniverl.student.environments import make_tasks

    return make_tasks("calculator", "train", batch, "mixed", split_seed=0)


def prompt_ids(tokenizer: Any, tasks: list[Any]) -> list[list[int]]:
    """Each task's prompt as the runner builds it (system with tools, user, assistant header)."""
    from miniverl.student.environments import get_environment
    from miniverl.student.rollout.chat import EpisodeBuilder
    from miniverl.student.rollout.privileged import episode_system

    out = []
    for task in tasks:
        env = get_environment("calculator")
        env.reset(task)
        builder = EpisodeBuilder(tokenizer, episode_system(env, task, False), task.prompt,
                                 env.tool_specs())
        out.append(list(builder.tokens))
    return out


def time_ours(model: Any, tokenizer: Any, tasks: list[Any], tokens: int, device: Any) -> float:
    """Seconds for the runner to sample ``tokens`` new tokens for every task at once."""
    from miniverl.common.recipe_sections import RolloutConfig
    from miniverl.student.rollout.runner import RolloutRunner

    rollout = RolloutConfig(max_turns=1, max_new_tokens_per_turn=tokens, max_total_tokens=4096,
                            temperature=1.0, top_p=1.0, batch_size=len(tasks))
    runner = RolloutRunner(model, tokenizer, env_name="calculator", rollout=rollout,
                           tokenizer_fp="bench", device=device, ignore_stop=True)
    _sync(device)
    start = time.perf_counter()
    trajs = runner.run(tasks, policy_version=0, seeds=list(range(len(tasks))))
    _sync(device)
    wall = time.perf_counter() - start
    sampled = sum(int(sum(t.loss_mask())) for t in trajs)
    if sampled != tokens * len(tasks):
        raise RuntimeError(f"ours sampled {sampled} tokens, expected {tokens * len(tasks)}")
    return wall


def time_generate(model: Any, tokenizer: Any, tasks: list[Any], tokens: int, device: Any) -> float:
    """Seconds for ``model.generate`` to sample ``tokens`` new tokens for every task at once."""
    import torch
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              max_new_tokens=tokens, eos_token_id=None, pad_token_id=pad)
    # No end-of-sequence id anywhere: every row samples exactly `tokens` (as ignore_stop).
    model.generation_config.eos_token_id = None
    _sync(device)
    start = time.perf_counter()
    prompts = prompt_ids(tokenizer, tasks)
    width = max(len(p) for p in prompts)
    ids_B_L = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask_B_L = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids_B_L[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask_B_L[b, width - len(p):] = 1
    with torch.inference_mode():
        out = model.generate(input_ids=ids_B_L.to(device), attention_mask=mask_B_L.to(device),
                             generation_config=config)
    _sync(device)
    wall = time.perf_counter() - start
    if out.shape[1] - width != tokens:
        raise RuntimeError(f"generate sampled {out.shape[1] - width} tokens per row, expected {tokens}")
    return wall


def compare(model: Any, tokenizer: Any, shapes: list[tuple[int, int]], pairs: int, device: Any,
            advance: Any = None) -> list[dict[str, Any]]:
    """One row per shape: both arms' seconds per pair, tokens/s medians and ratios.

    ``advance()`` is called after every timed or warm-up run (a progress bar's step)."""
    timers = {"ours": time_ours, "generate": time_generate}
    rows = []
    for batch, tokens in shapes:
        tasks = _tasks(batch)
        for arm in ARMS:  # warm-up: allocator, kernels, first-call costs
            timers[arm](model, tokenizer, tasks, tokens, device)
            if advance:
                advance()
        seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for pair in range(pairs):
            order = ARMS if pair % 2 == 0 else tuple(reversed(ARMS))
            for arm in order:
                seconds[arm].append(timers[arm](model, tokenizer, tasks, tokens, device))
                if advance:
                    advance()
        sampled = batch * tokens
        per_s = {arm: [sampled / x for x in seconds[arm]] for arm in ARMS}
        # A pair's two runs share the machine's load of that moment; the median of the
        # pairs' ratios is robust to a pair a neighbouring job slowed (one such pair moves
        # a ratio of totals by 10% or more on a shared 2-core machine).
        ratios = [g / o for o, g in zip(seconds["ours"], seconds["generate"], strict=True)]
        rows.append({
            "batch": batch, "new_tokens": tokens, "sampled_tokens": sampled,
            "prompt_tokens_mean": round(statistics.mean(len(p) for p in prompt_ids(tokenizer, tasks)), 1),
            "ours_tokens_per_s": round(statistics.median(per_s["ours"]), 1),
            "generate_tokens_per_s": round(statistics.median(per_s["generate"]), 1),
            "ratio_ours_over_generate": round(statistics.median(ratios), 3),
            "ratio_of_totals": round(sum(seconds["generate"]) / sum(seconds["ours"]), 3),
            "ratio_per_pair": [round(r, 3) for r in ratios],
            "ours_s": [round(s, 4) for s in seconds["ours"]],
            "generate_s": [round(s, 4) for s in seconds["generate"]],
        })
    return rows


def load_model(model_dir: Path | None, device: Any, dtype: str) -> tuple[Any, Any, dict]:
    """(model in eval mode on ``device``, tokenizer, description) for the record."""
    import torch

    from miniverl.common.toy import build_toy_model, build_toy_tokenizer

    if model_dir is None:
        tok = build_toy_tokenizer()
        model = build_toy_model(TOY, tok)
        what = {"toy": TOY, "vocab": len(tok)}
    else:
        from miniverl.common.modeling import load_causal_lm, load_tokenizer

        tok = load_tokenizer(model_dir)
        model = load_causal_lm(model_dir, dtype=dtype, device=str(device))
        what = {"dir": model_dir.name, "vocab": len(tok)}
    model = model.to(device=device, dtype=getattr(torch, dtype)).eval()
    what["parameters"] = sum(p.numel() for p in model.parameters())
    return model, tok, what


def environment(device: Any) -> dict[str, Any]:
    import torch
    import transformers

    out = {
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "machine": platform.machine(),
        "cpu_count": os.cpu_count(), "device": str(device),
    }
    if getattr(device, "type", "") == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        out["cuda"] = torch.version.cuda
    return out


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from miniverl.common.modeling import resolve_device

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    model, tok, what = load_model(args.model_dir, device, args.dtype)
    load_before = os.getloadavg()
    total = len(args.shape_list) * 2 * (args.pairs + 1)
    with Progress("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True)) as progress:
        bar = progress.add_task("sampling: ours vs generate", total=total)
        rows = compare(model, tok, args.shape_list, args.pairs, device,
                       advance=lambda: progress.advance(bar))
    record = {
        "benchmark": "sampling_vs_generate",
        "model": what, "dtype": args.dtype, "threads": args.threads, "pairs": args.pairs,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": None,
                     "environment": "calculator", "difficulty": "mixed", "split_seed": 0},
        "rows": rows,
        "environment": environment(device),
        # Other jobs on a shared machine slow both arms; the pairs alternate to share it.
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    table = Table(title=f"sampling tokens/s, medians of {args.pairs} pairs ({device}, {args.dtype})")
    for col in ("batch x tokens", "ours", "generate", "ours / generate (median of pairs)",
                "per pair"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['batch']} x {r['new_tokens']}", f"{r['ours_tokens_per_s']:,.0f}",
                      f"{r['generate_tokens_per_s']:,.0f}", f"{r['ratio_ours_over_generate']:.2f}x",
                      " ".join(f"{x:.2f}" for x in r["ratio_per_pair"]))
    console = Console(width=None if sys.stdout.isatty() else 120)
    console.print(table)
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
