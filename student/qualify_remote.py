"""Measure a running teacher over the wire (``miniverl qualify-teacher RECIPE --teacher E``).

A teacher that runs elsewhere (another machine, a shared ``miniverl teacher serve``, a
standalone program that speaks ``mvl-score/1``) cannot be loaded here, but it can be
measured the way an in-process teacher is: :class:`RemoteGreedyLM` makes it look like a
causal LM to the ordinary rollout code (:func:`~miniverl.student.eval.evaluate`) and
decodes greedily from ``SCORE`` replies. Each decoding step sends every episode's whole
token sequence with one placeholder token appended and asks for the top-1 at the last
real token: a causal model's distribution there does not depend on what follows, so
that top-1 is the teacher's greedy next token. The wire has no KV cache, so each step
costs the teacher a forward pass over whole sequences: seconds for the toy models, slow
for long episodes of large ones.

The record (``student/qualify.py``) names the identity the teacher announced in
``HELLO_OK`` and where it was measured (``endpoint``). It matches a live teacher by the
content of its model directory when that directory is visible from here, else by the
model string (``common/qualification.py``).

This module loads no teacher weights and gates nothing; the teacher must share the
student's tokenizer (the handshake refuses anything else).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from miniverl.common.errors import ConfigError, MiniverlError
from miniverl.common.modeling import load_tokenizer, resolve_model_dir
from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.protocol.engine_client import EngineTeacherClient, is_engine_endpoint
from miniverl.protocol.scoring_client import ScoringClient, TeacherChanged
from miniverl.protocol.sync_client import SyncTeacherClient
from miniverl.student.eval import evaluate
from miniverl.student.qualify import (
    check_one_environment,
    check_split,
    privileged_view,
    record_from_eval,
)

PLACEHOLDER_ID = 0  # any id the vocabulary has; nothing reads what it predicts


@dataclass
class TokenCache:
    """The "KV cache" of :class:`RemoteGreedyLM`: each row's tokens so far and how many
    attention-mask columns they cover (left padding included)."""

    rows: list[list[int]]
    width: int

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.rows = [list(row) for row in self.rows for _ in range(repeats)]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.rows = [self.rows[i] for i in indices.tolist()]


@dataclass
class RemoteOutput:
    """What the rollout code reads of a forward pass: last-position logits and the cache."""

    logits: torch.Tensor  # [B, 1, V]
    past_key_values: TokenCache


class RemoteGreedyLM(torch.nn.Module):
    """A causal LM whose forward pass asks a teacher for its greedy next token.

    For greedy decoding only: the logits are 0 at the teacher's top-1 and ``-inf``
    elsewhere, so an argmax reads the teacher's choice and nothing else is claimed.
    """

    def __init__(self, client: ScoringClient, vocab_size: int, *, max_tokens: int,
                 max_inflight: int):
        super().__init__()
        # The rollout runner takes its device from the parameters: a CPU anchor, no weights.
        self.anchor = torch.nn.Parameter(torch.zeros(0), requires_grad=False)
        self.client = client
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.max_inflight = max_inflight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                past_key_values: TokenCache | None = None, use_cache: bool = True,
                logits_to_keep: int = 1, **_: Any) -> RemoteOutput:
        B, L = input_ids.shape
        before = past_key_values.rows if past_key_values is not None else [[]] * B
        width = past_key_values.width if past_key_values is not None else 0
        ids = input_ids.tolist()
        # Columns of the mask: the cached ones, then this call's; 0 marks left padding.
        mask = attention_mask.tolist() if attention_mask is not None else [[1] * L] * B
        rows = [before[b] + [t for j, t in enumerate(ids[b]) if mask[b][width + j]]
                for b in range(B)]
        top1 = self.next_tokens(rows)
        logits = torch.full((B, 1, self.vocab_size), float("-inf"))
        logits[torch.arange(B), 0, torch.tensor(top1)] = 0.0
        return RemoteOutput(logits, TokenCache(rows, width + L))

    def next_tokens(self, rows: list[list[int]]) -> list[int]:
        """The teacher's greedy next token after each row: one SCORE per chunk of rows."""
        chunks: list[list[int]] = []
        size = 0
        for b, row in enumerate(rows):
            need = len(row) + 1
            if need > self.max_tokens:
                raise ConfigError(
                    f"an episode of {len(row)} tokens does not fit the teacher's max_tokens "
                    f"{self.max_tokens}; lower rollout.max_total_tokens"
                )
            if not chunks or size + need > self.max_tokens:
                chunks.append([])
                size = 0
            chunks[-1].append(b)
            size += need
        out = [0] * len(rows)
        for start in range(0, len(chunks), self.max_inflight):
            sent = [(chunk, self._submit([rows[b] for b in chunk]))
                    for chunk in chunks[start:start + self.max_inflight]]
            try:
                replies = self.client.wait([rid for _, rid in sent])
            except TeacherChanged as exc:
                raise MiniverlError(
                    f"the teacher changed during the measurement ({exc}); run it again"
                ) from None
            for chunk, rid in sent:
                for b, token in zip(chunk, replies[rid].arrays["ids"][:, 0].tolist(),
                                    strict=True):
                    out[b] = int(token)
        return out

    def _submit(self, rows: list[list[int]]) -> int:
        tokens_N = np.array([t for row in rows for t in [*row, PLACEHOLDER_ID]], np.int32)
        cu_seqlens = np.cumsum([0] + [len(row) + 1 for row in rows]).astype(np.int32)
        positions_P = (cu_seqlens[1:] - 2).astype(np.int32)  # each row's last real token
        return self.client.submit(tokens_N, cu_seqlens, positions_P, kind="topk", k=1,
                                  temperature=1.0, deterministic=True)


def engine_client(recipe: Any, endpoint: str, tokenizer: Any,
                  tokenizer_fp: str) -> EngineTeacherClient:
    """A client of the engine server at ``endpoint``: the recipe's own (``teacher.api``,
    ``teacher.model``'s name) or another one (its API and its one served model found at
    the handshake). Its ``/v1/completions`` (``/generate``) plays each greedy step: the
    top-1 of the prompt log-probs at the last real token."""
    teacher = recipe.teacher
    own = teacher is not None and teacher.endpoint == endpoint and teacher.api is not None
    return EngineTeacherClient(
        endpoint, flavour=teacher.api if own else "auto",
        model=(teacher.model.path or teacher.model.hub_id) if own else None,
        tokenize=lambda text: tokenizer.encode(text, add_special_tokens=False),
        tokenizer_fp=tokenizer_fp, vocab_size=len(tokenizer),
        tokenizer_name=f"the student's tokenizer {tokenizer.name_or_path!r}",
        bos_id=getattr(tokenizer, "bos_token_id", None),
        api_key_env=teacher.api_key_env if teacher is not None else None,
        request_timeout_s=recipe.runtime.request_timeout_s,
    )


def measure_endpoint(
    recipe: Any,
    endpoint: str,
    *,
    split: str = "eval",
    max_tasks: int | None = None,
    curve: Any = None,
    offline: bool = False,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Greedy success of the teacher serving at ``endpoint`` on ``split``; the record."""
    check_split(split)
    check_one_environment(recipe)
    tokenizer = load_tokenizer(resolve_model_dir(recipe.student.model, offline=offline))
    tokenizer_fp = fingerprint_tokenizer(tokenizer)
    rt = recipe.runtime
    if is_engine_endpoint(endpoint):  # a vLLM or SGLang server (docs/engine-teachers.md)
        client = engine_client(recipe, endpoint, tokenizer, tokenizer_fp)
    else:
        client = SyncTeacherClient(
            endpoint, tokenizer_fp=tokenizer_fp, vocab_size=len(tokenizer),
            client_name="miniverl-qualify", heartbeat_ms=rt.heartbeat_ms,
            request_timeout_s=rt.request_timeout_s,
            unavailable_timeout_s=max(timeout_s, rt.unavailable_timeout_s), curve=curve,
        )
    try:
        hello = client.connect(timeout_s)
        client.bind()  # replies from a reloaded or restarted teacher are not mixed in
        model = RemoteGreedyLM(client, hello.vocab_size, max_tokens=hello.limits.max_tokens,
                               max_inflight=hello.limits.max_inflight)
        greedy = recipe.model_copy(
            update={"eval": recipe.eval.model_copy(update={"greedy": True})})
        summary = evaluate(model, tokenizer, greedy, split=split, policy_version=0,
                           tokenizer_fp=tokenizer_fp, max_tasks=max_tasks,
                           privileged=privileged_view(recipe))
    finally:
        client.close()
    identity = hello.teacher.model_dump()
    visible = Path(identity["model"]).expanduser()
    record = record_from_eval(summary.to_dict(), recipe, identity=identity,
                              model_dir=visible if visible.is_dir() else None,
                              tokenizer_fp=tokenizer_fp)
    record["endpoint"] = endpoint
    return record
