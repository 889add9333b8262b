"""Mode ``opd``: strict on-policy distillation, one update read top to bottom.

:meth:`OpdMode.cycle` is the whole update, one stage per paragraph:

1. draw the tasks: the cycle's tasks, each played ``rollout.group_size`` times, each
   episode seeded by ``(run.seed, cycle, episode)``, so a resumed run draws the same;
2. sample with version ``v``; each finished episode's SCORE, tagged ``v``, leaves at
   once (``train.pipelining``), while the other episodes still sample
   (``steps.sample``, ``rollout/runner.py``, ``teacher/link.py``); with
   ``rollout.engine: vllm``, the engine's log-probs of the sampled tokens are checked
   against the trainer's (``rollout/vllm_engine.py``);
3. with pipelining and a resident teacher, the update's first forward pass, which needs
   no targets, while the teacher scores the last episodes (``updates.early_forward``);
4. collect the teacher's targets for ``v``: the client drops any reply not for ``v`` or
   not from the teacher the update is bound to, so nothing stale reaches the loss
   (``steps.collect``);
5. the loss and exactly one optimizer step (``updates.distill_step``, the objective
   the run picked at start, ``objectives/objective.py`` and ``objectives/formulas.py``);
6. ``v -> v + 1``;
7. what the cycle did goes back to the loop, which logs it (``loop.py``).

The cycle is the one place that reads the run's state: each stage it calls takes the
objects it uses (the runner, the teacher side, the policy, the settings). This module
keeps no state between cycles and does not checkpoint (``loop.py``).
"""

from __future__ import annotations

import time

from miniverl.student.train import updates
from miniverl.student.train.state import CycleResult, TrainState, group_size
from miniverl.student.train.steps import collect, sample


class OpdMode:
    """Strict on-policy distillation: nothing carries over from one cycle to the next."""

    def prepare(self, state: TrainState) -> None:
        """Nothing to prepare: every cycle samples its own batch."""

    def resume(self, state: TrainState) -> None:
        """Nothing to rebuild: the checkpoint holds everything a cycle reads."""

    def cycle(self, state: TrainState) -> CycleResult:
        """One strict on-policy update: fresh rollouts of v, scored for v, one step."""
        recipe, train, teacher, v = state.recipe, state.recipe.train, state.teacher, state.version
        # 1. Draw the tasks.
        tasks, seeds = state.tasks.episodes(state.cycle, train.rollouts_per_cycle,
                                            group_size(recipe))

        # 2. Sample with version v, each finished episode sent to the teacher.
        sampled = sample(state.runner, teacher, tasks, seeds, version=v, lag=0,
                         pipelined=train.pipelining, loss=recipe.loss, seed=recipe.run.seed)

        #    rollout.engine vllm: the engine's log-probs of the sampled tokens against the
        #    trainer's forward on them, before the step changes the trainer.
        t_check = time.perf_counter()
        gap = state.engine_check(sampled.trajs) if state.engine_check is not None else None
        t_check = time.perf_counter() - t_check

        # 3. The first micro-batch's forward while the teacher scores (swap keeps it
        #    after PARK, when the teacher's memory is free).
        early, t_early = None, 0.0
        if train.pipelining and teacher.memory != "swap" and teacher.link.keeps_positions:
            t0 = time.perf_counter()
            first = updates.first_micro_batch([len(t.tokens) for t in sampled.trajs], train)
            early = updates.early_forward(state.policy, [sampled.trajs[i] for i in first],
                                          [sampled.positions[i] for i in first])
            t_early = time.perf_counter() - t0

        # 4. Collect the teacher's targets for v.
        scored, t_wait = collect(teacher, state.run, state.cache, sampled.trajs)

        # 5. The loss and one optimizer step.
        t1 = time.perf_counter()
        stats = updates.distill_step(state.policy, state.optimizer, state.scheduler, scored,
                                     objective=state.objective, train=train, early=early)

        # 6. v -> v + 1.
        state.advance()

        # 7. To the loop, which logs it.
        t_update = time.perf_counter() - t1 + t_early
        extra = None
        if gap is not None:  # rollout.engine vllm: the engine-trainer log-prob gap
            extra = {"engine_logprob_gap_max": gap.max_abs,
                     "engine_logprob_gap_mean": gap.mean_abs,
                     "engine_logprob_gap_tokens": gap.tokens, "engine_dtype": gap.dtype,
                     "time_engine_check_s": t_check}
        return CycleResult(stats, sampled.trajs, sampled.t_rollout, t_wait, t_update,
                           scored=scored, extra=extra)
