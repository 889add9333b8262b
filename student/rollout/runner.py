"""Batched multi-turn rollouts in tool environments, with exact token provenance.

:class:`RolloutRunner` plays up to ``rollout.batch_size`` episodes at once. Each
round, every active episode needs one assistant turn: a sampling engine
(:mod:`~miniverl.student.rollout.engine`; by default
:class:`~miniverl.student.rollout.hf_engine.HFEngine`, the policy over a KV cache)
samples it for the whole batch. Then each episode's tool calls run in its own
environment instance, the results are rendered by the chat template as context
(:class:`~miniverl.student.rollout.chat.EpisodeBuilder`), and finished episodes are
replaced by waiting ones (continuous batching at turn granularity).

Sampling is reproducible per episode: every episode owns a ``torch.Generator`` seeded
with its seed, which only its own turns draw from, so an episode's randomness does not
depend on which others share its batch.

This module does not decode, score, train or talk to the teacher. ``on_finished``
hands each trajectory out as soon as its episode ends (the trainer's pipelined-scoring
hook).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import RolloutConfig
from miniverl.common.trajectory import (
    SpanType,
    StopReason,
    ToolCallStats,
    Trajectory,
    VerifierResult,
)
from miniverl.student.environments import get_environment
from miniverl.student.environments.mixture import Mixture
from miniverl.student.rollout.chat import (
    EpisodeBuilder,
    ParsedCall,
    parse_error_result,
    stop_token_ids,
)
from miniverl.student.rollout.engine import SampledTurn, Sampling, SamplingEngine, TurnRequest
from miniverl.student.rollout.hf_engine import HFEngine
from miniverl.student.rollout.privileged import privileged_system

MAX_CONSECUTIVE_PARSE_ERRORS = 2
MAX_REPEATED_CALLS = 3


@dataclass
class _Episode:
    task: Any
    seed: int
    env_name: str
    env: Any
    builder: EpisodeBuilder
    generator: torch.Generator
    turns: int = 0
    parse_streak: int = 0
    calls_seen: Counter = field(default_factory=Counter)
    stats: ToolCallStats = field(default_factory=ToolCallStats)
    stop: StopReason | None = None
    answer: str | None = None
    # log q(y) of every model-span token so far (float32 values); None once a turn's ids
    # were not drawn by sampling (greedy).
    sampling_logprobs: list[float] | None = field(default_factory=list)


def _float32_values(values: list[float] | None) -> list[float] | None:
    """Each value as the shortest decimal that reads back as the same float32, so a
    trajectory line stores ~10 characters per token, not a double's 17-18."""
    if values is None:
        return None
    return [float(str(v)) for v in np.asarray(values, dtype=np.float32)]


class RolloutRunner:
    """Plays episodes of one environment (or of a mixture's, each task in its own) with
    a causal LM; returns trajectories."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        env_name: str,
        env_params: dict[str, Any] | None = None,
        rollout: RolloutConfig,
        tokenizer_fp: str,
        device: Any = None,
        ignore_stop: bool = False,
        privileged: bool = False,
        mixture: Mixture | None = None,
        autocast: Any = None,
        engine: SamplingEngine | None = None,
    ):
        """``ignore_stop`` never ends a turn at ``<|im_end|>`` so every turn samples
        exactly ``max_new_tokens_per_turn`` tokens (fixed-length benchmarks only).
        ``privileged`` plays the privileged teacher's view (``teacher.mode:
        privileged_context``): every system message also carries
        ``env.privileged_context(task)``, as ``rollout/privileged.py`` renders it for
        scoring, so a teacher is qualified on the view it scores with. ``mixture``
        (a recipe's ``environments``): each task is played in the environment its id
        belongs to, with that environment's params, and tagged with its name; tasks of
        no mixture are refused. ``autocast`` (the update's, ``state.make_autocast``):
        sampling computes in the recipe's dtype, as the update does (a 4-bit student's
        float32 embedding would otherwise carry float32 through every layer).
        ``engine`` samples the turns (default: :class:`HFEngine` over ``model``)."""
        self.model = model
        self._autocast = autocast
        self.tokenizer = tokenizer
        self.env_name = env_name
        self.env_params = dict(env_params or {})
        self.tokenizer_fp = tokenizer_fp
        self.ignore_stop = ignore_stop
        self.privileged = privileged
        # The privileged teacher's view of each episode's system message, picked once
        # (None: the environment's own).
        self._privileged_system = privileged_system if privileged else None
        self.max_turns = rollout.max_turns
        self.max_new = rollout.max_new_tokens_per_turn
        self.max_total = rollout.max_total_tokens
        self.temperature = float(rollout.temperature)
        self.top_p = float(rollout.top_p)
        self.batch_size = rollout.batch_size
        get_environment(env_name, **self.env_params)  # fail early on a bad name or params
        # A mixture's environment per task id (None: every task is env_name's).
        self._environment_of = None if mixture is None else mixture.environment_of
        self._params_of = {env_name: self.env_params} if mixture is None else mixture.params
        for name, params in (mixture.params.items() if mixture is not None else ()):
            get_environment(name, **params)
        if engine is None:
            pad = tokenizer.pad_token_id
            engine = HFEngine(model, pad_id=int(pad if pad is not None else tokenizer.eos_token_id),
                              device=torch.device(device) if device is not None
                              else next(model.parameters()).device)
        self.engine = engine
        self._stop_ids = frozenset() if ignore_stop else frozenset(stop_token_ids(tokenizer))

    # -- public --------------------------------------------------------------------

    def run(self, tasks: Sequence[Any], *, policy_version: int,
            seeds: Sequence[int] | None = None, greedy: bool = False,
            on_finished: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        """Play one episode per task; trajectories come back in task order.

        ``seeds[i]`` seeds episode ``i`` (default: each task's own seed). The same
        tasks, seeds and weights give the same trajectories whatever the batch size.
        """
        if seeds is None:
            seeds = [int(t.seed) for t in tasks]
        if len(seeds) != len(tasks):
            raise ConfigError(f"got {len(seeds)} seeds for {len(tasks)} tasks; "
                              "pass one seed per task")
        sampling = Sampling(greedy=greedy, temperature=self.temperature, top_p=self.top_p,
                            stop_ids=self._stop_ids)
        emit = on_finished if on_finished is not None else (lambda traj: None)
        results: list[Trajectory | None] = [None] * len(tasks)
        waiting = list(range(len(tasks)))
        active: dict[int, _Episode] = {}
        was_training = self.model.training
        self.model.eval()
        self.engine.reset()  # weights may have changed since the last run
        try:
            while waiting or active:
                while waiting and len(active) < self.batch_size:
                    i = waiting.pop(0)
                    ep = self._start(tasks[i], int(seeds[i]))
                    if ep.stop is not None:
                        results[i] = traj = self._finish(ep, policy_version)
                        emit(traj)
                    else:
                        active[i] = ep
                if not active:
                    continue
                order = list(active)
                with self._autocast or contextlib.nullcontext():
                    turns = self.engine.sample([self._request(active[i]) for i in order], sampling)
                for i, sampled in zip(order, turns, strict=True):
                    ep = active[i]
                    self._after_turn(ep, sampled)
                    if ep.stop is not None:
                        del active[i]
                        results[i] = traj = self._finish(ep, policy_version)
                        emit(traj)
        finally:
            self.engine.release()
            if was_training:
                self.model.train()
        return [t for t in results if t is not None]

    # -- episode bookkeeping -------------------------------------------------------

    def _start(self, task: Any, seed: int) -> _Episode:
        of = self._environment_of
        name = self.env_name if of is None else of.get(task.id)
        if name is None:
            raise ConfigError(f"task {task.id} belongs to no environment of this run's mixture; "
                              "play it with a runner of its own environment")
        env = get_environment(name, **self._params_of[name])
        env.reset(task)
        # Privileged: each episode's system block is its own, no shared prefix to cache.
        system = (env.system_prompt() if self._privileged_system is None
                  else self._privileged_system(env, task))
        builder = EpisodeBuilder(self.tokenizer, system, task.prompt, env.tool_specs())
        ep = _Episode(task=task, seed=seed, env_name=name, env=env, builder=builder,
                      generator=torch.Generator(device="cpu").manual_seed(seed))
        if len(builder.tokens) >= self.max_total:
            ep.stop = StopReason.MAX_TOKENS
        return ep

    def _request(self, ep: _Episode) -> TurnRequest:
        tokens, spans = ep.builder.tokens, ep.builder.spans
        system = spans[0].end if spans and spans[0].type == SpanType.SYSTEM else 0
        return TurnRequest(tokens=tokens, budget=min(self.max_new, self.max_total - len(tokens)),
                           generator=ep.generator, prefix_len=system)

    def _after_turn(self, ep: _Episode, sampled: SampledTurn) -> None:
        # add_model_turn appends every id verbatim as a model-span token, so the
        # episode's log-probs stay aligned with its model tokens; a turn whose ids were
        # not drawn (greedy, or handed in) records none for the episode.
        if ep.sampling_logprobs is not None:
            if sampled.logprobs is None or len(sampled.logprobs) != len(sampled.ids):
                ep.sampling_logprobs = None
            else:
                ep.sampling_logprobs.extend(sampled.logprobs)
        turn = ep.builder.add_model_turn(sampled.ids)
        ep.turns += 1
        if not turn.complete:
            ep.stop = StopReason.MAX_TOKENS
        elif turn.is_final:
            ep.answer, ep.stop = turn.answer, StopReason.FINAL_ANSWER
        else:
            self._run_tools(ep, turn.calls)

    def _run_tools(self, ep: _Episode, calls: list[ParsedCall]) -> None:
        """Run a turn's tool calls in the episode's environment and append their results
        as context, or end the episode: too many malformed turns in a row, a call
        repeated too often, its last turn, or no room left for the results."""
        results: list[str] = []
        any_parse_error = False
        repeated = False
        by_name = dict(ep.stats.by_name)
        total, parse_errors, failed = ep.stats.total, ep.stats.parse_errors, ep.stats.failed
        for call in calls:
            total += 1
            if call.error is not None:
                parse_errors += 1
                any_parse_error = True
                results.append(parse_error_result(call))
                continue
            by_name[call.name] = by_name.get(call.name, 0) + 1
            ep.calls_seen[call.key()] += 1
            repeated = repeated or ep.calls_seen[call.key()] >= MAX_REPEATED_CALLS
            result = ep.env.step(call.name, call.arguments)
            if result.startswith("error"):
                failed += 1
            results.append(result)
        ep.stats = ToolCallStats(
            total=total, parse_errors=parse_errors, failed=failed, by_name=by_name
        )
        ep.parse_streak = ep.parse_streak + 1 if any_parse_error else 0
        if ep.parse_streak >= MAX_CONSECUTIVE_PARSE_ERRORS:
            ep.stop = StopReason.PARSE_ERRORS
        elif repeated:
            ep.stop = StopReason.REPEATED_CALLS
        elif ep.turns >= self.max_turns:
            ep.stop = StopReason.MAX_TURNS
        elif not ep.builder.add_tool_results(results, max_tokens=self.max_total):
            ep.stop = StopReason.MAX_TOKENS

    def _finish(self, ep: _Episode, policy_version: int) -> Trajectory:
        """The ended episode as a trajectory of ``policy_version``, verified if it
        gave a final answer."""
        assert ep.stop is not None
        task, builder, stop = ep.task, ep.builder, ep.stop
        verdict = (ep.env.verify(task, ep.answer or "") if stop == StopReason.FINAL_ANSWER
                   else VerifierResult(success=False, score=0.0,
                                       reason=f"no final answer ({stop.value})"))
        return Trajectory(
            id=f"{ep.env_name}/{task.id}/v{policy_version}/s{ep.seed}", tokens=builder.tokens,
            spans=builder.spans, policy_version=policy_version, tokenizer_fp=self.tokenizer_fp,
            environment=ep.env_name, task_id=task.id, split=task.split, difficulty=task.difficulty,
            stop_reason=stop, tool_calls=ep.stats, verifier=verdict, seed=ep.seed, source="rollout",
            messages=builder.messages, sampling_logprobs=_float32_values(ep.sampling_logprobs))
