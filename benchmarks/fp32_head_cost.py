"""The output layer in bfloat16 against float32 (``loss.fp32_head``): log-prob error and cost.

    python benchmarks/fp32_head_cost.py [--positions 128] [--repeats 3]
        [--output benchmarks/results/fp32_head_cost.json]

A Qwen3-0.6B-shaped head (hidden 1,024, the real vocabulary 151,936), weights and
hidden states in bfloat16 as a bf16 model holds them, logits scaled to the 20-30 range
a trained model reaches. For one chunk of positions it measures, against a float64
reference of the same bf16 inputs: the log-prob error of the bf16 head (bf16 matmul,
widened after, as the code did) and of the fp32 head (inputs widened, fp32 matmul), at
the sampled token and over the whole vocabulary; and the cost of each head on the CPU:
time of a forward and backward (to the hidden states, the LoRA student's case), and
peak resident memory above the inputs (each head measured in its own process).
This is a CPU measurement: a GPU's bf16 matmul rounds the same way at the output, but
its times differ. It does not train anything.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HIDDEN = 1024
VOCAB = 151_936
OUT = Path(__file__).resolve().parent / "results" / "fp32_head_cost.json"


def _inputs(positions: int):
    import torch

    g = torch.Generator().manual_seed(0)
    # Filled in slices, so making the inputs never peaks above the head's own use.
    weight = torch.empty(VOCAB, HIDDEN, dtype=torch.bfloat16)
    for lo in range(0, VOCAB, 8192):
        rows = weight[lo:lo + 8192]
        rows.copy_(torch.randn(rows.shape, generator=g) * 0.06)
    hidden = (torch.randn(positions, HIDDEN, generator=g) * 1.4).to(torch.bfloat16)
    # A few rows point at one token hard, as a confident model does (logits near 20-30).
    hot = torch.randint(0, VOCAB, (positions,), generator=g)
    hidden = (hidden.float() + 6.0 * weight[hot].float()).to(torch.bfloat16)
    return weight, hidden, hot


def _head(kind: str, weight, hidden):
    import torch

    from miniverl.common.modeling import fp32_head_forward

    layer = torch.nn.Linear(HIDDEN, VOCAB, bias=False, dtype=torch.bfloat16)
    layer.weight.data = weight
    layer.weight.requires_grad_(False)
    if kind == "fp32":
        return lambda h: fp32_head_forward(layer, h)
    return lambda h: layer(h).float()


def error_figures(positions: int) -> dict:
    import torch

    weight, hidden, hot = _inputs(positions)
    exact = torch.log_softmax(hidden.double() @ weight.double().T, dim=-1)
    out: dict = {"max_logit": round(float((hidden.double() @ weight.double().T).max()), 2)}
    for kind in ("bf16", "fp32"):
        with torch.no_grad():
            lp = torch.log_softmax(_head(kind, weight, hidden)(hidden), dim=-1).double()
        err = (lp - exact).abs()
        sampled = err.gather(1, hot[:, None])[:, 0]
        out[kind] = {"sampled_token_max_abs": float(sampled.max()),
                     "sampled_token_mean_abs": float(sampled.mean()),
                     "full_vocab_max_abs": float(err.max())}
    return out


def peak_rss_kib() -> int:
    """This process's peak resident memory (``VmHWM``; unlike ``ru_maxrss`` it starts
    afresh at ``exec``, so a child does not inherit its parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def cost_child(kind: str, positions: int, repeats: int) -> dict:
    """One head's time and peak RSS above its inputs (run in its own process)."""
    import torch

    torch.set_num_threads(1)
    weight, hidden, _ = _inputs(positions)
    base = peak_rss_kib()
    head = _head(kind, weight, hidden)
    times = []
    for _ in range(repeats):
        h = hidden.detach().requires_grad_(True)
        t0 = time.perf_counter()
        logits = head(h)
        loss = torch.log_softmax(logits.float(), dim=-1)[:, 0].sum()
        loss.backward()
        times.append(time.perf_counter() - t0)
    peak = peak_rss_kib()
    return {"seconds_per_chunk": round(min(times), 4), "peak_rss_above_inputs_mib":
            round((peak - base) / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--positions", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output", type=Path, default=OUT)
    p.add_argument("--child", choices=("bf16", "fp32"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(cost_child(args.child, args.positions, args.repeats)))
        return 0
    record = {"benchmark": "fp32_head_cost", "hidden": HIDDEN, "vocab": VOCAB,
              "positions": args.positions, "device": "cpu", "threads": 1,
              "error_vs_float64": error_figures(args.positions), "cost": {}}
    for kind in ("bf16", "fp32"):
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", kind,
             "--positions", str(args.positions), "--repeats", str(args.repeats)],
            capture_output=True, text=True, check=True)
        record["cost"][kind] = json.loads(done.stdout.strip().splitlines()[-1])
    b, f = record["cost"]["bf16"], record["cost"]["fp32"]
    record["cost"]["fp32_over_bf16_time"] = round(f["seconds_per_chunk"] / b["seconds_per_chunk"], 2)
    record["cost"]["fp32_extra_peak_mib"] = round(
        f["peak_rss_above_inputs_mib"] - b["peak_rss_above_inputs_mib"], 1)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
