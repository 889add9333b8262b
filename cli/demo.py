"""``miniverl demo``: the whole system on a laptop CPU, no network, no GPU.

It writes two short recipes into the output folder (so they can be read and rerun),
gives the toy teacher a short SFT on oracle trajectories (cached after the first run),
then runs ``miniverl up`` with strict on-policy distillation on a short budget and
prints what happened and where the artifacts are. The budget shows the machinery, not
learning: a toy model needs a few hundred SFT steps before it can copy digits at all
(docs/toy-learning.md), more than 30 seconds allow; ``recipes/toy_cpu_opd.yaml`` is
the recipe that learns.

The demo recipes live here as data, not in ``recipes/``, because an installed wheel
has no ``recipes/`` folder. This module starts processes; it trains nothing itself.
"""

from __future__ import annotations

# Imports inside functions are deliberate: `miniverl --help` stays fast and torch-free.
import time
from pathlib import Path
from typing import Any

import yaml

STUDENT = {"toy": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128,
                   "seed": 0}}
TEACHER = {"toy": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128,
                   "seed": 1}}
ENVIRONMENT = {"name": "calculator", "params": {"units": False}, "difficulty": "easy",
               "train_tasks": 256, "eval_tasks": 8, "test_tasks": 8, "split_seed": 0}
# A tool call is 67 byte-level tokens; an easy episode about 270.
ROLLOUT = {"max_turns": 2, "max_new_tokens_per_turn": 72, "max_total_tokens": 360,
           "temperature": 1.0, "top_p": 1.0, "batch_size": 8}

TEACHER_PREP = {
    "schema_version": 1,
    "run": {"name": "demo-teacher", "mode": "sft", "seed": 0},
    "student": {"model": TEACHER, "dtype": "float32", "device": "cpu", "lora": None},
    "environment": ENVIRONMENT,
    "rollout": ROLLOUT,
    "train": {"cycles": 12, "rollouts_per_cycle": 8, "lr": 3.0e-3, "schedule": "constant",
              "warmup_steps": 4, "eval_every": 0, "save_every": 0},
    "runtime": {"cpu_threads": 1},
}

DEMO = {
    "schema_version": 1,
    "run": {"name": "demo", "mode": "opd", "seed": 0},
    "student": {"model": STUDENT, "dtype": "float32", "device": "cpu", "lora": None},
    "teacher": {"model": TEACHER, "dtype": "float32", "device": "cpu",
                "prepare": "demo_teacher_sft.yaml", "memory": "resident"},
    "environment": ENVIRONMENT,
    "rollout": ROLLOUT,
    "loss": {"objective": "bucketed_topk_tail", "divergence": "forward_kl", "top_k": 16},
    "train": {"cycles": 8, "rollouts_per_cycle": 8, "sft_warmup_steps": 0, "lr": 3.0e-3,
              "max_grad_norm": 0.05, "eval_every": 0, "save_every": 0, "pipelining": True},
    "runtime": {"cpu_threads": 1, "heartbeat_ms": 1000, "unavailable_timeout_s": 120},
}


def write_recipes(folder: Path) -> Path:
    """Write the demo's two recipes; returns the path of the one `up` runs."""
    folder.mkdir(parents=True, exist_ok=True)
    head = "# Written by `miniverl demo`; rerun with: miniverl up {}\n"
    (folder / "demo_teacher_sft.yaml").write_text(
        "# Teacher preparation for the demo (run by `up` through teacher.prepare).\n"
        + yaml.safe_dump(TEACHER_PREP, sort_keys=False)
    )
    main = folder / "demo.yaml"
    main.write_text(head.format(main) + yaml.safe_dump(DEMO, sort_keys=False))
    return main


def run_summary(run_dir: Path) -> dict[str, Any]:
    """The facts the demo prints, read back from the run directory (torch-free)."""
    from miniverl.student.report.load import load_run

    data = load_run(run_dir)
    before, after = data.success_before_after()
    trainable = sum(n for span, n in data.tokens_by_span.items() if span.startswith("assistant"))
    context = sum(data.tokens_by_span.values()) - trainable
    last = data.metrics[-1] if data.metrics else {}
    teacher = last.get("teacher") or {}
    scored = sum(int(row.get("positions_scored") or 0) for row in data.metrics)
    return {
        "mode": data.mode,
        "on_policy": data.on_policy,
        "steps": data.steps,
        "version": data.versions[1],
        "success_before": before,
        "success_after": after,
        "tokens_trainable": trainable,
        "tokens_context": context,
        "positions_scored": scored,
        "bytes_received": last.get("bytes_received"),
        "bytes_sent": last.get("bytes_sent"),
        "stale_dropped": last.get("stale_dropped", 0),
        "teacher": teacher,
        "status": data.status.get("status"),
    }


def demo(output: Path, *, console=None) -> tuple[int, Path, dict[str, Any], float]:
    """Run the demo; returns ``(exit code, run dir, summary, wall seconds)``."""
    from miniverl.cli.supervisor import Supervisor

    t0 = time.perf_counter()
    recipe = write_recipes(output / "recipes")
    sup = Supervisor(recipe, output_dir=str(output / "runs"), console=console, echo=False)
    code = sup.run_all()
    wall = time.perf_counter() - t0
    return code, sup.run.path, run_summary(sup.run.path), wall


def summary_lines(run_dir: Path, s: dict[str, Any], wall: float) -> list[str]:
    def pct(row: dict | None) -> str:
        return f"{row['success']:.0%}" if row else "n/a"

    teacher = s["teacher"]
    return [
        f"mode            {s['mode']}; on-policy: {s['on_policy']}",
        f"updates         {s['steps']} optimizer steps, parameter version {s['version']}",
        f"wall clock      {wall:.1f} s (both processes, teacher preparation included)",
        f"tokens          {s['tokens_trainable']:,} trainable (sampled by the student), "
        f"{s['tokens_context']:,} context (prompts, tool results)",
        f"teacher         {teacher.get('name')} (instance {str(teacher.get('instance'))[:8]}, "
        f"gen {teacher.get('gen')}): {s['positions_scored']:,} positions scored, "
        f"{(s['bytes_received'] or 0):,} bytes received",
        f"stale replies   {s['stale_dropped']} dropped (never trained on)",
        f"success         {pct(s['success_before'])} -> {pct(s['success_after'])} "
        "(greedy, held-out eval split)",
        f"artifacts       {run_dir}",
        f"next            open {run_dir / 'report.html'}; miniverl inspect "
        f"{run_dir / 'trajectories.jsonl'}; miniverl up recipes/toy_cpu_opd.yaml",
    ]
