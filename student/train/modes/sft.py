"""Mode ``sft`` and the SFT warm-up: cross-entropy on oracle traces, no teacher.

An oracle trace is a pure function of its task (the environment's scripted actions,
rendered by the chat template), so each is rendered once per run and reused. The
warm-up (``train.sft_warmup_steps``) runs these steps before the first distillation
cycle (cold start) and ends early when ``train.sft_warmup_until_loss`` is reached. The
rendered traces are the mode's own state (:class:`OracleBatches`, held by
:class:`SftMode` and by the loop for the warm-up). With ``train.fixed_set: teacher``
(SeqKD) the cycles train on the teacher's own episodes of the same tasks instead,
played once in :meth:`SftMode.prepare` (``fixed_sets.py``); the warm-up stays on
oracle traces.

This module does not log, evaluate or checkpoint (``loop.py`` does).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from miniverl.common.qualification import PRIVILEGED
from miniverl.common.recipe import Recipe
from miniverl.common.trajectory import Trajectory
from miniverl.student.rollout.oracle import oracle_trajectories
from miniverl.student.train.fixed_sets import TeacherBatches
from miniverl.student.train.policy import Policy
from miniverl.student.train.state import CycleResult, TrainState, TrainTasks
from miniverl.student.train.updates import Schedule, sft_step

# train.sft_warmup_until_loss compares the mean of this many last warm-up losses.
WARMUP_LOSS_WINDOW = 10
# Warm-up batches draw their tasks from cycles far past any real one.
WARMUP_CYCLE_OFFSET = 10_000_000


@dataclass
class OracleBatches:
    """Oracle traces by task id: a pure function of the task, so each is rendered once
    per run and reused."""

    by_task: dict[str, Trajectory] = field(default_factory=dict)

    def batch(self, cycle: int, *, tasks: TrainTasks, recipe: Recipe,
              policy: Policy) -> list[Trajectory]:
        """The oracle traces of ``cycle``'s training tasks (of those that have one,
        ``train.oracle_tasks``), rendered by ``policy``'s tokenizer; a mixture's tasks are
        drawn by weight and each trace is played in its own environment."""
        mixture = tasks.mixture
        drawn = tasks.of_cycle(cycle, recipe.train.rollouts_per_cycle,
                               None if mixture is not None else
                               tasks.oracle(recipe.train.oracle_tasks))
        missing = [t for t in drawn if t.id not in self.by_task]
        # rollout.view: a privileged teacher's preparation trains on the view it will
        # score in.
        privileged = recipe.rollout.view == PRIVILEGED
        env = recipe.environment
        by_env = ({env.name: (env.params, missing)} if mixture is None else
                  {name: (mixture.params[name],
                          [t for t in missing if mixture.environment_of[t.id] == name])
                   for name in mixture.names})
        for name, (params, group) in by_env.items():
            for task, traj in zip(group, oracle_trajectories(
                name, group, policy.tokenizer, policy.tokenizer_fp, params,
                privileged=privileged,
            ), strict=True):
                self.by_task[task.id] = traj
        return [self.by_task[t.id] for t in drawn]


@dataclass
class SftMode:
    """Mode ``sft``: an oracle batch and one optimizer step per cycle; with
    ``train.fixed_set: teacher`` (SeqKD) the teacher's episodes of the same tasks."""

    oracle: OracleBatches = field(default_factory=OracleBatches)
    teacher: TeacherBatches = field(default_factory=TeacherBatches)

    def prepare(self, state: TrainState) -> None:
        """SeqKD plays (or reads back) the teacher's set; oracle traces are rendered as
        cycles need them."""
        if state.recipe.train.fixed_set == "teacher":
            self.teacher.prepare(state)

    def resume(self, state: TrainState) -> None:
        """Nothing to rebuild: the traces are rendered again from the tasks."""

    def cycle(self, state: TrainState) -> CycleResult:
        """One ``sft`` cycle: an oracle batch, one optimizer step."""
        recipe = state.recipe
        t0 = time.perf_counter()
        if recipe.train.fixed_set == "teacher":
            trajs = self.teacher.batch(state.cycle, tasks=state.tasks,
                                       n=recipe.train.rollouts_per_cycle)
        else:
            trajs = self.oracle.batch(state.cycle, tasks=state.tasks, recipe=recipe,
                                      policy=state.policy)
        t_rollout = time.perf_counter() - t0
        t1 = time.perf_counter()
        stats = sft_step(state.policy, state.optimizer, state.scheduler, trajs,
                         loss=recipe.loss, train=recipe.train)
        state.advance()
        return CycleResult(stats, trajs, t_rollout, 0.0, time.perf_counter() - t1)


def warmup_step(state: TrainState, oracle: OracleBatches) -> CycleResult:
    """One SFT warm-up step (phase ``sft_warmup``) on ``oracle``'s traces: the warm-up's
    cycle, the one place of it that reads the run's state."""
    recipe = state.recipe
    t0 = time.perf_counter()
    trajs = oracle.batch(WARMUP_CYCLE_OFFSET + state.step, tasks=state.tasks, recipe=recipe,
                         policy=state.policy)
    stats = sft_step(state.policy, state.optimizer, state.scheduler, trajs,
                     loss=recipe.loss, train=recipe.train)
    state.advance()
    state.warmup_losses = [*state.warmup_losses, stats.loss][-WARMUP_LOSS_WINDOW:]
    return CycleResult(stats, trajs, 0.0, 0.0, time.perf_counter() - t0, phase="sft_warmup")


def warmup_converged(state: TrainState) -> bool:
    """train.sft_warmup_until_loss: the last WARMUP_LOSS_WINDOW losses average below it."""
    until = state.recipe.train.sft_warmup_until_loss
    losses = state.warmup_losses
    return (until is not None and len(losses) == WARMUP_LOSS_WINDOW
            and sum(losses) / len(losses) <= until)


def end_warmup(state: TrainState, reason: str) -> None:
    """Mark where the warm-up ended (``loss``: converged early; ``steps``: all done)."""
    train = state.recipe.train
    if reason == "loss":
        state.warmup_end = state.step
        # The scheduler already set this step's rate for a longer warm-up: reset it.
        for group in state.optimizer.param_groups:
            group["lr"] = Schedule.of(state.recipe).lr_at(state.step, state.warmup_end)
    else:
        state.warmup_end = min(state.step, train.sft_warmup_steps)
    if train.sft_warmup_steps == 0 or state.step != state.warmup_end:
        return  # no warm-up, or a resumed run that is past it
    losses = state.warmup_losses
    state.run.event("sft_warmup_done", step=state.step, reason=reason,
                    planned_steps=train.sft_warmup_steps,
                    mean_loss=sum(losses) / len(losses) if losses else None,
                    version=state.version)
