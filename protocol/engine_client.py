"""A vLLM or SGLang server as the student's teacher: the HTTP engine-teacher client.

:class:`EngineTeacherClient` implements
:class:`~miniverl.protocol.scoring_client.ScoringClient` beside the ZeroMQ
``SyncTeacherClient``, so the training side (``student/train/teacher_link.py``) scores
through it unchanged. Each ``submit`` is one HTTP request holding the request's
sequences as token-id prompts: vLLM ``POST /v1/completions`` (``prompt_logprobs: k``,
``max_tokens: 1``), SGLang ``POST /generate`` (``return_logprob``,
``logprob_start_len: 0``, ``top_logprobs_num: k``). Each position's answer becomes our
top-k + tail targets (:func:`targets_from_vllm`, :func:`targets_from_sglang`), and the
reply then goes through the same pending table as a ``SCORE_OK``
(``protocol/pending.py``): it is tagged on our side with the student version that asked
and the teacher it was bound to, the one staleness rule accepts it once (a reply for an
older version is dropped and counted in ``stale_dropped``), and ``checks.reply_problem``
refuses a non-finite value, a token id outside the vocabulary or a wrong length.

What the engine cannot say, this client checks itself:

- **the tokenizer**, at :meth:`~EngineTeacherClient.connect` (before the first rollout):
  the server tokenizes :data:`PROBES` (vLLM ``POST /tokenize``; SGLang ``/generate``
  with text and ``input_token_logprobs``, its documented fields) and every probe must
  give the student's ids, else :class:`TokenizerMismatch` naming both tokenizers;
- **the model**: ``/v1/models`` (vLLM) or ``/get_model_info`` (SGLang) must serve the
  name asked for, at connect and again at each :meth:`~EngineTeacherClient.bind` (an
  update boundary); vLLM's replies name their ``model`` and each is checked too. A
  server that now serves another model is refused (:class:`EngineModelChanged`): its
  replies are never trained on; ``miniverl teacher use`` moves a run to it, through the
  competence gate like any new teacher.

Transport: httpx (the ``engine`` extra, imported when a client is made), requests
pipelined up to ``max_inflight`` at once, each with a timeout and at most
``max_retries`` retries (a refused connection, a timeout, ``429`` or ``5xx``), then a
one-line :class:`~miniverl.common.errors.TeacherUnavailable`. An answer that is not the
documented shape is a one-line :class:`~miniverl.common.errors.TeacherError`, never
retried. The API key is read from the environment variable the recipe names
(``teacher.api_key_env``) and is sent only in the ``Authorization`` header.

Torch-free; numpy only. This module does not connect a run or gate a teacher
(``student/train/teacher.py``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, Literal

import anyio
import numpy as np

from miniverl.common.errors import (
    ConfigError,
    TeacherError,
    TeacherUnavailable,
    TokenizerMismatch,
)
from miniverl.protocol.checks import validate_score
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import HelloOk, ParkOk, Score, ScoreOk, TeacherState, WakeOk
from miniverl.protocol.pending import PendingTable
from miniverl.protocol.scoring_client import Identity, ScoreResult, as_async, connected

Flavour = Literal["vllm", "sglang"]
FLAVOURS: tuple[str, ...] = ("vllm", "sglang")
EXTRA_LINE = 'pip install -e ".[engine]"'
SCHEMES = ("http://", "https://")

# What the tokenizer check sends: plain words, whitespace runs, accents and non-Latin
# script, an emoji, digits, JSON with a tool call, code. Two tokenizers that agree on
# all of them may still differ elsewhere; two that differ almost always differ here.
PROBES: tuple[str, ...] = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  two leading spaces,\ttabs\tand\nnew lines\n\n",
    "naïve café, Zürich, 東京, Москва 🙂",
    "3.14159 + 2718 = 1234567890; x**2 - 4*x + 4",
    '{"tool": "calculator", "arguments": {"expression": "(12 + 30) / 7"}}',
    "def f(x):\n    return [i for i in range(x) if i % 2 == 0]\n",
)

# The smallest normal float32: the least mass the tail is given when the top-k's
# probabilities sum to 1 or more after rounding (a finite tail of at most -87.3).
TAIL_FLOOR = float(np.finfo(np.float32).tiny)
RETRY_STATUS = {429, 500, 502, 503, 504}
MAX_K = 1024  # the most prompt log-probs asked per position (vLLM's default cap is 20)
# How far above 0 a log-prob, and above 1 a top-k's probability mass, may round before
# the reply is refused: engines compute log-softmax in float32 (a log-prob of +5.0 is a
# "probability" of 148: raw logits, not log-probs, and never trained on).
LOGPROB_TOLERANCE = 1e-3
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


def require_httpx() -> Any:
    """The httpx module, or a one-line :class:`ConfigError` naming the extra."""
    try:
        import httpx
    except ImportError:
        raise ConfigError(
            "an http(s):// teacher endpoint (a vLLM or SGLang server) needs httpx, which comes "
            f"with the 'engine' extra: {EXTRA_LINE}"
        ) from None
    return httpx


def is_engine_endpoint(endpoint: str | None) -> bool:
    """True for an ``http://`` or ``https://`` teacher endpoint."""
    return isinstance(endpoint, str) and endpoint.startswith(SCHEMES)


def check_engine_endpoint(endpoint: str) -> str:
    """Refuse an http(s) endpoint that names no host, or carries a path, query or
    credentials; returns it without a trailing slash."""
    if not is_engine_endpoint(endpoint):
        raise ConfigError(f"endpoint {endpoint!r} is not http:// or https://")
    rest = endpoint.split("://", 1)[1].rstrip("/")
    if not rest or "/" in rest or "?" in rest or "#" in rest or "@" in rest:
        raise ConfigError(
            f"endpoint {endpoint!r} must be http(s)://HOST[:PORT] (the server's root: no path, "
            "query or credentials; put the key in the variable teacher.api_key_env names)"
        )
    return endpoint.rstrip("/")


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
    if value > LOGPROB_TOLERANCE:
        raise EngineNotLogprobs(f"{where} is {value:+.4g}, above 0 (a probability of "
                                f"{np.exp(min(value, 700.0)):.4g})")
    return min(value, 0.0)


def _check_mass(entries: list[tuple[int, float]], where: str) -> None:
    """One position names each token once, and its tokens hold at most all the
    probability."""
    if len({i for i, _ in entries}) != len(entries):
        raise EngineGarbage(f"{where} names a token id twice")
    mass = float(np.exp(np.array([lp for _, lp in entries], np.float64)).sum())
    if mass > 1.0 + LOGPROB_TOLERANCE:
        raise EngineNotLogprobs(f"{where}: the {len(entries)} log-probs sum to a probability "
                                f"of {mass:.4g}, above 1")


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
        _check_mass(parsed, at)
        found = dict(parsed)
        if actual not in found:
            raise EngineGarbage(f"{at}: the actual token {actual} has no log-prob")
        targets.append(found[actual])
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
    tokens, tops = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
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
        if _token_id(token[1], f"{at} token") != int(seq[p + 1]):
            raise EngineGarbage(f"{at}: the server scored token {token[1]}, the prompt holds "
                                f"{int(seq[p + 1])}")
        targets.append(_number(token[0], f"{at} logprob"))
        if not isinstance(top, list):
            raise EngineGarbage(f"{at}: input_top_logprobs entry is {type(top).__name__}")
        parsed = []
        for triple in top:
            if not isinstance(triple, list) or len(triple) < 2:
                raise EngineGarbage(f"{at}: input_top_logprobs entry {str(triple)[:40]!r}")
            token = _in_vocab(_token_id(triple[1], f"{at} id"), vocab_size, at)
            parsed.append((token, _number(triple[0], f"{at} logprob of token {token}")))
        _check_mass(parsed, at)
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
        by_index = {c.get("index"): c for c in body["choices"] if isinstance(c, dict)}
        if sorted(by_index, key=str) != sorted(range(len(seqs)), key=str):
            raise EngineGarbage(f"{where}: {len(body['choices'])} choices for {len(seqs)} prompts")
        for b, (seq, pos) in enumerate(zip(seqs, local, strict=True)):
            choice = by_index[b]
            echoed = choice.get("prompt_token_ids")
            if echoed is not None and list(echoed) != seq:
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


# ----------------------------------------------------------------------- the client


class EngineTeacherClient:
    """A vLLM or SGLang server as a :class:`ScoringClient` (see the module docstring).

    ``flavour``: ``vllm``, ``sglang`` or ``auto`` (found at connect: a retarget names
    no API). ``model``: the served model's name (vLLM: an id ``/v1/models`` lists;
    SGLang: its ``model_path``); None takes the one model the server serves. ``tokenize(text)`` is
    the student's tokenizer without special tokens, ``bos_id`` the id a server may put
    first (SGLang tokenizes with special tokens), ``tokenizer_name`` how errors name it.
    """

    def __init__(self, endpoint: str, *, flavour: str, model: str | None,
                 tokenize: Callable[[str], list[int]], tokenizer_fp: str, vocab_size: int,
                 tokenizer_name: str = "the student's tokenizer", bos_id: int | None = None,
                 api_key_env: str | None = None, request_timeout_s: float = 60.0,
                 max_retries: int = 3, retry_backoff_s: float = 0.5, max_inflight: int = 8,
                 max_positions: int = 1 << 20, max_reply_bytes: int | None = None,
                 transport: Any = None):
        if flavour not in (*FLAVOURS, "auto"):
            raise ConfigError(f"teacher.api {flavour!r} is not one of {', '.join(FLAVOURS)}")
        if max_inflight < 1 or max_retries < 0:
            raise ConfigError(f"max_inflight={max_inflight} must be >= 1 and max_retries="
                              f"{max_retries} >= 0")
        self.endpoint = check_engine_endpoint(endpoint)
        self.flavour, self.model = flavour, model
        self._tokenize, self.tokenizer_name, self.bos_id = tokenize, tokenizer_name, bos_id
        self.tokenizer_fp, self.vocab_size = tokenizer_fp, vocab_size
        self.api_key_env = api_key_env
        self.request_timeout_s, self.max_retries = request_timeout_s, max_retries
        self.retry_backoff_s, self.max_inflight = retry_backoff_s, max_inflight
        self.max_reply_bytes = max_reply_bytes  # None: what each request's answer can need
        self.limits = Limits(max_k=min(MAX_K, vocab_size), max_positions=max_positions,
                             max_inflight=max_inflight)
        self._transport = transport  # tests: an httpx transport; None = the network
        self._httpx = require_httpx()
        self._hello: HelloOk | None = None
        self._table: PendingTable | None = None
        self._errors: dict[int, BaseException] = {}
        self._headers = {"Authorization": f"Bearer {_api_key(api_key_env)}"} if api_key_env else {}
        self._portal_cm = self._portal = self._http = self._slots = None
        self._tasks: set[Any] = set()
        self._extra = {"http_requests": 0, "model_changed": 0, "engine_garbage": 0,
                       "deadline_exceeded": 0}

    # ------------------------------------------------------------- the event loop
    def _start(self) -> Any:
        if self._portal is None:
            self._portal_cm = anyio.from_thread.start_blocking_portal(backend="asyncio")
            self._portal = self._portal_cm.__enter__()
            self._portal.call(self._open)
        return self._portal

    async def _open(self) -> None:
        if self._table is None:
            self._table, self._slots = PendingTable(), anyio.Semaphore(self.max_inflight)
        self._http = self._httpx.AsyncClient(
            base_url=self.endpoint, headers=self._headers, transport=self._transport,
            timeout=self._httpx.Timeout(self.request_timeout_s))

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self._start().call(functools.partial(fn, *args, **kwargs))

    # ------------------------------------------------------------- HTTP
    async def _request(self, method: str, route: str, body: Any = None, *,
                       retries: int | None = None, max_bytes: int = REPLY_BASE_BYTES) -> Any:
        """The JSON answer of one request, retried on what waiting may fix.

        Each try has one deadline, ``request_timeout_s`` for the whole exchange (connect,
        send, every read), not per read: a server that drips its answer is cut off like
        one that never answers. The answer is read as a stream and refused once past
        ``max_bytes`` (never retried). Every byte sent and read is counted.
        """
        httpx, retries = self._httpx, self.max_retries if retries is None else retries
        url, last = f"{self.endpoint}{route}", ""
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if content is not None else None
        for attempt in range(retries + 1):
            if attempt:
                self._table.count("retries")
                await anyio.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            self._extra["http_requests"] += 1
            self._table.count("bytes_sent", len(content or b""))
            try:
                with anyio.fail_after(self.request_timeout_s):
                    status, location, data = await self._exchange(
                        method, route, content, headers, max_bytes, url)
            except TimeoutError:
                self._extra["deadline_exceeded"] += 1
                last = f"no whole answer within {self.request_timeout_s} s"
                continue
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if status in RETRY_STATUS:
                last = f"HTTP {status}"
                continue
            if 300 <= status < 400:
                raise TeacherError(f"engine teacher at {url} redirected the request (HTTP "
                                   f"{status} to {str(location)[:120]!r}); redirects are not "
                                   "followed: set teacher.endpoint to the server itself")
            if status != 200:
                raise TeacherError(f"engine teacher at {url} refused the request: HTTP "
                                   f"{status}: {_message(data)}; check teacher.api "
                                   f"({self.flavour}) and teacher.model")
            return self._json(data, url)
        raise TeacherUnavailable(f"engine teacher at {url} did not answer after "
                                 f"{retries + 1} tries ({last}); start the server or check "
                                 "teacher.endpoint")

    async def _exchange(self, method: str, route: str, content: bytes | None,
                        headers: dict | None, max_bytes: int,
                        url: str) -> tuple[int, str | None, bytes]:
        """``(status, Location, body)`` of one HTTP exchange, the body read in chunks and
        refused past ``max_bytes`` (the read is stopped there, the connection closed)."""
        chunks, size = [], 0
        async with self._http.stream(method, route, content=content,
                                     headers=headers) as reply:
            async for chunk in reply.aiter_bytes():
                size += len(chunk)
                self._table.count("bytes_received", len(chunk))
                if size > max_bytes:
                    self._extra["engine_garbage"] += 1
                    raise EngineGarbage(
                        f"engine teacher at {url} sent more than {max_bytes:,} bytes for one "
                        f"reply (the most this request's answer can need); the read was "
                        f"stopped and the reply dropped; check that the server is "
                        f"{self.flavour} (teacher.api)")
                chunks.append(chunk)
            return reply.status_code, reply.headers.get("location"), b"".join(chunks)

    def _json(self, data: bytes, url: str) -> Any:
        """The parsed answer; non-JSON, duplicate keys or absurd nesting is garbage."""
        try:
            return json.loads(data, object_pairs_hook=_unique_keys)
        except (ValueError, RecursionError) as exc:
            self._extra["engine_garbage"] += 1
            why = ("JSON nested too deep" if isinstance(exc, RecursionError)
                   else f"JSON holding {exc}" if isinstance(exc, DuplicateKey)
                   else f"non-JSON ({data[:60]!r})")
            raise EngineGarbage(f"engine teacher at {url} answered with {why}; the reply was "
                                f"dropped, nothing trained on; check that the server is "
                                f"{self.flavour} (teacher.api)") from None

    async def _detect(self) -> str:
        """sglang when ``/get_model_info`` names a ``model_path`` (vLLM has no such
        route), else vllm: for a retarget, where no recipe names the API."""
        try:
            body = await self._request("GET", "/get_model_info", retries=0)
        except (TeacherError, EngineGarbage):
            return "vllm"
        return "sglang" if isinstance(body, dict) and "model_path" in body else "vllm"

    async def _served(self) -> list[str]:
        route = "/v1/models" if self.flavour == "vllm" else "/get_model_info"
        return served_models(self.flavour, await self._request("GET", route))

    # ------------------------------------------------------------- handshake
    async def _connect(self, timeout_s: float | None) -> HelloOk:
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else 60.0)
        while True:
            try:
                if self.flavour == "auto":
                    self.flavour = await self._detect()
                served = await self._served()
                break
            except TeacherUnavailable:
                if time.monotonic() >= deadline:
                    raise
                await anyio.sleep(min(1.0, self.retry_backoff_s))
        model = self._pick_model(served)
        await self._check_tokenizer(model)
        self.model = model
        self._hello = self._hello_for(model)
        return self._hello

    def _pick_model(self, served: list[str]) -> str:
        if self.model is not None:
            if self.model not in served:
                raise TeacherError(f"engine teacher at {self.endpoint} serves {served}, not "
                                   f"{self.model!r} (teacher.model); start it with that model "
                                   "or name one it serves")
            return self.model
        if len(served) != 1:
            raise TeacherError(f"engine teacher at {self.endpoint} serves {served}; name one "
                               "with teacher.model")
        return served[0]

    async def _check_tokenizer(self, model: str) -> None:
        for text in PROBES:
            ours = [int(t) for t in self._tokenize(text)]
            theirs = await self._server_tokens(model, text)
            if self.bos_id is not None and theirs[:1] == [self.bos_id] and ours[:1] != theirs[:1]:
                theirs = theirs[1:]  # a server that adds BOS: the rest must agree
            if theirs != ours:
                first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                             min(len(ours), len(theirs)))
                raise TokenizerMismatch(
                    f"engine teacher {model!r} at {self.endpoint} tokenizes {text[:30]!r} as "
                    f"{len(theirs)} ids, {self.tokenizer_name} ({self.tokenizer_fp}) as "
                    f"{len(ours)} (first difference at id {first}); cross-tokenizer "
                    "distillation is refused: serve a teacher with the student's tokenizer "
                    "(vLLM --tokenizer DIR) or pick a student of the teacher's family")

    async def _server_tokens(self, model: str, text: str) -> list[int]:
        if self.flavour == "vllm":
            body = await self._request("POST", "/tokenize", {"model": model, "prompt": text,
                                                             "add_special_tokens": False})
            tokens = body.get("tokens") if isinstance(body, dict) else None
        else:
            body = await self._request("POST", "/generate", {
                "text": text, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True,
                "logprob_start_len": 0})
            meta = body.get("meta_info") if isinstance(body, dict) else None
            entries = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
            tokens = [e[1] for e in entries if isinstance(e, list) and len(e) > 1] \
                if isinstance(entries, list) else None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise EngineGarbage(f"engine teacher at {self.endpoint} answered the tokenizer "
                                "probe without a list of token ids")
        return tokens

    def _hello_for(self, model: str) -> HelloOk:
        digest = hashlib.sha256(f"{self.flavour}|{self.endpoint}|{model}".encode()).hexdigest()
        limits = self.limits
        return HelloOk(
            id=0, teacher={"name": model, "model": model}, instance=f"engine-{digest[:16]}",
            gen=0, tokenizer_fp=self.tokenizer_fp, vocab_size=self.vocab_size,
            kinds={"topk": {"k_max": limits.max_k}},
            limits={"max_tokens": limits.max_tokens, "max_positions": limits.max_positions,
                    "max_inflight": limits.max_inflight},
            heartbeat_ms=1000, server_version=f"{self.flavour}-http",
        )

    # ------------------------------------------------------------- ScoringClient
    @property
    def hello(self) -> HelloOk | None:
        return self._hello

    @property
    def counters(self) -> dict[str, int]:
        base = self._table.counters() if self._table is not None else {}
        return {**base, **self._extra}

    def connect(self, timeout_s: float | None = None) -> HelloOk:
        return self._run(self._connect, timeout_s)

    def connect_soon(self, timeout_s: float | None = None) -> Future:
        return self._start().start_task_soon(self._connect, timeout_s)

    def set_version(self, version: int, allowed_lag: int = 0) -> None:
        self._run(as_async(self._start_table().set_version), version, allowed_lag)

    def _start_table(self) -> PendingTable:
        self._start()
        return self._table

    def bind(self) -> Identity:
        return self._run(self._bind)

    async def _bind(self) -> Identity:
        if self._hello is None:
            raise TeacherUnavailable(f"engine teacher at {self.endpoint}: bind() before connect()")
        served = await self._served()
        if self.model not in served:
            self._extra["model_changed"] += 1
            raise EngineModelChanged(self._changed_text(f"serves {served}"))
        identity = (self._hello.instance, self._hello.gen)
        self._table.bind(identity, retargeting=False)
        return identity

    def _changed_text(self, what: str) -> str:
        return (f"engine teacher at {self.endpoint} now {what}; this run's teacher is "
                f"{self.model!r}: a changed teacher is refused, its replies are not trained on; "
                f"restart the server with {self.model!r}, or move the run to it with "
                "`miniverl teacher use RUN ENDPOINT` (gated like any new teacher)")

    def submit(self, tokens_N: Any, cu_seqlens_B1: Any, positions_P: Any, *,
               kind: str = "topk", k: int = 16, temperature: float = 1.0,
               deadline_ms: int | None = None, deterministic: bool = False) -> int:
        return self._run(self._submit, tokens_N, cu_seqlens_B1, positions_P, kind, k,
                         temperature)

    async def _submit(self, tokens_N: Any, cu_seqlens_B1: Any, positions_P: Any, kind: str,
                      k: int, temperature: float) -> int:
        if self._hello is None:
            raise TeacherUnavailable(f"engine teacher at {self.endpoint}: submit() before "
                                     "connect()")
        if kind != "topk":
            raise ConfigError(f"an engine teacher scores top-k only, not kind {kind!r}; set "
                              "loss.kind: topk")
        if temperature != 1.0:
            raise ConfigError(f"an engine teacher returns log-probs at temperature 1 only, not "
                              f"{temperature}; set loss.temperature: 1.0")
        table = self._table
        arrays = {"tokens": np.asarray(tokens_N, dtype="<i4"),
                  "cu_seqlens": np.asarray(cu_seqlens_B1, dtype="<i4"),
                  "positions": np.asarray(positions_P, dtype="<i4")}
        rid = table.new_id()
        msg = Score(id=rid, student_version=table.version, kind="topk", k=k)
        validate_score(msg, arrays, self.vocab_size, self.limits)
        # Tagged on our side: the row holds the version that asked and the bound teacher.
        table.file_score([], rid=rid, kind="topk", k=k, positions=len(arrays["positions"]))
        table.count("sent")
        # On the portal's loop already: the request runs as a task beside the caller.
        task = asyncio.get_running_loop().create_task(
            self._score(rid, table.version, arrays, k))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return rid

    async def _score(self, rid: int, version: int, arrays: dict[str, np.ndarray],
                     k: int) -> None:
        tokens, cu = arrays["tokens"].tolist(), arrays["cu_seqlens"].tolist()
        seqs = [tokens[cu[b]:cu[b + 1]] for b in range(len(cu) - 1)]
        seq_of = np.searchsorted(np.asarray(cu), arrays["positions"], side="right") - 1
        local = [[int(p) - cu[b] for p, s in zip(arrays["positions"], seq_of, strict=True)
                  if s == b]
                 for b in range(len(seqs))]
        # Positions in request order; sequences are scored in order, so they are grouped.
        order = np.argsort(seq_of, kind="stable")
        route = score_body(self.flavour, self.model, [], k)[0]
        where = f"engine teacher at {self.endpoint}{route}: reply to request {rid}"
        # The most bytes a whole answer can need: every prompt token echoed with k + 1
        # entries (vLLM), plus the envelope.
        max_bytes = self.max_reply_bytes or (
            REPLY_BASE_BYTES + len(tokens) * (k + 1) * REPLY_BYTES_PER_ENTRY)
        t0 = time.perf_counter()
        try:
            async with self._slots:
                queue_ms = (time.perf_counter() - t0) * 1e3
                route, body = score_body(self.flavour, self.model, seqs, k)
                answer = await self._request("POST", route, body, max_bytes=max_bytes)
            compute_ms = (time.perf_counter() - t0) * 1e3 - queue_ms
        except Exception as exc:  # down after retries, refused, garbage: ends this request
            self._fail(rid, exc)
            return
        try:
            result = parse_score(self.flavour, answer, self.model, seqs, local, k=k,
                                 vocab_size=self.vocab_size, where=where)
        except EngineModelChanged as exc:
            self._extra["model_changed"] += 1
            self._fail(rid, EngineModelChanged(self._changed_text(
                f"answers as model {exc.served!r} (reply to request {rid})")))
            return
        except EngineNotLogprobs as exc:
            self._extra["engine_garbage"] += 1
            self._fail(rid, EngineNotLogprobs(
                f"{exc}: not log-probabilities; the reply was dropped, nothing trained on; "
                "check that the server returns normalized log-probs (vLLM: --logprobs-mode "
                "raw_logprobs, not raw_logits)"))
            return
        except EngineGarbage as exc:
            self._extra["engine_garbage"] += 1
            self._fail(rid, EngineGarbage(f"{exc}; the reply was dropped, nothing trained on; "
                                          f"check that the server is {self.flavour} "
                                          "(teacher.api) and serves the student's tokenizer"))
            return
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        result = {name: arr[inverse] for name, arr in result.items()}
        self._table.count("received")
        hello = self._hello
        reply = ScoreOk(id=rid, student_version=version,
                        instance=hello.instance, gen=hello.gen, kind="topk", k=k,
                        timing={"queue_ms": queue_ms, "compute_ms": max(compute_ms, 0.0)})
        # The one staleness rule and the reply checks (finite values, ids, lengths).
        self._table.on_score_ok(reply, result, self.vocab_size)
        self._table.notify()

    def _fail(self, rid: int, error: BaseException) -> None:
        self._errors[rid] = error
        self._table.notify()

    def wait(self, ids: Iterable[int], timeout_s: float | None = None) -> dict[int, ScoreResult]:
        return self._run(self._wait, list(ids), timeout_s)

    async def _wait(self, ids: list[int], timeout_s: float | None) -> dict[int, ScoreResult]:
        def raise_fatal() -> None:
            for rid in ids:
                error = self._errors.pop(rid, None)
                if error is not None:
                    for other in ids:
                        self._table.take(other)
                    raise error

        return await self._table.collect(ids, timeout_s, tick=0.05, raise_fatal=raise_fatal)

    def retarget(self, endpoint: str) -> HelloOk:
        """Connect to another server of the same flavour; switch only if it validates."""
        probe = EngineTeacherClient(
            endpoint, flavour=self.flavour, model=None, tokenize=self._tokenize,
            tokenizer_fp=self.tokenizer_fp, vocab_size=self.vocab_size,
            tokenizer_name=self.tokenizer_name, bos_id=self.bos_id,
            api_key_env=self.api_key_env, request_timeout_s=self.request_timeout_s,
            max_retries=self.max_retries, max_reply_bytes=self.max_reply_bytes,
            transport=self._transport)
        try:
            hello = probe.connect(self.request_timeout_s)
        finally:
            probe.close()
        self._run(self._switch, probe.endpoint, probe.model, hello)
        return hello

    async def _switch(self, endpoint: str, model: str, hello: HelloOk) -> None:
        await self._http.aclose()
        self.endpoint, self.model, self._hello = endpoint, model, hello
        await self._open()

    def park(self) -> ParkOk:
        """An engine keeps its weights: nothing is moved (the run stays resident)."""
        return ParkOk(id=0, state=TeacherState.READY)

    def wake(self) -> WakeOk:
        return WakeOk(id=0, state=TeacherState.READY)

    def close(self) -> None:
        """Close the HTTP client and stop the event-loop thread (idempotent)."""
        if self._portal is None:
            return
        portal, portal_cm = self._portal, self._portal_cm
        self._portal = self._portal_cm = None
        try:
            portal.call(self._aclose)
        finally:
            portal_cm.__exit__(None, None, None)

    async def _aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._http is not None:
            await self._http.aclose()

    def __enter__(self) -> EngineTeacherClient:
        return connected(self)

    def __exit__(self, *exc_info: Any) -> None:
        self.close()



def _api_key(env: str) -> str:
    """The key in ``$env``; the key itself is never written anywhere but the header."""
    key = os.environ.get(env)
    if not key:
        raise ConfigError(f"teacher.api_key_env names {env!r}, which is not set; export "
                          f"{env}=KEY before the run (or drop teacher.api_key_env)")
    return key


class DuplicateKey(ValueError):
    """A JSON object names one key twice (``json`` would keep the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise DuplicateKey(f"an object that names key {twice[:20]!r} twice")
    return out


def _message(data: bytes) -> str:
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return data[:200].decode("utf-8", "replace")
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", error))[:200]
    return str(body.get("message", body) if isinstance(body, dict) else body)[:200]

