"""When does the toy student learn to copy? SFT steps until held-out digit accuracy jumps.

    python benchmarks/copy_plateau.py [--seeds 1 2 3] [--clip 0.05] [--lr 3e-3]
        [--batch 16] [--max-steps 600] [--every 25] [--init-std S] [--rope-theta B]

The student of ``recipes/toy_cpu_opd.yaml`` is trained by SFT on oracle calculator traces
(one CPU thread), ``--batch`` traces a step in an order drawn from ``--seeds``. Every
``--every`` steps the script measures teacher-forced accuracy at the positions that
predict a digit, on 64 held-out traces: the format is learned in ~50 steps, the digits
only once the model can copy them from the prompt and the tool result (the plateau
docs/toy-learning.md describes). It prints, per seed, the first step at >= 0.9 and at
>= 0.98 (it stops there), and writes ``copy_plateau.json`` in ``--output-dir`` (default ``runs/benchmarks/copy_plateau/``; the committed ``benchmarks/results/copy_plateau.json`` with ``--update-committed``).

``--init-std`` re-draws every weight matrix from N(0, S^2) (the toy builder uses
transformers' 0.02) and ``--rope-theta`` sets the rotary base (the toy's is 10,000), to
measure how the plateau depends on them. This script measures; it changes no recipe and
no toy model.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from miniverl.student.benchmark.outputs import add_output_options, script_output_file

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "toy_cpu_opd.yaml"


def reshape(model, init_std: float | None, rope_theta: float | None) -> None:
    """Re-draw the weight matrices and/or change the rotary base of a freshly built model."""
    import torch

    if init_std is not None:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() == 2:  # linear layers and the (tied) embedding
                    param.normal_(0.0, init_std, generator=gen)
    if rope_theta is not None:
        for module in model.modules():
            if hasattr(module, "inv_freq") and "Rotary" in type(module).__name__:
                dim = 2 * module.inv_freq.shape[0]
                inv = 1.0 / rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
                module.inv_freq = inv
                module.original_inv_freq = inv


def one_seed(args, seed: int) -> dict:
    import torch

    from miniverl.common.recipe import load_recipe
    from miniverl.common.recipe_sections import LossConfig, TrainConfig
    from miniverl.student.environments import make_tasks
    from miniverl.student.rollout.oracle import oracle_trajectories
    from miniverl.student.train.objectives.objective import next_tokens
    from miniverl.student.train.policy import load_policy
    from miniverl.student.train.updates import hidden_at_positions, sft_step

    torch.manual_seed(0)
    recipe = load_recipe(RECIPE)
    policy = load_policy(recipe)
    reshape(policy.model, args.init_std, args.rope_theta)
    env = recipe.environment
    tok = policy.tokenizer

    def traces(split: str, n: int):
        tasks = make_tasks(env.name, split, n, env.difficulty, env.split_seed, params=env.params)
        return oracle_trajectories(env.name, tasks, tok, policy.tokenizer_fp, env.params)

    train, held = traces("train", env.train_tasks), traces("eval", 64)
    digits = tok.convert_tokens_to_ids(list("0123456789"))
    held_pos = []
    for t in held:
        pos = t.target_positions()
        held_pos.append(pos[np.isin(np.asarray(t.tokens)[pos + 1], digits)])
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    order = np.random.default_rng(seed).permutation(len(train))
    curve, first_90, first_98 = [], None, None
    t0 = time.perf_counter()
    for step in range(1, args.max_steps + 1):
        batch = [train[order[(step * args.batch + i) % len(train)]] for i in range(args.batch)]
        sft_step(policy, opt, sched, batch, loss=LossConfig(chunk_size=1024),
                 train=TrainConfig(grad_accum=1, max_grad_norm=args.clip))
        if step % args.every:
            continue
        with torch.no_grad():
            logits = policy.lm_head(hidden_at_positions(policy, held, held_pos))
            acc = float((logits.argmax(-1).numpy() == next_tokens(held, held_pos)).mean())
        curve.append([step, round(acc, 4)])
        first_90 = first_90 or (step if acc >= 0.9 else None)
        if acc >= 0.98:
            first_98 = step
            break
    return {"seed": seed, "first_step_090": first_90, "first_step_098": first_98,
            "wall_s": round(time.perf_counter() - t0, 1), "digit_accuracy": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--clip", type=float, default=0.05, help="max_grad_norm")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=16, help="Traces per step.")
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--every", type=int, default=25, help="Steps between measurements.")
    parser.add_argument("--init-std", type=float, default=None,
                        help="Re-draw weight matrices from N(0, S^2) (toy default 0.02).")
    parser.add_argument("--rope-theta", type=float, default=None,
                        help="Rotary base (toy default 10000).")
    add_output_options(parser, ROOT / "benchmarks" / "results" / "copy_plateau.json")
    args = parser.parse_args()
    args.out = script_output_file(args, ROOT / "benchmarks" / "results" / "copy_plateau.json", ROOT)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    runs = []
    for seed in args.seeds:
        run = one_seed(args, seed)
        runs.append(run)
        print(f"seed {seed}: >= 0.9 at step {run['first_step_090']}, >= 0.98 at step "
              f"{run['first_step_098']} ({run['wall_s']} s)", flush=True)
    report = {"benchmark": "copy_plateau", "recipe": str(RECIPE.relative_to(ROOT)),
              "config": {k: v for k, v in vars(args).items() if k != "out"},
              "loadavg_1m": round(os.getloadavg()[0], 2), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
