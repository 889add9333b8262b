"""Batched multi-turn rollouts in tool environments, with exact token provenance.

:class:`RolloutRunner` plays up to ``rollout.batch_size`` episodes at once. Each
round, every active episode needs one assistant turn: their sequences are left-padded
into one batch (the system block every episode shares is prefilled once per ``run``
and its KV reused by every row and turn), prefilled, then decoded token by token over
a KV cache; an
episode leaves the batch (its cache rows are dropped) as soon as it samples
``<|im_end|>`` or reaches its token budget. Then each episode's tool calls run in its
own environment instance, the results are rendered by the chat template as context
(:class:`~miniverl.student.rollout.chat.EpisodeBuilder`), and finished episodes are replaced by
waiting ones (continuous batching at turn granularity).

Sampling is reproducible per episode: every episode owns a ``torch.Generator`` seeded
with its seed and draws exactly one uniform number per sampled token (inverse-CDF
sampling), so an episode's randomness does not depend on which others share its batch.

This module does not score, train or talk to the teacher. ``on_finished`` hands each
trajectory out as soon as its episode ends (the trainer's pipelined-scoring hook).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import RolloutConfig
from miniverl.common.shared_prefix import cache_kwarg, output_cache
from miniverl.common.trajectory import (
    SpanType,
    StopReason,
    ToolCallStats,
    Trajectory,
    VerifierResult,
)
from miniverl.student.environments import get_environment
from miniverl.student.environments.mixture import Mixture
from miniverl.student.rollout.chat import EpisodeBuilder, parse_error_result
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
    # were not drawn by sampling (greedy). turn_logprobs: the last _generate's, per id.
    sampling_logprobs: list[float] | None = field(default_factory=list)
    turn_logprobs: list[float] | None = None


def sample_next(
    logits_B_V: torch.Tensor,
    generators: Sequence[torch.Generator],
    *,
    greedy: bool,
    temperature: float,
    top_p: float,
) -> torch.Tensor:
    """One token per row: argmax, or temperature + top-p sampling by inverse CDF.

    Row ``b`` consumes exactly one draw from ``generators[b]``, so its sample depends
    only on its own logits and generator, not on the other rows.
    """
    return sample_with_logprobs(
        logits_B_V, generators, greedy=greedy, temperature=temperature, top_p=top_p
    )[0]


def sample_with_logprobs(
    logits_B_V: torch.Tensor,
    generators: Sequence[torch.Generator],
    *,
    greedy: bool,
    temperature: float,
    top_p: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`sample_next` and ``logq_B``, the float32 log-prob each drawn token had under
    the distribution it was drawn from (temperature and top-p applied, renormalised): the
    sampling-time log-prob the importance ratio of ``loss.importance_ratio_cap`` divides
    by. ``logq_B`` is None for argmax (nothing was drawn)."""
    if greedy or temperature <= 0.0:
        return logits_B_V.argmax(dim=-1), None
    probs_B_V = torch.softmax(logits_B_V.float() / temperature, dim=-1)
    order_B_V = None
    if top_p < 1.0:
        # Keep the smallest prefix (by probability) whose mass reaches top_p; the most
        # likely token always stays. Without top-p no sort is needed (hot path).
        probs_B_V, order_B_V = probs_B_V.sort(dim=-1, descending=True)
        drop_B_V = (probs_B_V.cumsum(dim=-1) - probs_B_V) >= top_p
        probs_B_V = probs_B_V.masked_fill(drop_B_V, 0.0)
    cum_B_V = probs_B_V.cumsum(dim=-1)
    u_B = torch.cat([torch.rand(1, generator=g) for g in generators]).to(cum_B_V.device)
    target_B1 = (u_B * cum_B_V[:, -1]).unsqueeze(-1)
    idx_B = torch.searchsorted(cum_B_V, target_B1, right=True)
    # Rounding can put the draw past the last token with mass; step back onto it.
    last_B1 = (cum_B_V < cum_B_V[:, -1:]).sum(dim=-1, keepdim=True)
    idx_B = torch.minimum(idx_B, last_B1)
    # The drawn token's share of the mass it was drawn from (p <= the total, so <= 0).
    logq_B = (probs_B_V.gather(-1, idx_B).log() - cum_B_V[:, -1:].log()).squeeze(-1)
    if order_B_V is not None:
        idx_B = order_B_V.gather(-1, idx_B)
    return idx_B.squeeze(-1), logq_B.clamp(max=0.0)


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
    ):
        """``ignore_stop`` never ends a turn at ``<|im_end|>`` so every turn samples
        exactly ``max_new_tokens_per_turn`` tokens (fixed-length benchmarks only).
        ``privileged`` plays the privileged teacher's view (``teacher.mode:
        privileged_context``): every system message also carries
        ``env.privileged_context(task)``, as ``rollout/privileged.py`` renders it for
        scoring, so a teacher is qualified on the view it scores with. ``mixture``
        (a recipe's ``environments``): each task is played in the environment its id
        belongs to, with that environment's params, and tagged with its name; tasks of
        no mixture are refused."""
        self.model = model
        self.tokenizer = tokenizer
        self.env_name = env_name
        self.env_params = dict(env_params or {})
        self.tokenizer_fp = tokenizer_fp
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.ignore_stop = ignore_stop
        self.privileged = privileged
        # The privileged teacher's view of each episode's system message, picked once
        # (None: the environment's own).
        self._privileged_system = privileged_system if privileged else None
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
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
        self._cache_kwarg = cache_kwarg(model)
        self._prefix: tuple[list[int], Any] | None = None

    # -- public --------------------------------------------------------------------

    def run(
        self,
        tasks: Sequence[Any],
        *,
        policy_version: int,
        seeds: Sequence[int] | None = None,
        greedy: bool = False,
        on_finished: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Play one episode per task; trajectories come back in task order.

        ``seeds[i]`` seeds episode ``i`` (default: each task's own seed). The same
        tasks, seeds and weights give the same trajectories whatever the batch size.
        """
        if seeds is None:
            seeds = [int(t.seed) for t in tasks]
        if len(seeds) != len(tasks):
            raise ConfigError(
                f"got {len(seeds)} seeds for {len(tasks)} tasks; pass one seed per task"
            )
        results: list[Trajectory | None] = [None] * len(tasks)
        waiting = list(range(len(tasks)))
        active: dict[int, _Episode] = {}
        was_training = self.model.training
        self.model.eval()
        self._prefix = None  # weights may have changed since the last run
        try:
            while waiting or active:
                while waiting and len(active) < self.batch_size:
                    i = waiting.pop(0)
                    ep = self._start(tasks[i], int(seeds[i]))
                    if ep.stop is not None:
                        self._finish(i, ep, results, policy_version, on_finished)
                    else:
                        active[i] = ep
                if not active:
                    continue
                order = list(active)
                turns = self._generate([active[i] for i in order], greedy=greedy)
                for i, ids in zip(order, turns, strict=True):
                    ep = active[i]
                    self._after_turn(ep, ids)
                    if ep.stop is not None:
                        del active[i]
                        self._finish(i, ep, results, policy_version, on_finished)
        finally:
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
        builder = EpisodeBuilder(self.tokenizer, system,
                                 task.prompt, env.tool_specs())
        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed)
        ep = _Episode(task=task, seed=seed, env_name=name, env=env, builder=builder,
                      generator=gen)
        if len(builder.tokens) >= self.max_total:
            ep.stop = StopReason.MAX_TOKENS
        return ep

    def _after_turn(self, ep: _Episode, ids: list[int]) -> None:
        # add_model_turn appends every id verbatim as a model-span token, so the
        # episode's log-probs stay aligned with its model tokens; a turn whose ids this
        # runner did not draw (greedy, or handed in) records none for the episode.
        logq, ep.turn_logprobs = ep.turn_logprobs, None
        if ep.sampling_logprobs is not None:
            if logq is None or len(logq) != len(ids):
                ep.sampling_logprobs = None
            else:
                ep.sampling_logprobs.extend(logq)
        turn = ep.builder.add_model_turn(ids)
        ep.turns += 1
        if not turn.complete:
            ep.stop = StopReason.MAX_TOKENS
            return
        if turn.is_final:
            ep.answer = turn.answer
            ep.stop = StopReason.FINAL_ANSWER
            return
        results: list[str] = []
        any_parse_error = False
        repeated = False
        by_name = dict(ep.stats.by_name)
        total, parse_errors, failed = ep.stats.total, ep.stats.parse_errors, ep.stats.failed
        for call in turn.calls:
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

    def _finish(self, i, ep, results, policy_version, on_finished) -> None:
        if ep.stop == StopReason.FINAL_ANSWER:
            verdict = ep.env.verify(ep.task, ep.answer or "")
        else:
            verdict = VerifierResult(
                success=False, score=0.0, reason=f"no final answer ({ep.stop.value})"
            )
        traj = Trajectory(
            id=f"{ep.env_name}/{ep.task.id}/v{policy_version}/s{ep.seed}",
            tokens=ep.builder.tokens,
            spans=ep.builder.spans,
            policy_version=policy_version,
            tokenizer_fp=self.tokenizer_fp,
            environment=ep.env_name,
            task_id=ep.task.id,
            split=ep.task.split,
            difficulty=ep.task.difficulty,
            stop_reason=ep.stop,
            tool_calls=ep.stats,
            verifier=verdict,
            seed=ep.seed,
            source="rollout",
            messages=ep.builder.messages,
            sampling_logprobs=_float32_values(ep.sampling_logprobs),
        )
        results[i] = traj
        if on_finished is not None:
            on_finished(traj)

    # -- the hot path: one assistant turn for a batch of episodes --------------------

    @torch.inference_mode()
    def _shared_prefix(self, episodes: list[_Episode]) -> tuple[int, Any]:
        """(length, KV cache) of the system span all ``episodes`` share, or (0, None)."""
        first = episodes[0].builder
        if not first.spans or first.spans[0].type != SpanType.SYSTEM:
            return 0, None
        prefix = first.tokens[: first.spans[0].end]
        P = len(prefix)
        for ep in episodes:
            toks = ep.builder.tokens
            if len(toks) <= P or toks[:P] != prefix:
                return 0, None
        if self._prefix is None or self._prefix[0] != prefix:
            ids_1_P = torch.tensor([prefix], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids_1_P, use_cache=True, logits_to_keep=1)
            self._prefix = (prefix, output_cache(out))
        return P, self._prefix[1]


    @torch.inference_mode()
    def _generate(self, episodes: list[_Episode], *, greedy: bool) -> list[list[int]]:
        B = len(episodes)
        prompts = [ep.builder.tokens for ep in episodes]
        budgets = [min(self.max_new, self.max_total - len(p)) for p in prompts]
        stop_ids = torch.tensor(
            [] if self.ignore_stop else sorted(episodes[0].builder.stop_ids), device=self.device
        )
        # Every episode of an environment opens with the same system block; its KV is
        # computed once per run() and reused by every row and turn (prefix caching).
        P, prefix_cache = self._shared_prefix(episodes)
        L = max(len(p) for p in prompts) - P
        input_ids_B_L = torch.full((B, L), self.pad_id, dtype=torch.long)
        mask_B_L = torch.zeros((B, P + L), dtype=torch.long)
        mask_B_L[:, :P] = 1
        for b, p in enumerate(prompts):
            rest = p[P:]
            input_ids_B_L[b, L - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            mask_B_L[b, P + L - len(rest) :] = 1
        input_ids_B_L = input_ids_B_L.to(self.device)
        mask_B_L = mask_B_L.to(self.device)
        # Padding sits between the shared prefix and each row's own tokens; the
        # position ids skip it, so every token keeps the position it has unpadded.
        pos_B_L = (mask_B_L.cumsum(-1) - 1).clamp(min=0)[:, P:]
        kwargs: dict[str, Any] = {}
        if prefix_cache is not None:
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(B)
            kwargs[self._cache_kwarg] = cache
        out = self.model(
            input_ids=input_ids_B_L,
            attention_mask=mask_B_L,
            position_ids=pos_B_L,
            use_cache=True,
            logits_to_keep=1,
            **kwargs,
        )
        cache = output_cache(out)
        logits_B_V = out.logits[:, -1, :]
        next_pos_B = pos_B_L[:, -1] + 1

        generated: list[list[int]] = [[] for _ in range(B)]
        drawn: list[list[float | None]] = [[] for _ in range(B)]
        rows = list(range(B))  # episode index of each batch row still decoding
        while True:
            gens = [episodes[r].generator for r in rows]
            next_B, logq_B = sample_with_logprobs(
                logits_B_V, gens, greedy=greedy, temperature=self.temperature, top_p=self.top_p
            )
            stopped_B = torch.isin(next_B, stop_ids) if len(stop_ids) else None
            next_list = next_B.tolist()
            logq_list = logq_B.float().tolist() if logq_B is not None else None
            stopped = stopped_B.tolist() if stopped_B is not None else [False] * len(rows)
            keep: list[int] = []
            for j, r in enumerate(rows):
                generated[r].append(next_list[j])
                drawn[r].append(None if logq_list is None else logq_list[j])
                if not stopped[j] and len(generated[r]) < budgets[r]:
                    keep.append(j)
            if not keep:
                break
            if len(keep) < len(rows):
                keep_t = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(keep_t)
                mask_B_L = mask_B_L[keep_t]
                next_pos_B = next_pos_B[keep_t]
                next_B = next_B[keep_t]
                rows = [rows[j] for j in keep]
            mask_B_L = torch.cat([mask_B_L, mask_B_L.new_ones((len(rows), 1))], dim=1)
            out = self.model(
                input_ids=next_B.unsqueeze(-1),
                attention_mask=mask_B_L,
                position_ids=next_pos_B.unsqueeze(-1),
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kwarg: cache},
            )
            cache = output_cache(out)
            logits_B_V = out.logits[:, -1, :]
            next_pos_B = next_pos_B + 1
        for ep, logq in zip(episodes, drawn, strict=True):
            ep.turn_logprobs = None if None in logq else logq
        return generated
