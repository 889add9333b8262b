"""Seconds per on-policy update: our strict OPD against TRL's ``GKDTrainer``, measured in one run.

    python benchmarks/update_vs_trl.py [--reps 3] [--updates 4] [--batch 8]
        [--max-new-tokens 32] [--update-committed]

The peer a user compares us to first is TRL's ``GKDTrainer`` (TRL 1.16, in the venv
``tests/teacher_server/setup_trl_venv.sh`` builds: ``bash
tests/teacher_server/setup_trl_venv.sh``), which samples, scores and steps in one
process. Both arms take the same on-policy update:

- the same toy student (the student of ``recipes/toy_cpu_opd.yaml``: 64 wide, 2 layers,
  seed 0, full fine-tune, float32) and the same teacher weights (a random-init toy
  teacher 256 wide, 4 layers, seed 1), both loaded from the same cached directories;
- the same single-turn calculator prompts (``units: false``, difficulty ``easy``, the
  toy chat template with the tool block; rendered by the same
  :class:`~miniverl.student.rollout.chat.EpisodeBuilder`), ``--batch`` prompts per
  update, at most ``--max-new-tokens`` sampled tokens each at temperature 1.0, top-p 1.0,
  no top-k, a turn ending at ``<|im_end|>`` or ``<|endoftext|>`` in both;
- the exact full-vocabulary reverse KL, KL(student || teacher), on every sampled token:
  ours ``loss.objective: exact_full_vocab, divergence: reverse_kl``, TRL's ``lmbda: 1``
  (every step samples on-policy) and ``beta: 1`` (its generalized JSD at 1 is that KL);
- one AdamW step per update at the same learning rate (1e-3, constant), gradient norm
  clipped at 1.0;
- the same total CPU threads, two: ours runs as under ``miniverl up`` on a small machine,
  the student (this process, the public ``Trainer``) and the teacher (a
  ``python -m miniverl.teacher_server`` child over ``ipc://``) one thread each; TRL runs
  in one process with two threads.

``GKDConfig`` turns gradient checkpointing on by default, and ``GKDTrainer`` then
generates without a KV cache (``use_cache: False``); a second TRL arm turns it off. A
third runs TRL with one thread (half of ours), because two threads in one process are
what a small machine shared with other jobs punishes most (``docs/up.md``, "Threads"). Each
repetition runs every arm once, ``--updates + 1`` updates each, the first arm rotating
between repetitions so that drift in the machine's load hits all alike; the first update
of a run is dropped as warm-up. An update's seconds are, for
ours, the gap between consecutive ``metrics.jsonl`` rows (sampling, waiting for the
teacher, loss and step, logging), split by the row's own ``time_rollout_s``,
``time_teacher_wait_s`` and ``time_update_s`` (the rest, ``other``: logging, writing
trajectories); for TRL, its ``training_step`` from a
callback's step begin to step end, split into ``generate`` (timed around
``generate_on_policy_outputs``), the teacher's forward (timed by hooks on the teacher)
and the rest (the student's forward, the loss, backward and the optimizer step). Before
training, the worker also times ``generate`` alone on one batch of the same prompts with
GKD's own generation config (``plain_generate_s``, median of 3), to tell the sampling
itself from what the trainer's generation path adds.
Sampled tokens per update are recorded for both arms (a random student ends some turns
early). One setting of TRL's is changed: ``Trainer`` normalises a step's loss by the
label tokens of the collated batch (``num_items_in_batch``), which under ``lmbda: 1``
are not the tokens the step trains on (prompts alone carry none: the count is 0 and the
first gradient NaN), so the worker sets ``model_accepts_loss_kwargs = False`` and GKD's
loss is its mean over the sampled tokens, as ours is. Prints a table and writes ``update_vs_trl.json`` in ``--output-dir`` (default
``runs/benchmarks/update_vs_trl/``; the committed ``benchmarks/results/update_vs_trl.json``
with ``--update-committed``).

The prompts are drawn from the same training split, not the same prompts in the same
order: our trainer draws each cycle's tasks itself (seeded), TRL's dataloader takes the
first prompts of that split in order; every calculator prompt of a difficulty has nearly
the same length (the record holds both arms' mean prompt tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "update_vs_trl.json"
RECIPE = ROOT / "recipes" / "toy_cpu_opd.yaml"
VENV = Path(os.environ.get("MINIVERL_TRL_VENV", Path.home() / ".cache/miniverl/trl-1.16.0-venv"))
TEACHER = {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate": 512, "seed": 1}
LR = 1e-3
MAX_GRAD_NORM = 1.0
THREADS_TOTAL = 2
WORKER_MARKER = "TRL_GKD "
# arm -> (threads, gradient checkpointing). TRL as a user gets it: the same two threads as
# ours and GKDConfig's defaults (gradient checkpointing on, which also turns the KV cache
# off in its generate); with checkpointing off; and with one thread (what two threads in
# one process cost on a small shared machine).
TRL_ARMS = {"trl_gkd": (THREADS_TOTAL, True), "trl_gkd_no_checkpointing": (THREADS_TOTAL, False),
            "trl_gkd_1thread": (1, True)}


def _args(argv: list[str] | None) -> argparse.Namespace:
    from miniverl.student.benchmark.outputs import add_output_options, script_output_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="Runs per arm, alternating.")
    parser.add_argument("--updates", type=int, default=4, help="Measured updates per run.")
    parser.add_argument("--batch", type=int, default=8, help="Prompts per update.")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="Sampled tokens at most.")
    parser.add_argument("--trl-python", type=Path, default=VENV / "bin" / "python",
                        help="The python of a venv holding trl 1.16.0.")
    add_output_options(parser, RESULTS)
    args = parser.parse_args(argv)
    for name, least in (("reps", 1), ("updates", 1), ("batch", 1), ("max_new_tokens", 1)):
        if getattr(args, name) < least:
            flag = "--" + name.replace("_", "-")
            parser.exit(1, f"error: {flag} {getattr(args, name)} must be at least {least}; "
                        f"pass {flag} {least} or more\n")
    if not args.trl_python.is_file():
        parser.exit(1, f"error: --trl-python {args.trl_python} does not exist; build the TRL "
                    "venv with: bash tests/teacher_server/setup_trl_venv.sh\n")
    args.out = script_output_file(args, RESULTS, ROOT)
    return args


# -- the shared setup -------------------------------------------------------------------

def build_recipe(args: argparse.Namespace, output_dir: Path) -> Any:
    """``recipes/toy_cpu_opd.yaml`` as one timed strict-OPD run: single turn, exact reverse KL."""
    from miniverl.common.recipe import Recipe, load_recipe, recipe_dict

    data = recipe_dict(load_recipe(RECIPE))
    data["run"].update(output_dir=str(output_dir), name="update-vs-trl", deterministic=False)
    data["teacher"]["model"] = {"toy": dict(TEACHER)}
    data["teacher"].update(prepare=None, min_success=None, memory="resident")
    data["environment"].update(eval_tasks=1, test_tasks=1)
    data["rollout"].update(max_turns=1, max_new_tokens_per_turn=args.max_new_tokens,
                           batch_size=args.batch, temperature=1.0, top_p=1.0)
    data["loss"].update(objective="exact_full_vocab", divergence="reverse_kl", positions="all")
    data["train"].update(
        cycles=args.updates + 1, rollouts_per_cycle=args.batch, updates_per_batch=1, lr=LR,
        schedule="constant", warmup_steps=0, max_grad_norm=MAX_GRAD_NORM, eval_every=0,
        save_every=0, sft_warmup_steps=0, sft_warmup_lr=None, sft_warmup_until_loss=None,
        pipelining=True,
    )
    data["eval"] = {"split": "eval", "greedy": True, "max_tasks": 1, "before": False}
    data["runtime"].update(cpu_threads=1)
    data["cache"] = {"enabled": False}
    return Recipe.model_validate(data)


def prompt_tokens(tokenizer: Any, environment: dict, count: int) -> list[list[int]]:
    """The first ``count`` training prompts, rendered as our runner renders them."""
    from miniverl.student.environments import get_environment, make_tasks
    from miniverl.student.rollout.chat import EpisodeBuilder
    from miniverl.student.rollout.privileged import episode_system

    tasks = make_tasks(environment["name"], "train", count, environment["difficulty"],
                       environment["split_seed"], params=environment["params"])
    out = []
    for task in tasks:
        env = get_environment(environment["name"], **environment["params"])
        env.reset(task)
        builder = EpisodeBuilder(tokenizer, episode_system(env, task, False), task.prompt,
                                 env.tool_specs())
        out.append(list(builder.tokens))
    return out


# -- our arm ----------------------------------------------------------------------------

def launch_teacher(model_dir: Path, endpoint: str, folder: Path, timeout_s: float) -> Any:
    from miniverl.student.teacher_process import start_teacher

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    argv = ["--model", str(model_dir), "--threads", "1", "--device", "cpu",
            "--dtype", "float32", "--log", str(folder / "teacher.log")]
    return start_teacher(argv, endpoint=endpoint, log=folder / "teacher.out",
                         timeout_s=timeout_s, env=env)


def ours_run(recipe: Any, endpoint: str) -> dict[str, list[float]]:
    """One strict-OPD run through the public Trainer; per-update seconds and split."""
    from miniverl.student.train.trainer import Trainer

    with Trainer(recipe, teacher_endpoint=endpoint, show_progress=False, write_report=False,
                 checkpoints=False) as trainer:
        result = trainer.train()
    rows = [json.loads(line) for line in
            (result.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trajs = [json.loads(line) for line in
             (result.run_dir / "trajectories.jsonl").read_text().splitlines() if line.strip()]
    shutil.rmtree(result.run_dir, ignore_errors=True)
    kept = rows[1:]  # the first update is the warm-up
    update_s = [b["wall_s"] - a["wall_s"] for a, b in zip(rows, rows[1:], strict=False)]
    return {
        "update_s": update_s,
        "sampling_s": [r["time_rollout_s"] for r in kept],
        "teacher_wait_s": [r["time_teacher_wait_s"] for r in kept],
        "loss_and_step_s": [r["time_update_s"] for r in kept],
        # positions: all trains every sampled token, so positions are the sampled tokens.
        "sampled_tokens": [r["positions"] for r in kept],
        "loss": [r["loss"] for r in kept],
        # Logging, writing trajectories, the early forward's bookkeeping: the rest.
        "other_s": [u - r["time_rollout_s"] - r["time_teacher_wait_s"] - r["time_update_s"]
                    for u, r in zip(update_s, kept, strict=True)],
        "prompt_tokens_mean": statistics.mean(
            next(s["start"] for s in t["spans"] if s["type"].startswith("assistant")) for t in trajs),
    }


# -- TRL's arm (runs in the TRL venv) ---------------------------------------------------

def trl_worker(argv: list[str]) -> int:
    """``--trl-worker STUDENT_DIR TEACHER_DIR STEPS BATCH MAX_NEW ENV_JSON OUT_DIR THREADS``:
    GKD steps."""
    student_dir, teacher_dir, steps, batch, max_new, env_json, out_dir, threads, ckpt = argv
    steps, batch, max_new = int(steps), int(batch), int(max_new)
    import torch

    torch.set_num_threads(int(threads))
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from miniverl.student.rollout.chat import stop_token_ids

    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    student = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
    # A turn ends where ours ends one: <|im_end|> or <|endoftext|>.
    student.generation_config.eos_token_id = stop_token_ids(tokenizer)
    prompts = prompt_tokens(tokenizer, json.loads(env_json), steps * batch)
    pad = tokenizer.pad_token_id

    def collate(examples: list[dict]) -> dict[str, torch.Tensor]:
        ids = [e["prompt_ids"] for e in examples]
        width = max(len(p) for p in ids)
        ids_B_L = torch.full((len(ids), width), pad, dtype=torch.long)
        mask_B_L = torch.zeros((len(ids), width), dtype=torch.long)
        for b, p in enumerate(ids):
            ids_B_L[b, width - len(p):] = torch.tensor(p)
            mask_B_L[b, width - len(p):] = 1
        # lmbda 1: every step replaces input_ids/labels with the student's own sample.
        return {"prompts": ids_B_L, "prompt_attention_mask": mask_B_L, "input_ids": ids_B_L,
                "attention_mask": mask_B_L, "labels": torch.full_like(ids_B_L, -100)}

    timing: dict[str, list[float]] = {"update_s": [], "sampling_s": [], "teacher_s": [],
                                      "sampled_tokens": []}
    current = {"gen": 0.0, "teacher": 0.0, "tokens": 0}
    original = GKDTrainer.generate_on_policy_outputs

    def timed_generate(model, inputs, generation_config):
        t0 = time.perf_counter()
        ids, mask, labels = original(model, inputs, generation_config)
        current["gen"] += time.perf_counter() - t0
        current["tokens"] += int((labels != -100).sum())
        return ids, mask, labels

    GKDTrainer.generate_on_policy_outputs = staticmethod(timed_generate)
    started: dict[str, float] = {}
    teacher.register_forward_pre_hook(lambda *_: started.__setitem__("t", time.perf_counter()))
    teacher.register_forward_hook(
        lambda *_: current.__setitem__("teacher", current["teacher"] + time.perf_counter() - started["t"]))

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            current.update(gen=0.0, teacher=0.0, tokens=0, t0=time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            timing["update_s"].append(time.perf_counter() - current["t0"])
            timing["sampling_s"].append(current["gen"])
            timing["teacher_s"].append(current["teacher"])
            timing["sampled_tokens"].append(current["tokens"])

    config = GKDConfig(
        output_dir=out_dir, lmbda=1.0, beta=1.0, temperature=1.0, max_new_tokens=max_new,
        per_device_train_batch_size=batch, max_steps=steps, learning_rate=LR,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=MAX_GRAD_NORM,
        gradient_checkpointing=ckpt == "1",
        weight_decay=0.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        seed=0, dataloader_num_workers=0, disable_dropout=True, max_length=None)
    trainer = GKDTrainer(
        model=student, teacher_model=teacher, args=config, data_collator=collate,
        train_dataset=Dataset.from_dict({"prompt_ids": prompts}), processing_class=tokenizer,
        callbacks=[StepClock()])
    # Trainer counts the collated labels to normalise the loss (num_items_in_batch); with
    # lmbda 1 those are not the tokens the step trains on (the prompts here carry none, so
    # the count is 0 and the first gradient NaN). Without the count, GKD's loss is its
    # mean over the sampled tokens, as ours is.
    trainer.model_accepts_loss_kwargs = False
    # The same generation outside the trainer: one batch's prompts, GKD's own generation
    # config, the model in eval mode under no_grad (how much of "sampling" is generate).
    first = collate([{"prompt_ids": p} for p in prompts[:batch]])
    plain = []
    for _ in range(3):
        t0 = time.perf_counter()
        with torch.no_grad():
            student.generate(input_ids=first["prompts"], attention_mask=first["prompt_attention_mask"],
                             generation_config=trainer.generation_config)
        plain.append(time.perf_counter() - t0)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print(WORKER_MARKER + json.dumps({
        "trl_version": trl.__version__, "global_step": trainer.state.global_step,
        "threads": torch.get_num_threads(), "loss": losses, **timing,
        "plain_generate_s": statistics.median(plain),
        "gradient_checkpointing": bool(config.gradient_checkpointing),
        "generate_use_cache": bool(trainer.generation_config.use_cache),
        "prompt_tokens_mean": statistics.mean(len(p) for p in prompts)}), flush=True)
    return 0


def trl_run(args: argparse.Namespace, dirs: dict[str, Path], environment: dict,
            folder: Path, threads: int = THREADS_TOTAL,
            checkpointing: bool = True) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [str(args.trl_python), str(Path(__file__).resolve()), "--trl-worker",
         str(dirs["student"]), str(dirs["teacher"]), str(args.updates + 1), str(args.batch),
         str(args.max_new_tokens), json.dumps(environment), str(folder / "trl-out"),
         str(threads), "1" if checkpointing else "0"],
        capture_output=True, text=True, env=env, timeout=1800)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(WORKER_MARKER)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"error: TRL's GKDTrainer run failed (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    out = json.loads(lines[-1][len(WORKER_MARKER):])
    kept = {k: out[k][1:] for k in ("update_s", "sampling_s", "teacher_s", "sampled_tokens")}
    kept["rest_s"] = [u - g - t for u, g, t in
                      zip(kept["update_s"], kept["sampling_s"], kept["teacher_s"], strict=True)]
    return {**kept, "loss": out["loss"][1:], "trl_version": out["trl_version"],
            "plain_generate_s": [out["plain_generate_s"]],
            "gradient_checkpointing": out["gradient_checkpointing"],
            "generate_use_cache": out["generate_use_cache"],
            "threads": out["threads"], "prompt_tokens_mean": out["prompt_tokens_mean"]}


# -- the comparison ---------------------------------------------------------------------

def _median(runs: list[dict], name: str) -> float:
    return round(statistics.median(x for run in runs for x in run[name]), 4)


def summarise(arms: dict[str, list[dict]]) -> dict[str, Any]:
    ours = arms["ours"]
    o = {name: _median(ours, name) for name in
         ("update_s", "sampling_s", "teacher_wait_s", "loss_and_step_s", "other_s",
          "sampled_tokens")}
    out: dict[str, Any] = {"ours": o}
    for arm in TRL_ARMS:
        t = {name: _median(arms[arm], name) for name in
             ("update_s", "sampling_s", "teacher_s", "rest_s", "sampled_tokens",
              "plain_generate_s")}
        out[arm] = t
        out[f"ratio_ours_over_{arm}"] = round(o["update_s"] / t["update_s"], 3)
        out[f"{arm}_update_s_all"] = [round(x, 4) for run in arms[arm] for x in run["update_s"]]
        out[f"{arm}_ms_per_sampled_token"] = round(1000 * t["update_s"] / t["sampled_tokens"], 3)
    out["ours_update_s_all"] = [round(x, 4) for run in ours for x in run["update_s"]]
    out["ours_ms_per_sampled_token"] = round(1000 * o["update_s"] / o["sampled_tokens"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--trl-worker"]:
        return trl_worker(sys.argv[2:])
    args = _args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from miniverl.common.toy import toy_model_dir
    from miniverl.student.teacher_process import stop_teacher

    tmp = Path(tempfile.mkdtemp(prefix="update-vs-trl-"))
    recipe = build_recipe(args, tmp / "runs")
    dirs = {"student": toy_model_dir(recipe.student.model.toy),
            "teacher": toy_model_dir(recipe.teacher.model.toy)}
    env_cfg = recipe.environment
    environment = {"name": env_cfg.name, "difficulty": env_cfg.difficulty,
                   "split_seed": env_cfg.split_seed, "params": env_cfg.params}
    endpoint = f"ipc://{tmp}/teacher.sock"
    proc = launch_teacher(dirs["teacher"], endpoint, tmp, recipe.runtime.teacher_startup_timeout_s)
    arms: dict[str, list[dict]] = {"ours": [], **{arm: [] for arm in TRL_ARMS}}
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    try:
        with Progress("{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=Console(stderr=True)) as progress:
            names = list(arms)
            bar = progress.add_task("runs: ours and GKDTrainer, taking turns",
                                    total=len(names) * args.reps)
            for rep in range(args.reps):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for arm in order:
                    run = (ours_run(recipe, endpoint) if arm == "ours"
                           else trl_run(args, dirs, environment, tmp, threads=TRL_ARMS[arm][0],
                                        checkpointing=TRL_ARMS[arm][1]))
                    arms[arm].append(run)
                    progress.console.print(f"rep {rep + 1}/{args.reps} {arm:8s} update s "
                                           + " ".join(f"{x:.2f}" for x in run["update_s"]))
                    progress.advance(bar)
    finally:
        stop_teacher(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    summary = summarise(arms)
    record = {
        "benchmark": "update_vs_trl",
        **summary,
        "runs": arms,
        "config": {
            "recipe": str(RECIPE.relative_to(ROOT)), "reps": args.reps, "updates": args.updates,
            "batch": args.batch, "max_new_tokens": args.max_new_tokens, "lr": LR,
            "max_grad_norm": MAX_GRAD_NORM, "temperature": 1.0, "top_p": 1.0,
            "objective": "exact reverse KL, KL(student || teacher), every sampled token",
            "trl": {"trainer": "GKDTrainer", "lmbda": 1.0, "beta": 1.0,
                    "threads": {arm: t for arm, (t, _) in TRL_ARMS.items()},
                    "gradient_checkpointing": {arm: c for arm, (_, c) in TRL_ARMS.items()},
                    "version": arms["trl_gkd"][0]["trl_version"]},
            "ours": {"mode": "opd", "objective": "exact_full_vocab", "divergence": "reverse_kl",
                     "threads": {"student": 1, "teacher": 1}, "transport": "ipc",
                     "pipelining": True},
            "student": recipe.student.model.toy.model_dump(), "teacher": dict(TEACHER),
            "environment": environment,
        },
        "machine": {
            "cpu_count": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "torch": torch.__version__,
        },
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    o = summary["ours"]
    table = Table(title=f"seconds per on-policy update, medians over {args.reps} x "
                        f"{args.updates} updates per arm")
    for col in ("arm", "threads", "update", "sampling", "teacher", "loss + step", "other",
                "sampled tokens"):
        table.add_column(col, justify="right")
    table.add_row("ours (strict OPD)", "1 + 1", f"{o['update_s']:.3f}", f"{o['sampling_s']:.3f}",
                  f"{o['teacher_wait_s']:.3f} (wait)", f"{o['loss_and_step_s']:.3f}",
                  f"{o['other_s']:.3f}", f"{o['sampled_tokens']:.0f}")
    for arm, (threads, ckpt) in TRL_ARMS.items():
        t = summary[arm]
        table.add_row(f"TRL GKDTrainer{'' if ckpt else ', no checkpointing'}", str(threads),
                      f"{t['update_s']:.3f}",
                      f"{t['sampling_s']:.3f}", f"{t['teacher_s']:.3f} (forward)",
                      f"{t['rest_s']:.3f}", "", f"{t['sampled_tokens']:.0f}")
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    for arm, (threads, ckpt) in TRL_ARMS.items():
        console.print(f"ours / GKDTrainer ({threads} thread{'s' if threads > 1 else ''}"
                      f"{'' if ckpt else ', no gradient checkpointing'}) per update: "
                      f"{summary[f'ratio_ours_over_{arm}']:.2f}x")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
