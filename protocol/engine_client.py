"""A vLLM or SGLang server as the student's teacher: the HTTP engine-teacher client.

:class:`EngineTeacherClient` implements
:class:`~miniverl.protocol.scoring_client.ScoringClient` beside the ZeroMQ
``SyncTeacherClient``, so the training side (``student/train/teacher/link.py``) scores
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
pipelined up to ``max_inflight`` at once. Each try of a request has one deadline for the
whole exchange (``request_timeout_s``: connect, send and every read together, so a server
that drips its answer is cut off like one that never answers), and its answer is read as
a stream, refused past a size cap (``max_reply_bytes``; by default what the request's
answer can need). A refused connection, a deadline, ``429`` or ``5xx`` is retried at
most ``max_retries`` times, then a one-line
:class:`~miniverl.common.errors.TeacherUnavailable`; another status is one line naming
the server's message. A ``SCORE`` request that ends either way ends as
:class:`~miniverl.common.errors.TeacherRefusing`, with the same line: a run waits out an
engine that refuses or does not answer its requests as it waits out a ``mvl-score``
teacher's refusals (``student/train/teacher/link.py``, ``Patience``), and a request it
gives up on (``forget``) stops at once, its slot freed. An answer that is not the documented
shape, or whose numbers are not log-probabilities (``protocol/engine_replies.py``), is
a one-line :class:`~miniverl.common.errors.TeacherError` naming the endpoint, the
position or field and the fix, never retried and never trained on. The bytes counters
count every byte sent and read. The API key is read from the environment variable the
recipe names (``teacher.api_key_env``) and is sent only in the ``Authorization`` header.
:meth:`~EngineTeacherClient.interrupt` ends a wait from another thread (a stop signal).

Torch-free; numpy only. This module does not connect a run or gate a teacher
(``student/train/teacher/connect.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, Literal

import anyio
import numpy as np

from miniverl.common.errors import (
    ConfigError,
    TeacherError,
    TeacherRefusing,
    TeacherUnavailable,
    TokenizerMismatch,
)
from miniverl.protocol.checks import validate_score
from miniverl.protocol.engine_replies import (
    MAX_K,
    REPLY_BASE_BYTES,
    REPLY_BYTES_PER_ENTRY,
    DuplicateKey,
    EngineGarbage,
    EngineModelChanged,
    EngineNotLogprobs,
    parse_json,
    parse_score,
    score_body,
    served_models,
)
from miniverl.protocol.limits import Limits
from miniverl.protocol.messages import HelloOk, ParkOk, Score, ScoreOk, TeacherState, Timing, WakeOk
from miniverl.protocol.pending import PendingTable
from miniverl.protocol.scoring_client import (
    Identity,
    ScoreResult,
    StoppableCalls,
    as_async,
    connected,
)

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

RETRY_STATUS = {429, 500, 502, 503, 504}


class EngineRefused(TeacherError):
    """The engine answered a request with an HTTP status that is neither success, a
    redirect nor one worth retrying (a ``4xx``: an unknown model or adapter, a bad key)."""


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
        # Opened by _start on first use (None before and after close).
        self._portal_cm: Any = None
        self._portal: Any = None
        self._http: Any = None
        self._slots: Any = None
        self._tasks: dict[int, Any] = {}  # request id -> the task that scores it
        self._calls = StoppableCalls()
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
        return self._calls.call(self._start(), fn, *args, **kwargs)

    def interrupt(self, reason: str) -> None:
        """End every call in progress (a wait, the handshake's retries) and every later one
        with ``StopRequested``; any thread may call it."""
        self._calls.interrupt(reason)

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
                self._pending().count("retries")
                await anyio.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            self._extra["http_requests"] += 1
            self._pending().count("bytes_sent", len(content or b""))
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
                raise EngineRefused(f"engine teacher at {url} refused the request: HTTP "
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
                self._pending().count("bytes_received", len(chunk))
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
            return parse_json(data)
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
        return HelloOk.model_validate(dict(
            id=0, teacher={"name": model, "model": model}, instance=f"engine-{digest[:16]}",
            gen=0, tokenizer_fp=self.tokenizer_fp, vocab_size=self.vocab_size,
            kinds={"topk": {"k_max": limits.max_k}},
            limits={"max_tokens": limits.max_tokens, "max_positions": limits.max_positions,
                    "max_inflight": limits.max_inflight},
            heartbeat_ms=1000, server_version=f"{self.flavour}-http",
        ))

    # ------------------------------------------------------------- ScoringClient
    @property
    def hello(self) -> HelloOk | None:
        return self._hello

    @property
    def connected(self) -> bool:
        """Handshake done and no request failing now (HTTP holds no connection to watch)."""
        return self._hello is not None and not self._errors

    def forget(self, ids: Iterable[int]) -> None:
        """Give these requests up: their rows and errors go, and a request still being
        tried (its retries, its back-offs) is cancelled, so it frees its slot for the
        requests sent in its place."""
        if self._portal is not None:
            self._portal.call(self._drop, list(ids))

    def _drop(self, ids: list[int]) -> None:
        """:meth:`forget` on the event loop, where the requests' tasks and errors live."""
        for rid in ids:
            self._pending().take(rid)
            self._errors.pop(rid, None)
            task = self._tasks.pop(rid, None)
            if task is not None:
                task.cancel()

    @property
    def counters(self) -> dict[str, int]:
        base = self._table.counters() if self._table is not None else {}
        return {**base, **self._extra}

    def connect(self, timeout_s: float | None = None) -> HelloOk:
        return self._run(self._connect, timeout_s)

    def connect_soon(self, timeout_s: float | None = None) -> Future:
        return self._calls.soon(self._start(), self._connect, timeout_s)

    def set_version(self, version: int, lag: int = 0) -> None:
        self._run(as_async(self._start_table().set_version), version, lag)

    def _start_table(self) -> PendingTable:
        self._start()
        return self._pending()

    def _pending(self) -> PendingTable:
        """The pending table, made when the event loop first starts (:meth:`_open`)."""
        if self._table is None:
            raise RuntimeError(f"engine teacher client {self.endpoint} has not started")
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
        self._pending().bind(identity, retargeting=False)
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
        table = self._pending()
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
        self._tasks[rid] = task
        task.add_done_callback(lambda _: self._tasks.pop(rid, None))
        return rid

    async def _score(self, rid: int, version: int, arrays: dict[str, np.ndarray],
                     k: int) -> None:
        model = self.model
        if model is None:  # scored only once connected (connect sets it)
            self._fail(rid, TeacherUnavailable(f"engine teacher {self.endpoint} is not bound"))
            return
        tokens, cu = arrays["tokens"].tolist(), arrays["cu_seqlens"].tolist()
        seqs = [tokens[cu[b]:cu[b + 1]] for b in range(len(cu) - 1)]
        seq_of = np.searchsorted(np.asarray(cu), arrays["positions"], side="right") - 1
        local = [[int(p) - cu[b] for p, s in zip(arrays["positions"], seq_of, strict=True)
                  if s == b]
                 for b in range(len(seqs))]
        # Positions in request order; sequences are scored in order, so they are grouped.
        order = np.argsort(seq_of, kind="stable")
        route = score_body(self.flavour, model, [], k)[0]
        where = f"engine teacher at {self.endpoint}{route}: reply to request {rid}"
        # The most bytes a whole answer can need: every prompt token echoed with k + 1
        # entries (vLLM), plus the envelope.
        max_bytes = self.max_reply_bytes or (
            REPLY_BASE_BYTES + len(tokens) * (k + 1) * REPLY_BYTES_PER_ENTRY)
        t0 = time.perf_counter()
        try:
            async with self._slots:
                queue_ms = (time.perf_counter() - t0) * 1e3
                route, body = score_body(self.flavour, model, seqs, k)
                answer = await self._request("POST", route, body, max_bytes=max_bytes)
            compute_ms = (time.perf_counter() - t0) * 1e3 - queue_ms
        except Exception as exc:  # down after retries, refused, garbage: ends this request
            self._fail(rid, _as_refusal(exc))
            return
        try:
            result = parse_score(self.flavour, answer, model, seqs, local, k=k,
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
        except Exception as exc:  # a shape no check above names: still one line, no hang
            self._extra["engine_garbage"] += 1
            self._fail(rid, EngineGarbage(
                f"{where}: the reply could not be read ({type(exc).__name__}: "
                f"{str(exc)[:80]}); the reply was dropped, nothing trained on; check that the "
                f"server is {self.flavour} (teacher.api)"))
            return
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        result = {name: arr[inverse] for name, arr in result.items()}
        self._pending().count("received")
        hello = self._hello  # the teacher now: a retarget during the request shows in the reply
        if hello is None:
            self._fail(rid, TeacherUnavailable(f"engine teacher {self.endpoint} is not bound"))
            return
        reply = ScoreOk(id=rid, student_version=version,
                        instance=hello.instance, gen=hello.gen, kind="topk", k=k,
                        timing=Timing(queue_ms=queue_ms, compute_ms=max(compute_ms, 0.0)))
        # The one staleness rule and the reply checks (finite values, ids, lengths).
        self._pending().on_score_ok(reply, result, self.vocab_size)
        self._pending().notify()

    def _fail(self, rid: int, error: BaseException) -> None:
        self._errors[rid] = error
        self._pending().notify()

    def wait(self, ids: Iterable[int], timeout_s: float | None = None) -> dict[int, ScoreResult]:
        return self._run(self._wait, list(ids), timeout_s)

    async def _wait(self, ids: list[int], timeout_s: float | None) -> dict[int, ScoreResult]:
        def raise_fatal() -> None:
            for rid in ids:
                error = self._errors.pop(rid, None)
                if error is not None:
                    self._drop(ids)  # the caller re-sends or gives up the whole wait
                    raise error

        return await self._pending().collect(ids, timeout_s, tick=0.05, raise_fatal=raise_fatal)

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
            with contextlib.suppress(RuntimeError):  # cancel a wait a signal left behind
                portal.call(portal.stop, True)
            portal_cm.__exit__(None, None, None)

    async def _aclose(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        if self._http is not None:
            await self._http.aclose()

    def __enter__(self) -> EngineTeacherClient:
        return connected(self)

    def __exit__(self, *exc_info: Any) -> None:
        self.close()



def _as_refusal(exc: Exception) -> Exception:
    """What a ``SCORE`` request that failed ends with: a refusal (an :class:`EngineRefused`
    status) or no answer after the retries (``TeacherUnavailable``) as
    :class:`TeacherRefusing` with the same line, which a run waits out
    (docs/training.md, "A teacher that fails"); anything else (garbage, a redirect, a
    changed model) as it is."""
    if isinstance(exc, EngineRefused | TeacherUnavailable) and not isinstance(
            exc, TeacherRefusing):
        return TeacherRefusing(str(exc))
    return exc


def _api_key(env: str) -> str:
    """The key in ``$env``; the key itself is never written anywhere but the header."""
    key = os.environ.get(env)
    if not key:
        raise ConfigError(f"teacher.api_key_env names {env!r}, which is not set; export "
                          f"{env}=KEY before the run (or drop teacher.api_key_env)")
    return key


def _message(data: bytes) -> str:
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return data[:200].decode("utf-8", "replace")
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", error))[:200]
    return str(body.get("message", body) if isinstance(body, dict) else body)[:200]

