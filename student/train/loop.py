"""The training loop: rollout -> score -> update -> log -> checkpoint, over a TrainState.

:func:`run` is one run, top to bottom: evaluate, say HELLO to the teacher (its
handshake and competence gate end while the warm-up runs, or before it for a teacher
that is already up), the SFT warm-up (``train.sft_warmup_steps``, cold start), connect
the teacher, then cycles until the recipe's count, a stop request or the wall budget.
A teacher failure between updates (a refused teacher, one that is gone) checkpoints
the run before it fails, so no training is lost to it. Each cycle is one call of the
mode's ``cycle`` (rollout, score, update: ``v -> v + 1`` per optimizer step), which
returns what it did; this module logs it (``state.log_cycle``: one metrics row),
evaluates and checkpoints on the recipe's schedule. The recipe's ``run.mode`` picks the mode's object from :data:`MODES`
(``modes/``, one class each); the modes are peers (none imports another; the steps they
share are in ``steps.py``) and each object holds the state that belongs to it alone:

- ``sft``: oracle trajectories, cross-entropy on the model's own spans, no teacher.
- ``offline_kd``: a fixed trajectory set scored once, cached targets reused by every
  version. Off-policy by construction, and reported as such.
- ``opd`` (strict on-policy): fresh rollouts of version ``v``, targets tagged ``v``,
  exactly one optimizer step.
- ``replay``: fresh rollouts join a buffer; each update trains on buffered rollouts at
  most ``max_lag`` versions old. Off-policy, labelled as such.
- ``dpo``: preference pairs from grouped rollouts, the teacher as reference scorer.
- ``rl``: fresh rollouts of version ``v``, one policy-gradient step on the task reward
  alone (the verifier's score, a group baseline); no teacher.

This module does not open the run directory or handle failures (``trainer.py``), and
does not know how a mode samples, scores or updates (``modes/``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from miniverl.common.manifest import finish_manifest
from miniverl.protocol.scoring_client import StopRequested
from miniverl.student.eval import EvalSummary, evaluate
from miniverl.student.progress import TrainProgress
from miniverl.student.train.modes.dpo import DpoMode
from miniverl.student.train.modes.offline_kd import OfflineKdMode
from miniverl.student.train.modes.opd import OpdMode
from miniverl.student.train.modes.replay import ReplayMode
from miniverl.student.train.modes.rl import RlMode
from miniverl.student.train.modes.sft import (
    OracleBatches,
    SftMode,
    end_warmup,
    warmup_converged,
    warmup_step,
)
from miniverl.student.train.optim import planned_cycles, total_optimizer_steps
from miniverl.student.train.state import Mode, TrainState, log_cycle, restore, save_checkpoint
from miniverl.student.train.teacher.connect import (
    TEACHER_FAILURES,
    apply_retarget,
    check_handshake,
    connect,
    start_handshake,
)

MODES: dict[str, Callable[[], Mode]] = {
    "sft": SftMode,
    "offline_kd": OfflineKdMode,
    "opd": OpdMode,
    "replay": ReplayMode,
    "dpo": DpoMode,
    "rl": RlMode,
}


def run(state: TrainState, *, resumed: bool, show_progress: bool):
    """Evaluate, train, evaluate, checkpoint; ``(status, eval_before, eval_after)``.

    ``resumed``: ``state`` was restored (:func:`resume_from_checkpoint`); the mode
    rebuilds its own state from the run directory first.
    """
    recipe = state.recipe
    mode = MODES[recipe.run.mode]()
    if resumed:
        mode.resume(state)  # replay reloads its buffer
    state.run.event("run_started", mode=recipe.run.mode, on_policy=recipe.on_policy,
                    version=state.version, resumed=resumed)
    eval_before = None
    if recipe.eval.before is False and not resumed:
        state.run.event("eval_before_skipped", version=state.version)
    elif not resumed:
        eval_before = evaluate_now(state).to_dict()
    try:
        status = train_cycles(state, mode, show_progress=show_progress)
    except StopRequested:
        # A stop ended a wait on the teacher: no optimizer step was under way, so the
        # parameters sit at an update boundary; the checkpoint below keeps them.
        status = "interrupted"
    except TEACHER_FAILURES:
        # Raised while scoring or at a handshake, never inside an optimizer step: the
        # parameters sit at an update boundary, so never lose the training done so far.
        if state.step > 0:
            save_checkpoint(state)
        raise
    eval_after = None
    if status == "completed":
        # The last periodic eval already measured this version (eval_every divides the
        # cycles): one evaluation per version, not the same one twice.
        done = state.last_eval
        eval_after = (done[1] if done is not None and done[0] == state.version
                      else evaluate_now(state)).to_dict()
    save_checkpoint(state)  # a stop request also checkpoints, at an update boundary
    # Distinct steps: a run resumed from an earlier checkpoint logs some steps twice.
    on_policy = len({row.get("step") for row in state.run.metrics()
                     if row.get("on_policy") is True and (row.get("step") or 0) <= state.step})
    finish_manifest(state.run, state.version, mode_on_policy=recipe.on_policy,
                    on_policy_steps=on_policy, off_policy_steps=state.step - on_policy)
    # The teacher client's counters of this process (a resumed run's count from its
    # resume): what was sent, dropped as stale, and, with xvocab, aligned or not.
    state.run.event("run_completed" if status == "completed" else "run_interrupted",
                    version=state.version, steps=state.step,
                    teacher_counters=state.teacher.counters())
    return status, eval_before, eval_after


def resume_from_checkpoint(state: TrainState) -> None:
    """Continue from the run's latest checkpoint (parameters, optimizer, cursors); the
    mode's own state is rebuilt when :func:`run` starts (``Mode.resume``)."""
    restore(state)


def train_cycles(state: TrainState, mode: Mode, *, show_progress: bool) -> str:
    """The warm-up and ``mode``'s cycles; ``completed`` or ``interrupted`` (a stop request)."""
    recipe = state.recipe
    train = recipe.train
    total = total_optimizer_steps(recipe)
    if state.warmup_end is not None:  # resumed after a warm-up that ended early
        total -= train.sft_warmup_steps - state.warmup_end
    handshake = None
    if (recipe.needs_teacher and not state.teacher.connected and state.warmup_end is None
            and state.step < train.sft_warmup_steps):
        # Gate early: a teacher this run would refuse stops it before the warm-up is
        # spent, not after (the connect below would otherwise be the first to ask).
        handshake = start_handshake(state)
    threads = torch.get_num_threads()
    oracle = OracleBatches()  # the warm-up's oracle traces, rendered once each
    with TrainProgress(total, enabled=show_progress, initial=state.step) as progress:
        try:
            while state.warmup_end is None and state.step < train.sft_warmup_steps:
                if state.stop_event.is_set():
                    return "interrupted"
                if handshake is not None:
                    check_handshake(state, handshake)
                    if handshake.checked is not None:
                        warmup_threads(state)
                log_cycle(state, warmup_step(state, oracle))
                progress.update(state.step, state.last_metrics)
                if warmup_converged(state):
                    end_warmup(state, "loss")
                    progress.set_total(total - (train.sft_warmup_steps - state.step))
        finally:
            torch.set_num_threads(threads)  # the teacher works from here on
        if state.warmup_end is None:
            end_warmup(state, "steps")
        if recipe.needs_teacher and not state.teacher.connected:
            # Bind only now: under `up` the teacher loads (or is still being prepared)
            # while the student imports, evaluates and runs its SFT warm-up.
            connect(state, handshake)
        mode.prepare(state)  # offline_kd scores its fixed set
        cycles = planned_cycles(recipe)
        while state.cycle < cycles:
            if state.stop_event.is_set():
                return "interrupted"
            if train.max_wall_s is not None and state.wall() > train.max_wall_s:
                state.run.event("wall_budget_reached", wall_s=state.wall(),
                                version=state.version)
                break
            if state.teacher.pending_endpoint is not None or state.teacher.routes:
                apply_retarget(state)  # a RETARGET from the control socket, at this boundary
            done = mode.cycle(state)  # rollout -> score -> update
            if done is not None:  # dpo skips a cycle without a preference pair
                log_cycle(state, done)
            state.cycle += 1
            progress.update(state.step, state.last_metrics)
            if train.eval_every and state.cycle % train.eval_every == 0:
                evaluate_now(state)
            if train.save_every and state.cycle % train.save_every == 0:
                save_checkpoint(state)
    return "completed"


def warmup_threads(state: TrainState) -> None:
    """``runtime.warmup_cpu_threads``: a teacher that has answered HELLO waits idle until
    the first distillation cycle, so the warm-up may take its cores (once, recorded)."""
    wanted = state.recipe.runtime.warmup_cpu_threads
    if wanted is None:
        return
    wanted = min(wanted, os.cpu_count() or 1)
    if wanted != torch.get_num_threads():
        torch.set_num_threads(wanted)
        state.run.event("warmup_threads", threads=wanted, step=state.step)


def evaluate_now(state: TrainState) -> EvalSummary:
    """Evaluate the current version (``student/eval.py``), recorded as an event."""
    model = state.policy.model
    model.eval()
    with torch.no_grad():
        summary = evaluate(
            model, state.policy.tokenizer, state.recipe, policy_version=state.version,
            out_dir=state.run.eval_dir, tokenizer_fp=state.policy.tokenizer_fp,
            offline=state.offline,
        )
    model.train()
    optional = {name: getattr(summary, name)
                for name in ("faults", "sampled", "coverage", "by_environment")
                if getattr(summary, name) is not None}
    state.run.event("eval", version=state.version, split=summary.split,
                    success=summary.success, n=summary.n, by_difficulty=summary.by_difficulty,
                    stop_reasons=summary.stop_reasons, mean_tool_calls=summary.mean_tool_calls,
                    **optional)
    state.last_eval = (state.version, summary)
    return summary
