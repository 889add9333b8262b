"""The student process's entry points, shared by ``miniverl train`` and
``python -m miniverl.student``: load a recipe, build a :class:`Trainer`, run it, print a
summary. Also ``eval_run`` for ``miniverl eval``.

This module parses nothing from the command line; the CLI does that (and imports this
module inside its command bodies, so ``miniverl --help`` never loads torch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import load_recipe
from miniverl.common.rundir import RunDir
from miniverl.common.teacher_routes import teacher_flags
from miniverl.student.checkpoint import latest as latest_checkpoint
from miniverl.student.checkpoint import load as load_checkpoint
from miniverl.student.control import ControlServer
from miniverl.student.eval import evaluate
from miniverl.student.report.summary import fmt_by_teacher
from miniverl.student.trackers import with_loggers
from miniverl.student.train.policy import load_policy
from miniverl.student.train.trainer import Trainer


def train_from_file(
    recipe_path: str | Path,
    *,
    teacher: str | list[str] | None = None,
    run_id: str | None = None,
    resume: bool = False,
    offline: bool = False,
    output_dir: str | None = None,
    show_progress: bool = True,
    stop_event: Any = None,
    control: bool = False,
    teacher_curve: tuple[str, str] | None = None,
    teacher_admin_token: str | None = None,
    loggers: list[str] | None = None,
):
    """Run the recipe at ``recipe_path``; returns the :class:`TrainResult`.

    ``teacher`` is an endpoint, or ``--teacher`` values (``NAME=ENDPOINT`` for each of
    several teachers, docs/several-teachers.md); ``teacher_curve`` (secret key file,
    server public key file) and
    ``teacher_admin_token`` (a token file) say how to reach and steer the teacher;
    ``loggers`` adds experiment trackers to ``run.loggers`` (``--logger``).
    """
    recipe = load_recipe(recipe_path)
    if output_dir is not None:
        recipe = recipe.model_copy(
            update={"run": recipe.run.model_copy(update={"output_dir": output_dir})}
        )
    recipe = with_loggers(recipe, loggers)
    text = Path(recipe_path).read_text(encoding="utf-8")
    endpoint, endpoints = teacher_flags(teacher)
    with Trainer(
        recipe, teacher_endpoint=endpoint, teacher_endpoints=endpoints or None, run_id=run_id,
        resume=resume, offline=offline,
        recipe_text=text, show_progress=show_progress, stop_event=stop_event,
        teacher_curve=teacher_curve, teacher_admin_token=teacher_admin_token,
    ) as trainer:
        if control:
            with ControlServer(trainer):
                return trainer.train()
        return trainer.train()


def graceful_stop():
    """SIGINT/SIGTERM handlers for a training process; returns the stop event they set.

    The first signal asks the loop to finish its current update, checkpoint and stop
    (exit 130). A second one interrupts at once; no checkpoint is written then, and the
    last one (written atomically) stays valid for ``--resume``.
    """
    import signal
    import sys
    import threading

    stop = threading.Event()

    def request_stop(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print("stopping at the next update boundary, at once if waiting on the teacher "
              "(checkpoint first); again to abort", file=sys.stderr)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop


def summary_lines(result) -> list[str]:
    """Human lines describing a finished run."""
    before = (result.eval_before or {}).get("success")
    after = (result.eval or {}).get("success")
    lines = [
        f"run          {result.run_dir}  ({result.status})",
        f"updates      {result.steps} optimizer steps, parameter version {result.final_version}",
        f"wall clock   {result.wall_s:.1f} s",
    ]
    if after is not None:
        start = f"{before:.0%} -> " if before is not None else ""
        lines.append(f"success      {start}{after:.0%} on the {result.eval['split']} split")
    if result.counters:
        c = result.counters
        lines.append(
            f"teacher      {c.get('received', 0)} replies, {c.get('bytes_received', 0):,} bytes "
            f"received, {c.get('stale_dropped', 0)} stale replies dropped"
        )
        # Several teachers (docs/several-teachers.md): each one's share.
        lines += [f"  {line}" for line in fmt_by_teacher(c.get("by_teacher") or {})]
    for name, env in ((result.eval or {}).get("by_environment") or {}).items():
        calls = (f", {float(env['tool_calls']):.2f} tool calls an episode"
                 if "tool_calls" in env else "")
        lines.append(f"  {name} {float(env['success']):.0%} on its {env.get('n')} tasks{calls}")
    lines.append(f"report       {Path(result.run_dir) / 'report.html'}")
    return lines


def eval_run(run_path: str | Path, *, split: str | None = None,
             checkpoint: str | None = None) -> dict[str, Any]:
    """Evaluate a run's latest (or a named) checkpoint on a split; returns the summary."""
    run = RunDir.open(run_path)
    run.verify()  # sealed manifest and trajectories: refuse a tampered run up front
    recipe = run.recipe()
    ckpt = Path(checkpoint) if checkpoint else latest_checkpoint(run.checkpoints_dir)
    if ckpt is None or not Path(ckpt).is_dir():
        raise ConfigError(
            f"run {run.id} has no checkpoint {checkpoint or ''}; train it first or pass "
            "--checkpoint DIR"
        )
    policy = load_policy(recipe)
    state = load_checkpoint(Path(ckpt), policy.model, None, None)
    policy.model.eval()
    with torch.no_grad():
        summary = evaluate(policy.model, policy.tokenizer, recipe, split=split,
                           policy_version=state.version, out_dir=run.eval_dir,
                           tokenizer_fp=policy.tokenizer_fp)
    return summary.to_dict()


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))
