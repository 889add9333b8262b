"""What an engine's answer means, and when it is refused: the reply half of the
engine-teacher client (``protocol/engine_client.py``).

The request bodies of each flavour (:func:`score_body`), and the parsing of their
answers into our top-k + tail targets (:func:`parse_score`, :func:`targets_from_vllm`,
:func:`targets_from_sglang`, :func:`served_models`). Nothing an engine says is trusted:
every log-prob must be a finite number at most :data:`LOGPROB_TOLERANCE`, the distinct
tokens of one position (the actual token included) must hold at most all the
probability (the same tolerance), the actual token's log-prob must be the same in both
places a shape gives it, every token id must be inside the student's vocabulary and
named once, and the counts must be the documented ones: one rule for both shapes
(:func:`position_targets`); anything else is :class:`EngineGarbage` (or
:class:`EngineNotLogprobs`, :class:`EngineModelChanged`) naming the position or field.
docs/engine-teachers.md ("How an answer becomes targets", "Reply checks").

This module holds no connection and sends nothing; numpy only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from miniverl.common.errors import TeacherError

# The smallest normal float32: the least mass the tail is given when the top-k's
# probabilities sum to 1 or more after rounding (a finite tail of at most -87.3).
TAIL_FLOOR = float(np.finfo(np.float32).tiny)
MAX_K = 1024  # the most prompt log-probs asked per position (vLLM's default cap is 20)
# How far above 0 a log-prob, and above 1 a top-k's probability mass, may round before
# the reply is refused: engines compute log-softmax in float32 (a log-prob of +5.0 is a
# "probability" of 148: raw logits, not log-probs, and never trained on).
LOGPROB_TOLERANCE = 1e-3
FLOAT32_LOWEST = float(np.finfo(np.float32).min)
# A reply's size is capped before it is parsed: a fixed allowance for the envelope plus
# REPLY_BYTES_PER_ENTRY per log-prob asked (a vLLM entry with its decoded token is ~80).
REPLY_BASE_BYTES = 1 << 20
REPLY_BYTES_PER_ENTRY = 256


class EngineModelChanged(TeacherError):
    """The engine now serves another model than the one this client was made for
    (``served``: what it names now)."""

    def __init__(self, message: str, served: Any = None):
        super().__init__(message)
        self.served = served


class EngineGarbage(TeacherError):
    """The engine answered with something that is not the documented shape."""


# ----------------------------------------------------------------------- targets


def tail_logmass(logprobs_P_K: np.ndarray, *, k: int, vocab_size: int) -> np.ndarray:
    """log of the mass outside each row's top-k, ``log1p(-sum p)`` in float64.

    ``-inf`` exactly where the top-k is the whole vocabulary (``k >= vocab_size``, the
    one non-finite value ``checks.nonfinite_report`` allows); otherwise finite: a sum
    that rounds to 1 or more gives the tail :data:`TAIL_FLOOR`'s log.
    """
    p = len(logprobs_P_K)
    if k >= vocab_size:
        return np.full(p, -np.inf, np.float32)
    mass = np.exp(logprobs_P_K.astype(np.float64)).sum(axis=1)
    with np.errstate(invalid="ignore"):  # NaN stays NaN: the reply check refuses it
        rest = np.where(np.isnan(mass), np.nan, np.maximum(1.0 - mass, TAIL_FLOOR))
    return np.log(rest).astype(np.float32)


def _best_k(entries: list[tuple[int, float]], k: int, where: str) -> list[tuple[int, float]]:
    """The ``k`` highest of ``entries`` (an engine may add the actual token as a ``k+1``-th)."""
    if len(entries) < k or len(entries) > k + 1:
        raise EngineGarbage(f"{where} holds {len(entries)} log-probs; asked for {k} (k or "
                            f"k+1 expected)")
    if len({i for i, _ in entries}) != len(entries):
        raise EngineGarbage(f"{where} names a token id twice")
    # Highest first; equal log-probs by id, so the order is the same however they came.
    return sorted(entries, key=lambda e: (-e[1], e[0]))[:k]


class EngineNotLogprobs(EngineGarbage):
    """The engine's numbers are not log-probabilities (above 0, or a top-k mass above 1)."""


def _number(value: Any, where: str) -> float:
    """A log-prob: a finite number at most :data:`LOGPROB_TOLERANCE` (clamped to 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EngineGarbage(f"{where} is {str(value)[:40]!r}, not a number")
    value = float(value)
    if not np.isfinite(value):
        shown = "NaN" if value != value else value
        raise EngineGarbage(f"{where} is {shown}, a non-finite number, not a log-prob")
    if value < FLOAT32_LOWEST:  # would be -inf as the float32 the targets are
        raise EngineGarbage(f"{where} is {value:.4g}, below the float32 range, not a log-prob")
    if value > LOGPROB_TOLERANCE:
        raise EngineNotLogprobs(f"{where} is {value:+.4g}, above 0 (a probability of "
                                f"{np.exp(min(value, 700.0)):.4g})")
    return min(value, 0.0)


def position_targets(top: list[tuple[int, float]], actual: int, actual_logprob: float | None,
                     where: str) -> float:
    """The one rule every engine shape's position is held to; returns the actual token's
    log-prob.

    ``top`` is what the position lists (vLLM: every entry of ``prompt_logprobs[j]``,
    SGLang: ``input_top_logprobs[j]``); ``actual_logprob`` the actual token's log-prob
    where the shape gives it a second place (SGLang's ``input_token_logprobs[j]``; None
    for vLLM, whose list must hold the actual token). A token is named once with one
    log-prob (the actual token's two places agree within :data:`LOGPROB_TOLERANCE`),
    and the position's distinct tokens, the actual one included, hold at most all the
    probability. SGLang's second place was once neither compared nor counted: a
    top-k of 0.96 beside an actual token of 0.5 (1.46 in all), or an actual token at 0.9
    in one list and 0.5 in the other, was trained on (issue 53).
    """
    distinct: dict[int, float] = {}
    sightings = [*top, *(() if actual_logprob is None else ((actual, actual_logprob),))]
    for n, (token, lp) in enumerate(sightings):
        if token not in distinct:
            distinct[token] = lp
        elif abs(distinct[token] - lp) > LOGPROB_TOLERANCE:
            raise EngineGarbage(f"{where}: token {token} is given log-prob {distinct[token]:.4g} "
                                f"in one place and {lp:.4g} in another; a position gives each "
                                "token one log-prob")
        elif n < len(top):
            raise EngineGarbage(f"{where} names a token id twice")
    if actual not in distinct:
        raise EngineGarbage(f"{where}: the actual token {actual} has no log-prob")
    mass = float(np.exp(np.array(list(distinct.values()), np.float64)).sum())
    if mass > 1.0 + LOGPROB_TOLERANCE:
        raise EngineNotLogprobs(f"{where}: the {len(distinct)} distinct tokens' log-probs sum "
                                f"to a probability of {mass:.4g}, above 1")
    return distinct[actual]


def _token_id(value: Any, where: str) -> int:
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) <= 12:
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineGarbage(f"{where} is {str(value)[:40]!r}, not a token id")
    return value


def _in_vocab(token: int, vocab_size: int, where: str) -> int:
    if not 0 <= token < vocab_size:
        raise EngineGarbage(f"{where} names token id {token}, outside the student's "
                            f"vocabulary [0, {vocab_size})")
    return token


def _arrays(rows: list[list[tuple[int, float]]], targets: list[float], *, k: int,
            vocab_size: int) -> dict[str, np.ndarray]:
    p = len(rows)
    ids = np.array([[i for i, _ in r] for r in rows], np.int64).reshape(p, k)
    lps = np.array([[lp for _, lp in r] for r in rows], np.float64).reshape(p, k)
    logprobs = lps.astype(np.float32)
    return {
        "ids": ids.astype(np.int32),
        "logprobs": logprobs,
        "tail_logmass": tail_logmass(logprobs, k=k, vocab_size=vocab_size),
        "target_logprobs": np.array(targets, np.float32).reshape(p),
    }


def targets_from_vllm(entries: Sequence[Any], seq: Sequence[int], local_P: Sequence[int], *,
                      k: int, vocab_size: int, where: str = "reply") -> dict[str, np.ndarray]:
    """Our top-k + tail targets from one vLLM choice's ``prompt_logprobs``.

    ``entries[j]`` (``None`` at ``j = 0``) maps a token id (a JSON string) to
    ``{"logprob", "rank", "decoded_token"}``: the distribution of token ``j`` given the
    tokens before it, ``k`` entries, or ``k + 1`` when the actual token ``seq[j]`` is not
    among the top ``k``. Position ``p`` of ours predicts token ``p + 1``, so it reads
    ``entries[p + 1]``; ``target_logprobs`` is the actual token's log-prob.
    """
    if not isinstance(entries, list) or len(entries) != len(seq):
        n = len(entries) if isinstance(entries, list) else type(entries).__name__
        raise EngineGarbage(f"{where}: prompt_logprobs has {n} entries for a prompt of "
                            f"{len(seq)} tokens")
    rows, targets = [], []
    for p in local_P:
        entry, actual, at = entries[p + 1], int(seq[p + 1]), f"{where} position {p + 1}"
        if not isinstance(entry, dict):
            raise EngineGarbage(f"{at}: prompt_logprobs entry is {type(entry).__name__}, "
                                "not an object")
        parsed = []
        for key, value in entry.items():
            lp = value.get("logprob") if isinstance(value, dict) else value
            token = _in_vocab(_token_id(key, f"{at} key"), vocab_size, at)
            parsed.append((token, _number(lp, f"{at} logprob of token {token}")))
        targets.append(position_targets(parsed, actual, None, at))
        rows.append(_best_k(parsed, k, at))
    return _arrays(rows, targets, k=k, vocab_size=vocab_size)


def targets_from_sglang(meta: Any, seq: Sequence[int], local_P: Sequence[int], *, k: int,
                        vocab_size: int, where: str = "reply") -> dict[str, np.ndarray]:
    """Our top-k + tail targets from one SGLang ``meta_info`` (``logprob_start_len: 0``).

    ``input_token_logprobs[j]`` is ``[logprob, token_id, text]`` of the prompt's token
    ``j`` (logprob ``None`` at ``j = 0``); ``input_top_logprobs[j]`` a list of ``k`` such
    triples (``None`` at ``j = 0``). Position ``p`` of ours reads entry ``p + 1``.
    """
    if not isinstance(meta, dict):
        raise EngineGarbage(f"{where}: meta_info is {type(meta).__name__}, not an object")
    tokens: Any = meta.get("input_token_logprobs")
    tops: Any = meta.get("input_top_logprobs")
    for name, value in (("input_token_logprobs", tokens), ("input_top_logprobs", tops)):
        if not isinstance(value, list) or len(value) != len(seq):
            n = len(value) if isinstance(value, list) else repr(value)[:40]
            raise EngineGarbage(f"{where}: meta_info.{name} has {n} entries for a prompt of "
                                f"{len(seq)} tokens")
    rows, targets = [], []
    for p in local_P:
        at = f"{where} position {p + 1}"
        token, top = tokens[p + 1], tops[p + 1]
        if not isinstance(token, list) or len(token) < 2:
            raise EngineGarbage(f"{at}: input_token_logprobs entry is {str(token)[:40]!r}")
        actual = int(seq[p + 1])
        if _token_id(token[1], f"{at} token") != actual:
            raise EngineGarbage(f"{at}: the server scored token {token[1]}, the prompt holds "
                                f"{actual}")
        actual_logprob = _number(token[0], f"{at} logprob")
        if not isinstance(top, list):
            raise EngineGarbage(f"{at}: input_top_logprobs entry is {type(top).__name__}")
        parsed = []
        for triple in top:
            if not isinstance(triple, list) or len(triple) < 2:
                raise EngineGarbage(f"{at}: input_top_logprobs entry {str(triple)[:40]!r}")
            token = _in_vocab(_token_id(triple[1], f"{at} id"), vocab_size, at)
            parsed.append((token, _number(triple[0], f"{at} logprob of token {token}")))
        targets.append(position_targets(parsed, actual, actual_logprob, at))
        rows.append(_best_k(parsed, k, at))
    return _arrays(rows, targets, k=k, vocab_size=vocab_size)


# ----------------------------------------------------------------------- the flavours


def score_body(flavour: str, model: str, prompts: list[list[int]], k: int) -> tuple[str, dict]:
    """``(route, JSON body)`` asking for ``k`` prompt log-probs of every token of ``prompts``."""
    if flavour == "vllm":
        return "/v1/completions", {"model": model, "prompt": prompts, "max_tokens": 1,
                                   "prompt_logprobs": k}
    return "/generate", {"input_ids": prompts, "sampling_params": {"max_new_tokens": 1},
                         "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": k}


def parse_score(flavour: str, body: Any, model: str, seqs: list[list[int]],
                local: list[list[int]], *, k: int, vocab_size: int,
                where: str) -> dict[str, np.ndarray]:
    """The reply arrays of one request (its positions in order), from the engine's body.

    Raises :class:`EngineModelChanged` when a vLLM reply names another ``model``, and
    :class:`EngineGarbage` for anything but the documented shape.
    """
    parts = []
    if flavour == "vllm":
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
            raise EngineGarbage(f"{where}: no 'choices' list in the completion response")
        if body.get("model") != model:
            named = str(body.get("model"))[:200]
            raise EngineModelChanged(f"{where} names model {named!r}, not {model!r}",
                                     served=named)
        by_index = {}
        for c in body["choices"]:
            index = c.get("index") if isinstance(c, dict) else None
            if isinstance(index, bool) or not isinstance(index, int):
                raise EngineGarbage(f"{where}: a choice's index is {str(index)[:40]!r}, not "
                                    "an integer")
            by_index[index] = c
        if sorted(by_index, key=str) != sorted(range(len(seqs)), key=str):
            raise EngineGarbage(f"{where}: {len(body['choices'])} choices for {len(seqs)} prompts")
        for b, (seq, pos) in enumerate(zip(seqs, local, strict=True)):
            choice = by_index[b]
            echoed = choice.get("prompt_token_ids")
            if echoed is not None and echoed != seq:
                raise EngineGarbage(f"{where} choice {b}: prompt_token_ids differ from the prompt")
            parts.append(targets_from_vllm(choice.get("prompt_logprobs"), seq, pos, k=k,
                                           vocab_size=vocab_size, where=f"{where} choice {b}"))
    else:
        items = body if isinstance(body, list) else [body]
        if len(items) != len(seqs) or not all(isinstance(i, dict) for i in items):
            raise EngineGarbage(f"{where}: {len(items)} answers for {len(seqs)} prompts")
        for b, (item, seq, pos) in enumerate(zip(items, seqs, local, strict=True)):
            parts.append(targets_from_sglang(item.get("meta_info"), seq, pos, k=k,
                                             vocab_size=vocab_size, where=f"{where} prompt {b}"))
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def served_models(flavour: str, body: Any) -> list[str]:
    """The model names a ``/v1/models`` (vLLM) or ``/get_model_info`` (SGLang) body lists."""
    if flavour == "vllm":
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise EngineGarbage("/v1/models answered without a 'data' list")
        return [str(m.get("id")) for m in data if isinstance(m, dict)]
    if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
        raise EngineGarbage("/get_model_info answered without 'model_path'")
    return [body["model_path"]]


class DuplicateKey(ValueError):
    """A JSON object names one key twice (``json`` would keep the last silently)."""


def _added(seen: set[str], key: str) -> bool:
    """Add ``key`` to ``seen``; False (it was not there)."""
    seen.add(key)
    return False


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or _added(seen, key))
        raise DuplicateKey(f"an object that names key {twice[:20]!r} twice")
    return out


def parse_json(data: bytes) -> Any:
    """``data`` as JSON, refusing an object that names a key twice (:class:`DuplicateKey`);
    raises ``ValueError`` or ``RecursionError`` for the rest."""
    return json.loads(data, object_pairs_hook=_unique_keys)
