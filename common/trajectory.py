"""The trajectory data model: token ids, typed spans that tile them, derived masks.

A trajectory is what one episode produced: a flat list of token ids and a partition
of ``[0, len(tokens))`` into typed spans. Context spans (``system``, ``user``,
``tool_result``) are never trained on; model spans (``assistant_text``,
``assistant_tool_call``, ``assistant_final``) hold the ids the model sampled,
verbatim. Masks are *derived* from spans. When a file stores a mask, it is
re-derived on read and a mismatch is a :class:`ProvenanceError`, never training data.
Each JSONL line is sealed: its ``digest`` field is the sha256 of the rest of the line's
canonical JSON, so a flipped byte is refused with ``file:line``; lines written before
sealing still read, with one warning per file.

The distribution that predicts token ``j`` lives at position ``j - 1``; position 0
predicts nothing of its own sequence, and token 0 is always context.
:func:`select_positions` chooses which of a trajectory's positions a loss is computed
on, by the rule the recipe's ``loss.positions`` names:

* ``all``: every position whose next token the model sampled (assistant text,
  tool calls and final answers);
* ``tool_call_and_final``: only positions predicting tool-call and final-answer
  tokens (the tokens that change what happens next);
* ``uniform``: a seeded uniform subset of the ``all`` positions, a fraction
  ``position_ratio`` of them (at least one when there is any), the same subset for
  the same seed and trajectory id on every machine.

This module does not tokenize, render chat templates or run models.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import ConfigError, ProvenanceError
from .hashing import SEAL_FIELD, seal, seal_status

log = logging.getLogger(__name__)


class SpanType(str, Enum):
    SYSTEM = "system"
    USER = "user"
    TOOL_RESULT = "tool_result"
    ASSISTANT_TEXT = "assistant_text"
    ASSISTANT_TOOL_CALL = "assistant_tool_call"
    ASSISTANT_FINAL = "assistant_final"

    @property
    def trainable(self) -> bool:
        return self in MODEL_SPANS


CONTEXT_SPANS = frozenset({SpanType.SYSTEM, SpanType.USER, SpanType.TOOL_RESULT})
MODEL_SPANS = frozenset(
    {SpanType.ASSISTANT_TEXT, SpanType.ASSISTANT_TOOL_CALL, SpanType.ASSISTANT_FINAL}
)


class StopReason(str, Enum):
    FINAL_ANSWER = "final_answer"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    PARSE_ERRORS = "parse_errors"
    REPEATED_CALLS = "repeated_calls"


class Span(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: SpanType
    start: int = Field(ge=0)
    end: int = Field(ge=0)

    @model_validator(mode="after")
    def _non_empty(self) -> Span:
        if self.end <= self.start:
            raise ValueError(f"span {self.type.value} [{self.start}, {self.end}) is empty")
        return self


class VerifierResult(BaseModel):
    """What an environment's verifier said about a final answer; always bounded."""

    model_config = ConfigDict(extra="forbid")

    success: bool = False
    score: float = Field(default=0.0, ge=0.0, le=1.0)
    reason: str = Field(default="", max_length=500)


class ToolCallStats(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total: int = Field(default=0, ge=0)
    parse_errors: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)
    by_name: dict[str, int] = Field(default_factory=dict)


class Trajectory(BaseModel):
    """One episode: ids, typed spans and the facts that make its tokens traceable."""

    model_config = ConfigDict(extra="forbid")

    id: str
    tokens: list[int]
    spans: list[Span]
    policy_version: int = Field(ge=0, description="Student parameter version that sampled it.")
    tokenizer_fp: str
    environment: str
    task_id: str
    split: str = "train"
    difficulty: str = "easy"
    stop_reason: StopReason = StopReason.FINAL_ANSWER
    tool_calls: ToolCallStats = Field(default_factory=ToolCallStats)
    verifier: VerifierResult = Field(default_factory=VerifierResult)
    seed: int | None = None
    source: str = Field(default="rollout", description="rollout | oracle | import")
    messages: list[dict[str, Any]] = Field(default_factory=list)
    sampling_logprobs: list[float] | None = Field(
        default=None,
        description="log q(y) of every model-span token in token order: the log-prob, in "
        "float32, that the distribution the rollout runner drew it from gave it (rollout "
        "temperature and top_p applied). None where the tokens were not sampled (oracle "
        "traces, imports, greedy episodes) or were sampled before this was recorded; a "
        "file line leaves it out while None.",
    )

    @model_validator(mode="after")
    def _spans_tile(self) -> Trajectory:
        n = len(self.tokens)
        if n == 0:
            raise ValueError("trajectory has no tokens")
        cursor = 0
        for span in self.spans:
            if span.start != cursor:
                raise ValueError(
                    f"spans must tile the sequence: expected a span starting at {cursor}, "
                    f"got {span.type.value} [{span.start}, {span.end})"
                )
            cursor = span.end
        if cursor != n:
            raise ValueError(f"spans cover [0, {cursor}) but the trajectory has {n} tokens")
        if self.spans[0].type.trainable:
            raise ValueError("token 0 must be context: position 0 is never a target")
        if self.sampling_logprobs is not None:
            sampled = int(self.loss_mask().sum())
            if len(self.sampling_logprobs) != sampled:
                raise ValueError(
                    f"sampling_logprobs has {len(self.sampling_logprobs)} values for {sampled} "
                    "model-span tokens; it needs one per sampled token"
                )
            values = np.asarray(self.sampling_logprobs, dtype=np.float64)
            if not (np.isfinite(values) & (values <= 0.0)).all():
                raise ValueError("sampling_logprobs must be finite log-probs (<= 0)")
        return self

    # -- derived views -------------------------------------------------------------

    def loss_mask(self) -> np.ndarray:
        """bool[T]: token ``j`` was sampled by the model and may be a training target."""
        mask_T = np.zeros(len(self.tokens), dtype=bool)
        for span in self.spans:
            if span.type.trainable:
                mask_T[span.start : span.end] = True
        return mask_T

    def target_positions(self, types: Iterable[SpanType] | None = None) -> np.ndarray:
        """int64[P]: positions ``p = j - 1`` whose next token ``j`` is trainable.

        ``types`` restricts the targets to some model span types (e.g. tool calls and
        final answers only); context types are never returned.
        """
        wanted = MODEL_SPANS if types is None else MODEL_SPANS & frozenset(types)
        out: list[np.ndarray] = []
        for span in self.spans:
            if span.type in wanted:
                out.append(np.arange(span.start - 1, span.end - 1, dtype=np.int64))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def span_types(self) -> list[SpanType]:
        """The span type of every token, length T."""
        types: list[SpanType] = []
        for span in self.spans:
            types.extend([span.type] * (span.end - span.start))
        return types

    def token_counts(self) -> dict[str, int]:
        """Tokens per span type (every type present, zeros included)."""
        counts = Counter({t.value: 0 for t in SpanType})
        for span in self.spans:
            counts[span.type.value] += span.end - span.start
        return dict(counts)

    def model_ids(self) -> list[list[int]]:
        """The sampled ids of each model span, in order."""
        return [self.tokens[s.start : s.end] for s in self.spans if s.type.trainable]

    def sampling_logprobs_at(self, positions_P: np.ndarray) -> np.ndarray | None:
        """``float32[P]``: the sampling-time log-prob of the token each position predicts
        (``tokens[p + 1]``, a model-span token); None when none were recorded."""
        if self.sampling_logprobs is None:
            return None
        # The k-th model-span token's log-prob is the k-th value.
        index_T = np.cumsum(self.loss_mask()) - 1
        values = np.asarray(self.sampling_logprobs, dtype=np.float32)
        return values[index_T[np.asarray(positions_P, dtype=np.int64) + 1]]


# -- JSONL I/O -------------------------------------------------------------------------


def _mask_string(mask_T: np.ndarray) -> str:
    return "".join("1" if m else "0" for m in mask_T.tolist())


def trajectory_to_json(traj: Trajectory) -> str:
    """One JSONL line, sealed: the stored ``loss_mask`` is for readers and is re-checked
    on read; ``digest`` is the sha256 of the rest of the line's canonical JSON."""
    record = traj.model_dump(mode="json")
    if record["sampling_logprobs"] is None:
        # Lines of episodes that recorded none stay as they were before the field existed.
        del record["sampling_logprobs"]
    record["loss_mask"] = _mask_string(traj.loss_mask())
    return json.dumps(seal(record), separators=(",", ":"), ensure_ascii=False)


def parse_trajectory_line(line: str, where: str = "<string>") -> tuple[Trajectory, bool]:
    """``(trajectory, sealed)`` from one JSONL line; raises ProvenanceError at ``where``.

    A line whose ``digest`` does not match its content is refused before anything else
    is read from it; a line without one (written before lines were sealed) is read, and
    ``sealed`` is False so the caller can warn. Read files with
    ``errors="surrogateescape"``: bytes that are not UTF-8 are then refused here.
    """
    try:
        line.encode("utf-8")
        record = json.loads(line)
    except (UnicodeEncodeError, json.JSONDecodeError) as exc:
        what = ("bytes that are not UTF-8" if isinstance(exc, UnicodeEncodeError)
                else f"not valid JSON ({exc.msg})")
        raise ProvenanceError(
            f"{where}: {what}; the file is corrupted, restore it from a copy or rerun"
        ) from None
    if not isinstance(record, dict):
        raise ProvenanceError(f"{where}: expected a JSON object per line; the file is corrupted")
    status = seal_status(record)
    if status == "mismatch":
        raise ProvenanceError(
            f"{where}: the line does not match its {SEAL_FIELD} (sha256 of its content); it "
            "was modified or corrupted after it was written and is not used; restore the file "
            "from a copy or rerun"
        )
    record.pop(SEAL_FIELD, None)
    stored_mask = record.pop("loss_mask", None)
    try:
        traj = Trajectory.model_validate(record)
    except ValueError as exc:
        first = str(exc).splitlines()
        detail = "; ".join(line.strip() for line in first[1:3]) or str(exc)
        raise ProvenanceError(f"{where}: invalid trajectory: {detail}") from exc
    if stored_mask is not None and stored_mask != _mask_string(traj.loss_mask()):
        raise ProvenanceError(
            f"{where}: stored loss_mask does not match the mask derived from the spans of "
            f"trajectory {traj.id!r}; the file was edited or corrupted and is not trained on"
        )
    return traj, status == "ok"


def trajectory_from_json(line: str, where: str = "<string>") -> Trajectory:
    """:func:`parse_trajectory_line` without the sealed flag."""
    return parse_trajectory_line(line, where)[0]


def unsigned_warning(path: str | Path, count: int) -> str:
    """The one warning a reader gives for a file with unsealed lines."""
    return (
        f"{path}: {count} line(s) carry no {SEAL_FIELD} (written before trajectories were "
        "sealed): they are read, but changes to them cannot be detected"
    )


def write_trajectories(path: str | Path, trajs: Iterable[Trajectory], append: bool = False) -> int:
    """Write trajectories as sealed JSONL; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("a" if append else "w", encoding="utf-8") as fh:
        for traj in trajs:
            fh.write(trajectory_to_json(traj) + "\n")
            n += 1
    return n


def iter_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """Yield trajectories, checking every line's digest and re-deriving every mask.

    Raises ProvenanceError at ``file:line`` (also for bytes that are not UTF-8); a file
    with unsealed lines is read with one warning, logged when the file ends.
    """
    path = Path(path)
    unsigned = 0
    with path.open(encoding="utf-8", errors="surrogateescape") as fh:
        for lineno, line in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            if not line.strip():
                continue
            traj, sealed = parse_trajectory_line(line, where=where)
            unsigned += not sealed
            yield traj
    if unsigned:
        log.warning("warning: %s", unsigned_warning(path, unsigned))


def read_trajectories(path: str | Path) -> list[Trajectory]:
    return list(iter_trajectories(path))


# -- which positions a loss is computed on ----------------------------------------------

POSITION_RULES = ("all", "tool_call_and_final", "uniform")
TOOL_CALL_AND_FINAL = (SpanType.ASSISTANT_TOOL_CALL, SpanType.ASSISTANT_FINAL)


def _stable_seed(seed: int, trajectory_id: str) -> int:
    # hash() of a str is salted per process; sha256 keeps the subset reproducible.
    digest = hashlib.sha256(f"{seed}:{trajectory_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def select_positions(
    traj: Trajectory, rule: str = "all", *, ratio: float = 1.0, seed: int = 0
) -> np.ndarray:
    """``int64[P]`` sorted positions of ``traj`` to train on under ``rule``."""
    if rule == "all":
        return traj.target_positions()
    if rule == "tool_call_and_final":
        return traj.target_positions(TOOL_CALL_AND_FINAL)
    if rule == "uniform":
        if not 0.0 < ratio <= 1.0:
            raise ConfigError(
                f"loss.position_ratio={ratio} must be in (0, 1] for positions: uniform; "
                f"fix the recipe"
            )
        positions_P = traj.target_positions()
        n = len(positions_P)
        if n == 0 or ratio == 1.0:
            return positions_P
        keep = max(1, min(n, math.ceil(ratio * n - 1e-9)))
        rng = np.random.default_rng(_stable_seed(seed, traj.id))
        chosen = rng.choice(n, size=keep, replace=False)
        return positions_P[np.sort(chosen)]
    raise ConfigError(
        f"loss.positions={rule!r} is not one of {', '.join(POSITION_RULES)}; fix the recipe"
    )


def select_positions_for(traj: Trajectory, loss_config: Any, *, seed: int = 0) -> np.ndarray:
    """:func:`select_positions` with the rule and ratio read from the recipe's ``loss``."""
    return select_positions(
        traj,
        getattr(loss_config, "positions", "all"),
        ratio=float(getattr(loss_config, "position_ratio", 1.0)),
        seed=seed,
    )
