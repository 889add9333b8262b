"""The student's training loop: rollout -> score -> update -> log -> checkpoint.

One explicit loop serves every mode; each cycle is one of these, read top to bottom in
:meth:`Trainer._cycle`:

- ``sft``: oracle trajectories, cross-entropy on the model's own spans, no teacher.
- ``offline_kd``: a fixed trajectory set (oracle traces, or a previous run's
  ``trajectories.jsonl``) scored once; the targets are cached and reused by every
  version. Off-policy by construction, and reported as such.
- ``opd`` (strict on-policy): sample fresh rollouts with version ``v``, request targets
  tagged ``v`` (pipelined: each episode's SCORE leaves as soon as it ends), take
  exactly one optimizer step, ``v -> v + 1``. The client drops any reply not for ``v``
  or not from the teacher the update is bound to; nothing stale reaches the loss.
- ``replay``: fresh rollouts join a buffer; each update trains on buffered rollouts at
  most ``max_lag`` versions old. Off-policy, labelled as such.

``sft_warmup_steps`` SFT steps run before the first distillation cycle (cold start).

The trainer does not know how the teacher is reached: it is handed a client (the real
``SyncTeacherClient`` or an in-process fake with the same methods).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from miniverl.common.errors import ConfigError, MiniverlError
from miniverl.common.manifest import record_teacher, update_manifest
from miniverl.common.recipe import Recipe, diff_recipes, recipe_digest
from miniverl.common.rundir import RunDir
from miniverl.common.runtime import apply_cpu_threads
from miniverl.common.trajectory import Trajectory, read_trajectories, write_trajectories
from miniverl.student.environments import make_tasks
from miniverl.student.eval import EvalSummary, evaluate
from miniverl.student.optim import (
    build_optimizer,
    build_scheduler,
    lr_at,
    planned_cycles,
    total_optimizer_steps,
)
from miniverl.student.oracle import oracle_trajectories
from miniverl.student.policy import Policy, load_policy
from miniverl.student.rollout import RolloutRunner
from miniverl.student.selection import select_positions_for
from miniverl.student.teacher_link import Scored, TeacherLink, teacher_identity
from miniverl.student.updates import (
    EarlyForward,
    StepStats,
    distill_step,
    early_forward,
    first_micro_batch,
    sft_step,
)

# train.sft_warmup_until_loss compares the mean of this many last warm-up losses.
WARMUP_LOSS_WINDOW = 10


@dataclass
class TrainResult:
    """What :meth:`Trainer.train` returns."""

    run_dir: Path
    status: str
    final_version: int
    steps: int
    eval_before: dict[str, Any] | None
    eval: dict[str, Any] | None
    wall_s: float
    counters: dict[str, Any] = field(default_factory=dict)


def _episode_seed(run_seed: int, cycle: int, index: int) -> int:
    # Seeds depend only on (run seed, cycle, episode), so a resumed run samples exactly
    # what the uninterrupted run would have sampled.
    return (run_seed * 1_000_003 + cycle * 10_007 + index) % (2**31 - 1)


def _recipe_changes(old: Recipe, new: Recipe) -> list[str]:
    """Fields that differ, ignoring ``run.output_dir``: where a run lives (``runs`` or
    its absolute path, as ``miniverl up`` passes it) does not change what it learns."""
    return [f for f in diff_recipes(old, new) if f != "run.output_dir"]


def _run_digest(recipe: Recipe) -> str:
    """The recipe digest checkpoints record, with ``run.output_dir`` left out."""
    return recipe_digest(
        recipe.model_copy(update={"run": recipe.run.model_copy(update={"output_dir": "-"})})
    )


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class Trainer:
    """Build from a recipe (and a teacher client for teacher modes); call :meth:`train`.

    Use it as a context manager: leaving the block releases the run lock and closes the
    teacher client. ``stop_event`` (a ``threading.Event``) asks the loop to checkpoint
    and stop at the next update boundary.
    """

    def __init__(
        self,
        recipe: Recipe,
        *,
        teacher_endpoint: str | None = None,
        client: Any = None,
        run_id: str | None = None,
        resume: bool = False,
        offline: bool = False,
        recipe_text: str | None = None,
        stop_event: threading.Event | None = None,
        show_progress: bool = True,
        write_report: bool = True,
        checkpoints: bool = True,
    ):
        self.recipe = recipe
        self.endpoint = teacher_endpoint or (recipe.teacher.endpoint if recipe.teacher else None)
        self.client = client
        self.offline = offline
        self.stop_event = stop_event or threading.Event()
        self.show_progress = show_progress
        self.write_report = write_report
        self.checkpoints = checkpoints
        self.pending_retarget: str | None = None
        self.stop_checkpoint = True
        self.version = 0
        self.step = 0
        self.cycle = 0
        self.started = time.perf_counter()
        self.last_metrics: dict[str, Any] = {}
        train = recipe.train
        if recipe.run.mode == "replay" and train.updates_per_batch - 1 > train.max_lag:
            raise ConfigError(
                f"train.updates_per_batch {train.updates_per_batch} with max_lag "
                f"{train.max_lag}: the last update of a batch would train on targets "
                f"{train.updates_per_batch - 1} versions old; raise max_lag to at least "
                f"{train.updates_per_batch - 1} or lower updates_per_batch"
            )
        if recipe.needs_teacher and client is None and self.endpoint is None:
            raise ConfigError(
                f"mode {recipe.run.mode!r} needs a teacher: pass --teacher ENDPOINT, set "
                "teacher.endpoint, or start both processes with `miniverl up`"
            )
        self.run = self._open_run(run_id, resume, recipe_text)
        self.resume = resume

    # -- setup ---------------------------------------------------------------------------

    def _open_run(self, run_id: str | None, resume: bool, recipe_text: str | None) -> RunDir:
        out = Path(self.recipe.run.output_dir)
        if resume:
            if run_id is None:
                raise ConfigError("--resume needs --run-id ID (the run to continue)")
            run = RunDir.open(out / run_id)
            differing = _recipe_changes(run.recipe(), self.recipe)
            if differing:
                raise ConfigError(
                    f"run {run_id} was started with another recipe; differing fields: "
                    f"{', '.join(differing)}; resume with the original recipe or start a new run"
                )
        elif run_id is not None and (out / run_id / "status.json").is_file():
            # `miniverl up` creates the run directory (for logs and sockets) before the
            # student starts; the student adopts it while it is still `ready`.
            run = RunDir.open(out / run_id)
            if run.status != "ready" or _recipe_changes(run.recipe(), self.recipe):
                raise ConfigError(
                    f"run {run_id} already exists ({run.status}); pick another --run-id, "
                    "or pass --resume to continue it"
                )
        else:
            run = RunDir.create(out, self.recipe, recipe_text=recipe_text, run_id=run_id)
        run.lock().__enter__()
        return run

    def _setup(self) -> None:
        recipe = self.recipe
        # `miniverl up` divides the machine's cores between its two processes.
        cap = int(os.environ.get("MINIVERL_CPU_THREADS", "0") or 0)
        apply_cpu_threads(min(recipe.runtime.cpu_threads, cap) if cap else recipe.runtime.cpu_threads)
        if recipe.run.deterministic:
            torch.use_deterministic_algorithms(True)
        _seed_everything(recipe.run.seed)
        self.policy: Policy = load_policy(recipe, offline=self.offline)
        self.optimizer = build_optimizer(recipe, self.policy.trainable_parameters())
        # The step the SFT warm-up ended at, once it has (train.sft_warmup_until_loss can
        # end it early); the second phase's schedule starts there.
        self.warmup_end: int | None = None
        self._warmup_losses: list[float] = []
        self.scheduler = build_scheduler(recipe, self.optimizer, lambda: self.warmup_end)
        dev = self.policy.device
        self.autocast = (
            torch.autocast("cuda", dtype=next(self.policy.model.parameters()).dtype)
            if dev.type == "cuda" and next(self.policy.model.parameters()).dtype != torch.float32
            else None
        )
        env = recipe.environment
        self.train_tasks = make_tasks(
            env.name, "train", env.train_tasks, env.difficulty, env.split_seed, params=env.params
        )
        self.runner = RolloutRunner(
            self.policy.model, self.policy.tokenizer, env_name=env.name, env_params=env.params,
            rollout=recipe.rollout, tokenizer_fp=self.policy.tokenizer_fp,
        )
        update_manifest(
            self.run,
            tokenizer_fp=self.policy.tokenizer_fp,
            tokenizer_dir=str(self.policy.model_dir),
            vocab_size=self.policy.vocab_size,
        )
        self.kind = "exact" if recipe.loss.objective == "exact_full_vocab" else "topk"
        self.link: TeacherLink | None = None
        self.memory = "resident"
        self.cache = self._open_cache()
        self.replay_buffer: list[Scored] = []
        self._oracle_cache: dict[str, Trajectory] = {}
        self._early: EarlyForward | None = None  # the next update's forward, run early
        self._early_s = 0.0
        self.fixed_set: list[Trajectory] = []

    def _connect_teacher(self) -> None:
        recipe = self.recipe
        if self.client is None:
            from miniverl.protocol.client import SyncTeacherClient

            rt = recipe.runtime
            self.client = SyncTeacherClient(
                self.endpoint,
                tokenizer_fp=self.policy.tokenizer_fp,
                vocab_size=self.policy.vocab_size,
                client_name=f"student:{self.run.id}",
                heartbeat_ms=rt.heartbeat_ms,
                request_timeout_s=rt.request_timeout_s,
                unavailable_timeout_s=rt.unavailable_timeout_s,
            )
        self.client.connect(recipe.runtime.teacher_startup_timeout_s)
        identity = teacher_identity(self.client)
        self._check_qualified(identity)
        self.link = TeacherLink(
            self.client, kind=self.kind, k=recipe.loss.top_k,
            temperature=recipe.loss.temperature, on_teacher_changed=self._teacher_changed,
            view=self._teacher_view(),
        )
        self.teacher = identity
        self.run.event("teacher_connected", teacher=identity, version=self.version,
                       endpoint=self.endpoint)
        record_teacher(self.run, self.version, identity, how="connect")

    def _check_qualified(self, identity: dict) -> None:
        """The competence gate (teacher.min_success): refuse an unqualified teacher."""
        teacher = self.recipe.teacher
        if teacher is None or teacher.min_success is None:
            return
        from miniverl.student.qualify import require_qualified

        record = require_qualified(self.recipe, identity)
        self.run.event("teacher_qualified", teacher=identity, success=record["success"],
                       split=record["split"], n=record["n"], date=record["date"],
                       min_success=teacher.min_success, version=self.version)

    def _teacher_view(self):
        """teacher.mode privileged_context: the view hook (student/privileged.py), else None."""
        if self.recipe.teacher is None or self.recipe.teacher.mode != "privileged_context":
            return None
        from miniverl.student.privileged import PrivilegedViews, task_lookup

        env = self.recipe.environment
        sizes = {"train": env.train_tasks, "eval": env.eval_tasks, "test": env.test_tasks}
        return PrivilegedViews(
            self.policy.tokenizer, tokenizer_fp=self.policy.tokenizer_fp, env_name=env.name,
            env_params=env.params,
            task_of=task_lookup(env.name, env.params, env.difficulty, env.split_seed, sizes,
                                known=self.train_tasks),
        )

    def _choose_memory(self) -> str:
        """resident or swap (DESIGN §4); ``auto`` decides from measured free memory."""
        from miniverl.student.memory import choose_memory

        wanted = self.recipe.teacher.memory
        if wanted == "swap" and self.recipe.student.quantization != "none":
            raise ConfigError(
                "teacher.memory: swap moves the student's weights off the GPU between phases, "
                f"which a {self.recipe.student.quantization} quantized student cannot do; use "
                "memory: resident or quantization: none"
            )
        strategy, reason = choose_memory(wanted, self.policy.device, self.client)
        self.run.event("memory_strategy", wanted=wanted, chosen=strategy, reason=reason)
        update_manifest(self.run, memory={"wanted": wanted, "chosen": strategy, "reason": reason})
        return strategy

    def _teacher_changed(self, new: dict, version: int, how: str) -> None:
        if new == self.teacher:  # already recorded: a retarget records itself
            return
        self._check_qualified(new)
        prev = self.teacher
        self.teacher = new
        self.run.event("teacher_changed", how=how, old=prev, new=new, version=version)
        record_teacher(self.run, version, new, how=how)

    def _open_cache(self):
        cfg = self.recipe.cache
        if not cfg.enabled or not self.recipe.needs_teacher:
            return None
        from miniverl.student.targets_cache import CacheIdentity, TargetsCache

        loss = self.recipe.loss
        root = Path(cfg.dir) if cfg.dir else self.run.targets_dir
        return TargetsCache(
            root,
            CacheIdentity(
                tokenizer_fp=self.policy.tokenizer_fp,
                vocab_size=self.policy.vocab_size,
                kind=self.kind,
                k=loss.top_k if self.kind == "topk" else self.policy.vocab_size,
                objective=loss.objective,
                temperature=loss.temperature,
            ),
        )

    # -- the loop ------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Run the recipe to the end (or to a stop request); returns what happened."""
        recipe = self.recipe
        self.run.set_status("running")
        try:
            self._setup()
            if self.resume:
                self._restore()
            self.run.event("run_started", mode=recipe.run.mode, on_policy=recipe.on_policy,
                           version=self.version, resumed=self.resume)
            eval_before = None
            if not self.resume:
                eval_before = self._evaluate().to_dict()
            status = self._loop()
            final_eval = None
            if status == "completed":
                final_eval = self._evaluate().to_dict()
            if status == "completed" or self.stop_checkpoint:
                self._checkpoint()
            self.run.event("run_completed" if status == "completed" else "run_interrupted",
                           version=self.version, steps=self.step)
            self.run.set_status(status)
        except KeyboardInterrupt:
            # A hard interrupt can land inside an optimizer step, so the parameters may be
            # half-updated: write no checkpoint now. The last one is complete (they are
            # written atomically) and `--resume` continues from it exactly.
            self.run.event("run_interrupted", version=self.version, steps=self.step,
                           checkpoint="none written; resume continues from the last one")
            self.run.set_status("interrupted", reason="KeyboardInterrupt")
            raise
        except BaseException as exc:
            self.run.event("run_failed", reason=f"{type(exc).__name__}: {exc}")
            self.run.set_status("failed", reason=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._finish_report()
        return TrainResult(
            run_dir=self.run.path, status=status, final_version=self.version, steps=self.step,
            eval_before=eval_before, eval=final_eval,
            wall_s=time.perf_counter() - self.started, counters=self._counters(),
        )

    def _loop(self) -> str:
        recipe = self.recipe
        train = recipe.train
        from miniverl.student.progress import TrainProgress

        total = total_optimizer_steps(recipe)
        if self.warmup_end is not None:  # resumed after a warm-up that ended early
            total -= train.sft_warmup_steps - self.warmup_end
        with TrainProgress(total, enabled=self.show_progress, initial=self.step) as progress:
            while self.warmup_end is None and self.step < train.sft_warmup_steps:
                if self.stop_event.is_set():
                    return "interrupted"
                self._sft_warmup_step()
                progress.update(self.step, self.last_metrics)
                if self._warmup_converged():
                    self._end_warmup("loss")
                    progress.set_total(total - (train.sft_warmup_steps - self.step))
            if self.warmup_end is None:
                self._end_warmup("steps")
            if recipe.needs_teacher and self.link is None:
                # Connect only now: under `up` the teacher loads (or is still being
                # prepared) while the student imports, evaluates and runs its SFT warm-up.
                self._connect_teacher()
                self.memory = self._choose_memory()
            if recipe.run.mode == "offline_kd" and not self.fixed_set:
                self._prepare_fixed_set()
            while self.cycle < planned_cycles(recipe):
                if self.stop_event.is_set():
                    return "interrupted"
                if train.max_wall_s is not None and self._wall() > train.max_wall_s:
                    self.run.event("wall_budget_reached", wall_s=self._wall(), version=self.version)
                    break
                self._apply_retarget()
                self._cycle()
                self.cycle += 1
                progress.update(self.step, self.last_metrics)
                if train.eval_every and self.cycle % train.eval_every == 0:
                    self._evaluate()
                if train.save_every and self.cycle % train.save_every == 0:
                    self._checkpoint()
        return "completed"

    def _cycle(self) -> None:
        mode = self.recipe.run.mode
        t0 = time.perf_counter()
        if mode == "sft":
            trajs = self._oracle_batch(self.cycle)
            t_rollout = time.perf_counter() - t0
            t1 = time.perf_counter()
            stats = self._sft(trajs)
            self._log(stats, trajs, t_rollout, 0.0, time.perf_counter() - t1)
            return
        if mode == "offline_kd":
            scored = self._fixed_batch(self.cycle)
            t1 = time.perf_counter()
            stats = self._distill(scored)
            self._log(stats, [s.traj for s in scored], 0.0, 0.0, time.perf_counter() - t1)
            return
        if mode == "dpo":
            from miniverl.student.dpo import dpo_cycle

            dpo_cycle(self)  # rollouts -> pairs -> reference scores -> DPO update
            return
        lag = self.recipe.train.max_lag if mode == "replay" else 0
        trajs, scored, t_rollout, t_wait = self._rollout_and_score(lag)
        if mode == "replay":
            self.replay_buffer.extend(scored)
            floor = self.version - lag
            self.replay_buffer = [s for s in self.replay_buffer if s.student_version >= floor]
            rng = np.random.default_rng(_episode_seed(self.recipe.run.seed, self.cycle, 99_991))
            n = min(len(self.replay_buffer), self.recipe.train.rollouts_per_cycle)
            pick = rng.choice(len(self.replay_buffer), size=n, replace=False)
            scored = [self.replay_buffer[i] for i in sorted(pick)]
        t1 = time.perf_counter()
        stats = None
        for _ in range(self.recipe.train.updates_per_batch):
            # Each update advances the version, so replay re-checks the lag per update:
            # a target max_lag old at the first update is too old at the second.
            scored = [s for s in scored if self.version - s.student_version <= lag]
            stats = self._distill(scored, early=self._early)
            self._early = None  # computed with this version's weights: one update only
        t_update = time.perf_counter() - t1 + self._early_s
        self._early_s = 0.0
        self._log(stats, trajs, t_rollout, t_wait, t_update, scored=scored)

    # -- the pieces of a cycle -----------------------------------------------------------

    def _tasks_for(self, cycle: int, n: int) -> list[Any]:
        tasks = self.train_tasks
        epoch_len = len(tasks)
        out = []
        for i in range(n):
            flat = cycle * n + i
            epoch, idx = divmod(flat, epoch_len)
            order = np.random.default_rng(self.recipe.run.seed * 7919 + epoch).permutation(
                epoch_len
            )
            out.append(tasks[int(order[idx])])
        return out

    def _oracle_batch(self, cycle: int) -> list[Trajectory]:
        env = self.recipe.environment
        tasks = self._tasks_for(cycle, self.recipe.train.rollouts_per_cycle)
        # Oracle traces are a pure function of the task: render each one once per run.
        missing = [t for t in tasks if t.id not in self._oracle_cache]
        for task, traj in zip(missing, oracle_trajectories(
            env.name, missing, self.policy.tokenizer, self.policy.tokenizer_fp, env.params
        ), strict=True):
            self._oracle_cache[task.id] = traj
        return [self._oracle_cache[t.id] for t in tasks]

    def _sft(self, trajs: list[Trajectory]) -> StepStats:
        stats = sft_step(
            self.policy, self.optimizer, self.scheduler, trajs,
            grad_accum=self.recipe.train.grad_accum,
            max_grad_norm=self.recipe.train.max_grad_norm,
            chunk_size=self.recipe.loss.chunk_size, autocast=self.autocast,
        )
        self._advance()
        return stats

    def _sft_warmup_step(self) -> None:
        t0 = time.perf_counter()
        trajs = self._oracle_batch(10_000_000 + self.step)
        stats = self._sft(trajs)
        self._warmup_losses = [*self._warmup_losses, stats.loss][-WARMUP_LOSS_WINDOW:]
        self._log(stats, trajs, 0.0, 0.0, time.perf_counter() - t0, phase="sft_warmup")

    def _warmup_converged(self) -> bool:
        """train.sft_warmup_until_loss: the last WARMUP_LOSS_WINDOW losses average below it."""
        until = self.recipe.train.sft_warmup_until_loss
        losses = self._warmup_losses
        return (until is not None and len(losses) == WARMUP_LOSS_WINDOW
                and sum(losses) / len(losses) <= until)

    def _end_warmup(self, reason: str) -> None:
        train = self.recipe.train
        if reason == "loss":
            self.warmup_end = self.step
            # The scheduler already set this step's rate for a longer warm-up: reset it.
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(self.step, self.recipe, self.warmup_end)
        else:
            self.warmup_end = min(self.step, train.sft_warmup_steps)
        if train.sft_warmup_steps == 0 or self.step != self.warmup_end:
            return  # no warm-up, or a resumed run that is past it
        losses = self._warmup_losses
        self.run.event("sft_warmup_done", step=self.step, reason=reason,
                       planned_steps=train.sft_warmup_steps,
                       mean_loss=sum(losses) / len(losses) if losses else None,
                       version=self.version)

    def _distill(self, scored: list[Scored], early: EarlyForward | None = None) -> StepStats:
        stats = distill_step(
            self.policy, self.optimizer, self.scheduler, scored,
            loss_config=self.recipe.loss, kind=self.kind,
            grad_accum=self.recipe.train.grad_accum,
            max_grad_norm=self.recipe.train.max_grad_norm, autocast=self.autocast,
            early=early,
        )
        self._advance()
        return stats

    def _advance(self) -> None:
        self.step += 1
        self.version += 1

    def _positions(self, traj: Trajectory) -> np.ndarray:
        return select_positions_for(traj, self.recipe.loss, seed=self.recipe.run.seed)

    def _rollout_and_score(self, lag: int):
        """Sample fresh rollouts with the current version and score them for it."""
        n = self.recipe.train.rollouts_per_cycle
        tasks = self._tasks_for(self.cycle, n)
        seeds = [_episode_seed(self.recipe.run.seed, self.cycle, i) for i in range(n)]
        link = self.link
        if self.memory == "swap":
            self.client.wake()
        link.begin_update(self.version, lag)
        pipelined = self.recipe.train.pipelining

        def submit(traj: Trajectory) -> None:
            link.submit(traj, self._positions(traj))

        self.policy.model.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            trajs = self.runner.run(
                tasks, policy_version=self.version, seeds=seeds,
                on_finished=submit if pipelined else None,
            )
        self.policy.model.train()
        t_rollout = time.perf_counter() - t0
        if not pipelined:
            for traj in trajs:
                submit(traj)
        self._early = None
        if pipelined and lag == 0 and self.memory != "swap":
            # The update's forward does not need the targets: run it while the teacher
            # scores the last episodes (swap keeps it after PARK, when memory is free).
            t1 = time.perf_counter()
            part = first_micro_batch(len(trajs), self.recipe.train.grad_accum)
            first = [trajs[i] for i in part]
            self._early = early_forward(
                self.policy, first, [self._positions(t) for t in first], self.autocast
            )
            self._early_s = time.perf_counter() - t1
        scored = link.collect()
        # Episodes finish (and are submitted) in any order; train in task order so a
        # pipelined update sums its loss exactly like a serial one and replay draws the
        # same rollouts from its buffer.
        rank = {id(traj): i for i, traj in enumerate(trajs)}
        scored.sort(key=lambda s: rank[id(s.traj)])
        if self.memory == "swap":
            # The update runs with the teacher's weights off the device (DESIGN §4).
            self.client.park()
        write_trajectories(self.run.trajectories_path, trajs, append=True)
        self._cache_put(scored)
        return trajs, scored, t_rollout, link.wait_s

    def _cache_put(self, scored: list[Scored]) -> None:
        if self.cache is None:
            return
        from miniverl.student.targets_cache import EntryKey

        self.cache.put_many(
            (
                EntryKey(
                    trajectory_id=s.traj.id, student_version=s.student_version,
                    teacher=self._cache_teacher(s.teacher),
                    instance=str(s.teacher.get("instance")),
                    gen=int(s.teacher.get("gen", 0)),
                ),
                {**s.arrays, "positions": s.positions_P.astype(np.int32)},
            )
            for s in scored
            if len(s.positions_P)
        )

    def _cache_teacher(self, teacher: dict) -> str:
        # Targets depend on the adapter and on what the teacher was shown, not only on
        # its name: a privileged view of the same trajectory is another entry.
        key = str(teacher.get("name"))
        if teacher.get("adapter_sha256"):
            key += f"+adapter:{teacher['adapter_sha256']}"
        if self.recipe.teacher is not None and self.recipe.teacher.mode != "standard":
            key += f"+{self.recipe.teacher.mode}"
        return key

    def _prepare_fixed_set(self) -> None:
        """offline_kd: load or build the fixed trajectories and score each once."""
        source = self.recipe.train.trajectories
        if source:
            self.fixed_set = read_trajectories(source)
            bad = [t.id for t in self.fixed_set if t.tokenizer_fp != self.policy.tokenizer_fp]
            if bad:
                raise ConfigError(
                    f"{len(bad)} trajectories in {source} were made with another tokenizer "
                    f"(first: {bad[0]}); offline KD needs the student's tokenizer"
                )
        else:
            env = self.recipe.environment
            self.fixed_set = oracle_trajectories(
                env.name, self.train_tasks, self.policy.tokenizer, self.policy.tokenizer_fp,
                env.params,
            )
        reused = self._cached_fixed_targets()
        link = self.link
        # The fixed set was sampled by another policy; its targets are bound to the
        # version that sampled it (0 for oracle traces), never to the student's.
        link.begin_update(0, 0)
        for traj in self.fixed_set:
            if traj.id not in reused:
                link.submit(traj, self._positions(traj))
        fresh = {s.traj.id: s for s in link.collect()}
        self._cache_put(list(fresh.values()))
        self.fixed_scored = [reused.get(t.id) or fresh[t.id] for t in self.fixed_set]
        scored = list(fresh.values())
        if not reused:  # a resume finds the fixed set already recorded
            write_trajectories(self.run.trajectories_path, self.fixed_set, append=True)
        self.run.event("offline_targets_scored", trajectories=len(scored),
                       reused_from_cache=len(reused),
                       positions=int(sum(len(s.positions_P) for s in scored)))

    def _cached_fixed_targets(self) -> dict[str, Scored]:
        """offline_kd: targets this teacher already produced for the fixed set (a resume)."""
        if self.cache is None:
            return {}
        name = self._cache_teacher(self.teacher)
        by_traj: dict[str, Any] = {}
        entries = self.cache.keys()
        for key in entries:
            if key.teacher == name and (key.trajectory_id not in by_traj
                                        or key > by_traj[key.trajectory_id]):
                by_traj[key.trajectory_id] = key
        out: dict[str, Scored] = {}
        for traj in self.fixed_set:
            key = by_traj.get(traj.id)
            if key is None:
                continue
            arrays = dict(self.cache.get(key))
            positions = arrays.pop("positions", None)
            if positions is None:
                continue
            out[traj.id] = Scored(traj, np.asarray(positions), arrays, key.student_version,
                                  {**self.teacher, "instance": key.instance, "gen": key.gen})
        return out

    def _fixed_batch(self, cycle: int) -> list[Scored]:
        n = min(self.recipe.train.rollouts_per_cycle, len(self.fixed_scored))
        rng = np.random.default_rng(_episode_seed(self.recipe.run.seed, cycle, 77_777))
        pick = rng.choice(len(self.fixed_scored), size=n, replace=False)
        return [self.fixed_scored[i] for i in sorted(pick)]

    # -- logging, eval, checkpoints ------------------------------------------------------

    def _wall(self) -> float:
        return time.perf_counter() - self.started

    def _counters(self) -> dict[str, Any]:
        return dict(self.client.counters) if self.client is not None else {}

    def _log(self, stats: StepStats, trajs: list[Trajectory], t_rollout: float,
             t_wait: float, t_update: float, *, scored=None, phase: str | None = None,
             extra: dict[str, Any] | None = None) -> None:
        counters = self._counters()
        positions_scored = int(sum(len(s.positions_P) for s in scored)) if scored else 0
        row = {
            "step": self.step,
            "version": self.version,
            "cycle": self.cycle,
            "mode": self.recipe.run.mode,
            "phase": phase or "train",
            "on_policy": self.recipe.on_policy and phase is None,
            "loss": stats.loss,
            "divergence": stats.divergence,
            "positions": stats.positions,
            "tokens": stats.tokens,
            "teacher": ({k: self.teacher.get(k) for k in ("name", "instance", "gen")}
                        if self.link is not None else None),
            "stale_dropped": counters.get("stale_dropped", 0),
            "time_rollout_s": t_rollout,
            "time_teacher_wait_s": t_wait,
            "time_update_s": t_update,
            "positions_scored": positions_scored,
            "positions_per_s": positions_scored / t_wait if t_wait > 0 else None,
            "bytes_sent": counters.get("bytes_sent", 0),
            "bytes_received": counters.get("bytes_received", 0),
            "lr": stats.lr,
            "grad_norm": stats.grad_norm,
            # Success of the student's own rollouts; oracle batches (SFT) have none.
            "train_success": (sum(t.verifier.success for t in trajs) / len(trajs)
                              if trajs and trajs[0].source == "rollout" else None),
            "wall_s": self._wall(),
            **(extra or {}),
        }
        self.last_metrics = row
        self.run.metric(row)

    def _evaluate(self) -> EvalSummary:
        model = self.policy.model
        model.eval()
        with torch.no_grad():
            summary = evaluate(
                model, self.policy.tokenizer, self.recipe, policy_version=self.version,
                out_dir=self.run.eval_dir, tokenizer_fp=self.policy.tokenizer_fp,
            )
        model.train()
        self.run.event("eval", version=self.version, split=summary.split,
                       success=summary.success, n=summary.n, by_difficulty=summary.by_difficulty,
                       stop_reasons=summary.stop_reasons)
        self.last_eval = summary
        return summary

    def _checkpoint(self) -> Path | None:
        if not self.checkpoints:
            return None
        from miniverl.student.checkpoint import save as save_checkpoint

        path = save_checkpoint(
            self.run.checkpoints_dir,
            model=self.policy.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            step=self.step,
            version=self.version,
            data_cursor={"cycle": self.cycle, "warmup_end": self.warmup_end,
                         "warmup_losses": self._warmup_losses},
            recipe_digest=_run_digest(self.recipe),
        )
        self.run.event("checkpoint", path=str(path), version=self.version, step=self.step)
        return path

    def _restore(self) -> None:
        from miniverl.student.checkpoint import latest as latest_checkpoint
        from miniverl.student.checkpoint import load as load_checkpoint

        path = latest_checkpoint(self.run.checkpoints_dir)
        if path is None:
            raise ConfigError(
                f"run {self.run.id} has no checkpoint to resume from; start it again without "
                "--resume"
            )
        state = load_checkpoint(path, self.policy.model, self.optimizer, self.scheduler)
        if state.recipe_digest != _run_digest(self.recipe):
            raise ConfigError(
                f"checkpoint {path.name} was written with recipe {state.recipe_digest}, this "
                f"recipe is {_run_digest(self.recipe)}; resume with the original recipe"
            )
        self.step, self.version = state.step, state.version
        self.cycle = int(state.data_cursor.get("cycle", 0))
        end = state.data_cursor.get("warmup_end")
        self.warmup_end = None if end is None else int(end)
        self._warmup_losses = [float(x) for x in state.data_cursor.get("warmup_losses", [])]
        self.run.event("resumed", checkpoint=str(path), version=self.version, step=self.step)
        if self.recipe.run.mode == "replay":
            self._restore_replay_buffer()

    def _restore_replay_buffer(self) -> None:
        """replay: rebuild the checkpointed buffer from trajectories.jsonl and the cache.

        Without it a resumed replay run would draw from an empty buffer and drift from
        the uninterrupted run. Rollouts younger than ``max_lag`` versions and older than
        the checkpoint are reloaded in the order they were sampled; their targets come
        from the targets cache (a rollout whose targets are missing is left out, counted).
        """
        from miniverl.common.errors import StaleTargetError
        from miniverl.student.teacher_link import _empty_arrays

        path = self.run.trajectories_path
        if not Path(path).is_file():
            return
        floor = self.version - self.recipe.train.max_lag
        seen: set[str] = set()
        missing = 0
        for traj in read_trajectories(path):
            if not floor <= traj.policy_version < self.version or traj.id in seen:
                continue
            seen.add(traj.id)
            positions = self._positions(traj).astype(np.int32)
            if len(positions) == 0:
                arrays = _empty_arrays(self.kind, self.recipe.loss.top_k)
                self.replay_buffer.append(Scored(traj, positions, arrays, traj.policy_version, {}))
                continue
            hit = None
            if self.cache is not None:
                try:
                    hit = self.cache.lookup(traj.id, student_version=traj.policy_version)
                except StaleTargetError:
                    hit = None
            if hit is None:
                missing += 1
                continue
            key, arrays = hit
            arrays = dict(arrays)
            cached_positions = arrays.pop("positions").astype(np.int32)
            teacher = {"name": key.teacher, "instance": key.instance, "gen": key.gen}
            self.replay_buffer.append(
                Scored(traj, cached_positions, arrays, key.student_version, teacher)
            )
        self.run.event("replay_buffer_restored", trajectories=len(self.replay_buffer),
                       missing=missing, version=self.version)

    def _apply_retarget(self) -> None:
        endpoint, self.pending_retarget = self.pending_retarget, None
        if endpoint is None or self.client is None:
            return
        old = dict(self.teacher)
        try:
            self.client.retarget(endpoint)
            try:
                self._check_qualified(teacher_identity(self.client))
            except MiniverlError:
                self.client.retarget(self.endpoint)  # back to the qualified teacher
                raise
        except Exception as exc:  # a refused swap keeps training on the old teacher
            self.run.event("teacher_swap_refused", endpoint=endpoint, reason=str(exc),
                           version=self.version)
            return
        self.endpoint = endpoint
        self.teacher = teacher_identity(self.client)
        self.run.event("teacher_changed", how="retarget", old=old, new=self.teacher,
                       version=self.version, endpoint=endpoint)
        record_teacher(self.run, self.version, self.teacher, how="retarget")

    def request_retarget(self, endpoint: str) -> None:
        """Switch teachers at the next update boundary (control socket ``RETARGET``)."""
        self.pending_retarget = endpoint

    def _finish_report(self) -> None:
        if not self.write_report:
            return
        try:
            from miniverl.student.report import build_report

            build_report(self.run.path)
        except Exception as exc:  # a report problem must not hide the run's outcome
            self.run.event("report_failed", reason=f"{type(exc).__name__}: {exc}")

    # -- context manager -----------------------------------------------------------------

    def close(self) -> None:
        if self.client is not None and hasattr(self.client, "close"):
            self.client.close()
        self.run.release()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
