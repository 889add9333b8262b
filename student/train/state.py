"""The training state: one dataclass that the loop and every mode read and advance.

:class:`TrainState` holds what a run's loop works on: the policy, optimizer and
scheduler, the student's parameter ``version`` (+1 per optimizer step), the step and
cycle cursors, the SFT warm-up's progress and the teacher side: what a checkpoint
records and every mode reads, never what one step hands to the next (a step returns
that) nor what one mode keeps (its own :class:`Mode` object holds that).
:func:`build_state` makes it (seeds first, then the model, so the RNG draws happen in
one fixed order); :func:`save_checkpoint` and :func:`restore` write and read it back, so
a resumed run continues exactly where the uninterrupted one would be. What one cycle did
(a :class:`CycleResult`) is logged from it as one metrics row (:func:`log_cycle`).

Which episodes a cycle samples is here too (:class:`TrainTasks`, :func:`fixed_draw`),
three batch rules, each a pure function of the recipe, the run seed and the cycle, so a
resumed run builds exactly the batches the uninterrupted one would have built:

- **Groups** (``rollout.group_size`` G; dpo's ``dpo.group_size`` when that is unset):
  a cycle of ``n`` fresh episodes plays ``n // G`` tasks (the cycle's first ``n // G``
  of :meth:`TrainTasks.of_cycle`), each ``G`` times in a row, and episode ``i`` of the cycle has
  seed ``episode_seed(run.seed, cycle, i)``, so the ``G`` episodes of one task differ in
  their seed only (:meth:`TrainTasks.episodes`). G = 1 is the ungrouped batch: task ``i``
  with seed ``i``.
- **The fixed-set draw** (:func:`fixed_draw`): ``count`` episodes of the fixed set, a
  draw without replacement seeded by ``(run.seed, cycle)``, in set order. With
  ``count = rollouts_per_cycle`` it is offline KD's batch; GKD mixing
  (``train.on_policy_fraction``, ``modes/offline_kd.py``) draws the part of the batch the fresh
  episodes leave.
- **A mixture** (``environments:``): :meth:`TrainTasks.of_cycle` draws each of the cycle's tasks
  from the mixture (``environments/mixture.py``, ``draw``): its environment by weight,
  then one of its tasks, both a function of ``(run.seed, cycle, episode)``; a single
  ``environment:`` keeps the seeded permutations above.

This module does not run cycles (``loop.py``, ``modes/``), talk to the teacher
(``teacher/connect.py``) or open the run directory (``trainer.py``).
"""

from __future__ import annotations

import functools
import json
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from miniverl.common.errors import ConfigError
from miniverl.common.manifest import update_manifest
from miniverl.common.memory_plan import ModelShape, check_recipe, with_train_changes
from miniverl.common.modeling import resolve_device, resolve_model_dir
from miniverl.common.recipe import Recipe, recipe_digest
from miniverl.common.rundir import RunDir
from miniverl.common.runtime import apply_cpu_threads, cuda_process_env
from miniverl.common.trajectory import Trajectory
from miniverl.student.checkpoint import latest as latest_checkpoint
from miniverl.student.checkpoint import load as load_checkpoint
from miniverl.student.checkpoint import save as write_checkpoint
from miniverl.student.environments import make_tasks
from miniverl.student.environments.mixture import Mixture, draw, mixture_tasks
from miniverl.student.rollout.runner import RolloutRunner
from miniverl.student.rollout.vllm_engine import logprob_gap, start_engine
from miniverl.student.targets_cache import TargetsCache
from miniverl.student.train.cached_targets import open_cache
from miniverl.student.train.objectives import StepObjective
from miniverl.student.train.objectives.table import run_kind, run_objective
from miniverl.student.train.optim import build_optimizer
from miniverl.student.train.policy import Policy, load_policy
from miniverl.student.train.teacher.link import Scored, TeacherSide
from miniverl.student.train.updates import StepStats, build_scheduler


@dataclass
class TrainState:
    """Everything one run's loop reads and advances (see the module docstring)."""

    recipe: Recipe
    run: RunDir
    policy: Policy
    optimizer: Any
    scheduler: Any
    runner: RolloutRunner
    tasks: TrainTasks
    # The objective the recipe's loss section picks for the targets the run asks for
    # (its ``kind``: topk, exact, xvocab, or mixed for routes of both), made once when
    # the run starts; rl's task reward, sft's cross-entropy (objectives/table.py).
    objective: StepObjective
    cache: TargetsCache | None
    teacher: TeacherSide
    stop_event: threading.Event
    started: float  # time.perf_counter() when the trainer was made
    checkpoints: bool = True
    # --offline: models this process loads besides the student (the teacher playing
    # train.fixed_set teacher, student/teacher_play.py) never touch the network either.
    offline: bool = False
    version: int = 0  # the student's parameter version: +1 per optimizer step
    step: int = 0
    cycle: int = 0
    # The step the SFT warm-up ended at, once it has (train.sft_warmup_until_loss can
    # end it early); the second phase's schedule starts there.
    warmup_end: int | None = None
    warmup_losses: list[float] = field(default_factory=list)
    last_metrics: dict[str, Any] = field(default_factory=dict)
    # The latest evaluation and the version it measured: the final eval of a run whose
    # train.eval_every divides its cycles reuses the periodic one made at that version.
    last_eval: tuple[int, Any] | None = None
    # rollout.engine vllm with its check on: the engine's log-probs of a batch's sampled
    # tokens against the policy's forward on them (vllm_engine.logprob_gap); None: off.
    engine_check: Callable[[list[Trajectory]], Any] | None = None

    def wall(self) -> float:
        """Seconds since the trainer was made."""
        return time.perf_counter() - self.started

    def advance(self) -> None:
        """One optimizer step was taken: the parameters are a new version."""
        self.step += 1
        self.version += 1


@dataclass
class CycleResult:
    """What one cycle (or warm-up step) did, for the loop to log."""

    stats: StepStats
    trajs: list[Trajectory]
    t_rollout: float
    t_wait: float
    t_update: float
    scored: list[Scored] | None = None
    phase: str | None = None  # None: the mode's own cycle; "sft_warmup"
    extra: dict[str, Any] | None = None


def log_cycle(state: TrainState, done: CycleResult) -> None:
    """One metrics row for a cycle (or warm-up step), in the run's ``metrics.jsonl`` and
    kept as ``state.last_metrics`` (the loop logs each cycle with it)."""
    stats, trajs, scored = done.stats, done.trajs, done.scored
    side = state.teacher
    counters = side.counters()
    positions_scored = int(sum(len(s.positions_P) for s in scored)) if scored else 0
    row = {
        "step": state.step, "version": state.version, "cycle": state.cycle,
        "mode": state.recipe.run.mode, "phase": done.phase or "train",
        "on_policy": state.recipe.on_policy and done.phase is None,
        "loss": stats.loss, "divergence": stats.divergence,
        "positions": stats.positions, "tokens": stats.tokens,
        "teacher": ({k: side.identity.get(k) for k in ("name", "instance", "gen")}
                    if side.connected else None),
        "stale_dropped": counters.get("stale_dropped", 0),
        "nonfinite_replies": counters.get("nonfinite_replies", 0),
        "time_rollout_s": done.t_rollout, "time_teacher_wait_s": done.t_wait,
        "time_update_s": done.t_update,
        "positions_scored": positions_scored,
        "positions_per_s": positions_scored / done.t_wait if done.t_wait > 0 else None,
        "bytes_sent": counters.get("bytes_sent", 0),
        "bytes_received": counters.get("bytes_received", 0),
        # Several teachers: each one's counters, and the episodes held back (a teacher down).
        **({k: counters[k] for k in ("by_teacher", "held_back")} if "by_teacher" in counters
           else {}),
        "lr": stats.lr, "grad_norm": stats.grad_norm,
        # Success of the student's own rollouts; oracle batches (SFT) have none.
        "train_success": (sum(t.verifier.success for t in trajs) / len(trajs)
                          if trajs and trajs[0].source == "rollout" else None),
        "wall_s": state.wall(),
        **(done.extra or {}),
    }
    state.last_metrics = row
    state.run.metric(row)


class Mode(Protocol):
    """One training mode as the loop drives it (``modes/``: one class each, peers).

    The object holds the state that belongs to this mode alone (replay's buffer,
    offline KD's scored set, SFT's rendered traces), so :class:`TrainState` carries none.
    """

    def prepare(self, state: TrainState) -> None:
        """Run once, after the warm-up and the teacher's connect, before the first cycle."""

    def resume(self, state: TrainState) -> None:
        """Rebuild this mode's state after ``state`` was restored from a checkpoint."""

    def cycle(self, state: TrainState) -> CycleResult | None:
        """One cycle (rollout, score, update); None when it took no update."""


def episode_seed(run_seed: int, cycle: int, index: int) -> int:
    # Seeds depend only on (run seed, cycle, episode), so a resumed run samples exactly
    # what the uninterrupted run would have sampled.
    return (run_seed * 1_000_003 + cycle * 10_007 + index) % (2**31 - 1)


@dataclass(frozen=True)
class TrainTasks:
    """The run's training tasks (``all``) and how a cycle draws them, a pure function of
    the run seed and the cycle (the module docstring); ``mixture`` the training split
    of the recipe's ``environments:`` (None: one environment)."""

    all: list[Any]
    seed: int  # run.seed
    mixture: Mixture | None = None

    def of_cycle(self, cycle: int, n: int, tasks: list[Any] | None = None) -> list[Any]:
        """The ``n`` training tasks of ``cycle``: epochs of seeded permutations of the
        tasks (``tasks``, default every training task; :meth:`oracle` for oracle
        batches). A mixture draws its tasks from its environments by weight."""
        if tasks is None and self.mixture is not None:
            return draw(self.mixture, self.seed, cycle, n)
        tasks = self.all if tasks is None else tasks
        epoch_len = len(tasks)
        out = []
        for i in range(n):
            epoch, idx = divmod(cycle * n + i, epoch_len)
            order = np.random.default_rng(self.seed * 7919 + epoch).permutation(epoch_len)
            out.append(tasks[int(order[idx])])
        return out

    def episodes(self, cycle: int, n: int, group: int = 1) -> tuple[list[Any], list[int]]:
        """``(tasks, seeds)`` of the ``n // group * group`` fresh episodes of ``cycle``:
        each of the cycle's first ``n // group`` tasks ``group`` times in a row."""
        grouped = [task for task in self.of_cycle(cycle, n // group) for _ in range(group)]
        return grouped, [episode_seed(self.seed, cycle, i) for i in range(len(grouped))]

    def oracle(self, count: int | None) -> list[Any]:
        """The training tasks that have an oracle trace: the first ``count``
        (``train.oracle_tasks``: demonstrations are scarce, prompts are not), or every
        one when it is None."""
        return self.all if count is None else self.all[:count]


# Salts the fixed-set draw's seed apart from the episodes' seeds of the same cycle.
FIXED_DRAW_SALT = 77_777

Item = TypeVar("Item")


def group_size(recipe: Recipe) -> int:
    """Episodes per task in one cycle: ``rollout.group_size``; dpo falls back to
    ``dpo.group_size`` (the recipe refuses the two set to different values); 1 else."""
    if recipe.rollout.group_size is not None:
        return recipe.rollout.group_size
    return recipe.dpo.group_size if recipe.run.mode == "dpo" else 1


def fixed_draw(recipe: Recipe, fixed: list[Item], cycle: int, count: int) -> list[Item]:
    """``min(count, len(fixed))`` items of ``fixed`` drawn for ``cycle``, in set order."""
    k = min(count, len(fixed))
    rng = np.random.default_rng(episode_seed(recipe.run.seed, cycle, FIXED_DRAW_SALT))
    pick = rng.choice(len(fixed), size=k, replace=False)
    return [fixed[i] for i in sorted(pick)]


def run_digest(recipe: Recipe) -> str:
    """The recipe digest checkpoints record, with ``run.output_dir`` and ``run.loggers``
    left out (where a run lives and which trackers watch it change nothing it learns;
    checkpoints written before ``run.loggers`` existed still match)."""
    run = recipe.run.model_copy(update={"output_dir": "-"})
    return recipe_digest(recipe.model_copy(update={"run": run}), leave_out=("run.loggers",))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def make_autocast(policy: Policy) -> Any:
    """The update's and rollouts' autocast context: CUDA, in the recipe's resolved dtype
    (``Policy.compute_dtype``); None on the CPU or in float32."""
    return policy.autocast  # Policy owns it, made once from its device and dtype


def planned_for_device(recipe: Recipe, run: RunDir, *, offline: bool) -> Recipe:
    """On a CUDA student: the memory plan for this device's memory, before any weight is
    loaded (common/memory_plan.py). A recipe that cannot fit is refused in one line naming
    the setting that would make it fit; what the recipe left null
    (``train.gradient_checkpointing``, ``train.micro_batch_tokens``) is filled in with the
    plan's choice, recorded as the ``memory_plan`` event and in the run's resolved recipe
    and manifest (``RunDir.record_filled``). On the CPU: the recipe as is."""
    device = resolve_device(recipe.student.device)
    if device.type != "cuda":
        return recipe
    model_dir = resolve_model_dir(recipe.student.model, offline=offline)
    student = ModelShape.from_config(json.loads((Path(model_dir) / "config.json").read_text()))
    _, total = torch.cuda.mem_get_info(device)
    lines, chosen, refused = check_recipe(recipe, total, student=student)
    if refused is not None:
        raise ConfigError(f"{device}: {refused}")
    run.event("memory_plan", device_bytes=int(total), peak_bytes=chosen.plan.peak,
              chosen=chosen.changes, lines=lines)
    planned = with_train_changes(recipe, chosen.changes)
    filled = {k: v for k, v in chosen.changes.items() if k.startswith("train.")}
    if filled:
        run.record_filled(planned, {**run.filled(), **filled})
    return planned


def prepare_process(recipe: Recipe, run: RunDir, *, offline: bool) -> Recipe:
    """Set this process up for ``recipe`` (its threads, CUDA's environment, determinism)
    and return the recipe to run: with what the memory plan filled in on a CUDA student
    (:func:`planned_for_device`), so that the trackers, opened next, log its digest."""
    # `miniverl up` divides the machine's cores between its two processes.
    cap = int(os.environ.get("MINIVERL_CPU_THREADS", "0") or 0)
    apply_cpu_threads(min(recipe.runtime.cpu_threads, cap) if cap else recipe.runtime.cpu_threads)
    # Before CUDA's first use in this process (the cuBLAS workspace, the allocator).
    cuda_process_env(deterministic=recipe.run.deterministic)
    if recipe.run.deterministic:
        torch.use_deterministic_algorithms(True)
    return planned_for_device(recipe, run, offline=offline)


def build_state(recipe: Recipe, run: RunDir, teacher: TeacherSide, *, offline: bool,
                stop_event: threading.Event, started: float, checkpoints: bool) -> TrainState:
    """Seed, load the policy, build optimizer, scheduler, tasks, runner and cache (for the
    recipe :func:`prepare_process` returned)."""
    seed_everything(recipe.run.seed)
    policy = load_policy(recipe, offline=offline)
    optimizer = build_optimizer(recipe, policy.trainable_parameters())
    autocast = make_autocast(policy)
    env, mixture = recipe.environment, None
    if recipe.environments is None:
        train_tasks = make_tasks(
            env.name, "train", env.train_tasks, env.difficulty, env.split_seed, params=env.params
        )
    else:
        mixture = mixture_tasks(recipe.environments, "train")
        env, train_tasks = recipe.environments[0], mixture.all_tasks()
    # rollout.engine vllm: vLLM samples the episodes in this process, its weights synced
    # from the policy at every run (docs/rollouts.md, "Sampling engines"); it computes
    # in the policy's dtype itself, so the runner sets up no autocast for it.
    engine, engine_check = None, None
    if recipe.rollout.engine == "vllm":
        engine = start_engine(policy, recipe.rollout)
        if recipe.rollout.engine_check is not False:
            engine_check = functools.partial(
                logprob_gap, policy.model, temperature=recipe.rollout.temperature,
                top_p=recipe.rollout.top_p, autocast=autocast)
    runner = RolloutRunner(
        policy.model, policy.tokenizer, env_name=env.name, env_params=env.params,
        rollout=recipe.rollout, tokenizer_fp=policy.tokenizer_fp, mixture=mixture,
        autocast=autocast if engine is None else None, engine=engine,
    )
    update_manifest(run, tokenizer_fp=policy.tokenizer_fp, tokenizer_dir=str(policy.model_dir),
                    vocab_size=policy.vocab_size)
    # teacher.tokenizer: other asks for xvocab targets (docs/cross-tokenizer.md); routed
    # teachers of both tokenizers for both ("mixed", docs/several-teachers.md).
    state = TrainState(
        recipe=recipe, run=run, policy=policy, optimizer=optimizer, scheduler=None,
        runner=runner, tasks=TrainTasks(train_tasks, recipe.run.seed, mixture),
        objective=run_objective(recipe),
        cache=open_cache(recipe, run, policy, run_kind(recipe)), teacher=teacher,
        stop_event=stop_event,
        started=started, checkpoints=checkpoints, offline=offline, engine_check=engine_check,
    )
    # The schedule reads where the warm-up ended from the state it belongs to (it draws
    # no random numbers, so building it after the tasks and runner changes nothing).
    state.scheduler = build_scheduler(recipe, optimizer, lambda: state.warmup_end)
    return state


def save_checkpoint(state: TrainState) -> Path | None:
    """Write a checkpoint of ``state`` (atomically); None when checkpoints are off."""
    if not state.checkpoints:
        return None
    path = write_checkpoint(
        state.run.checkpoints_dir,
        model=state.policy.model,
        optimizer=state.optimizer,
        scheduler=state.scheduler,
        step=state.step,
        version=state.version,
        data_cursor={"cycle": state.cycle, "warmup_end": state.warmup_end,
                     "warmup_losses": state.warmup_losses},
        recipe_digest=run_digest(state.recipe),
    )
    state.run.event("checkpoint", path=str(path), version=state.version, step=state.step)
    return path


def restore(state: TrainState) -> None:
    """Load the run's latest checkpoint into ``state`` (parameters, optimizer, cursors)."""
    path = latest_checkpoint(state.run.checkpoints_dir)
    if path is None:
        raise ConfigError(
            f"run {state.run.id} has no checkpoint to resume from; start it again without "
            "--resume"
        )
    saved = load_checkpoint(path, state.policy.model, state.optimizer, state.scheduler)
    if saved.recipe_digest != run_digest(state.recipe):
        raise ConfigError(
            f"checkpoint {path.name} was written with recipe {saved.recipe_digest}, this "
            f"recipe is {run_digest(state.recipe)}; resume with the original recipe"
        )
    state.step, state.version = saved.step, saved.version
    state.cycle = int(saved.data_cursor.get("cycle", 0))
    end = saved.data_cursor.get("warmup_end")
    state.warmup_end = None if end is None else int(end)
    state.warmup_losses = [float(x) for x in saved.data_cursor.get("warmup_losses", [])]
    state.run.event("resumed", checkpoint=str(path), version=state.version, step=state.step)
