"""Our teacher as an OpenAI-compatible scorer: vLLM's ``prompt_logprobs`` over HTTP.

``miniverl teacher serve --openai HOST:PORT`` answers, beside ``mvl-score/1`` and from
the same model, queue and batcher:

- ``GET /health``: 200 once the model is loaded (503 while loading, reloading or
  shutting down); it needs no token;
- ``GET /v1/models``: the served model, ``{"object": "list", "data": [{"id": NAME, ...}]}``;
- ``POST /v1/completions`` with ``prompt`` as token ids (one list or a list of lists),
  ``max_tokens`` 0 or 1, ``prompt_logprobs: k``, optional ``temperature`` and the vendor
  field ``miniverl_student_version``: vLLM's response shape, ``choices[i].prompt_logprobs``
  a list with ``None`` at position 0, then per position ``{token_id: {logprob, rank,
  decoded_token}}`` holding the top-k and the token actually there. The reply also has a
  ``miniverl`` object: the student version the request named, the teacher instance,
  generation and identity, and each position's ``tail_logmass``. docs/engine-teachers.md
  lists every field, and what differs from vLLM.

So TRL's ``VLLMClient.get_sequence_logprobs`` (and ``ServerDistillationTrainer``, which
calls it) scores against our teacher unchanged. A request's prompts are packed into as
few ``SCORE``s as the teacher's limits allow (:func:`pack`; one request is one batch in
TRL), each entering through the server's own admission (``server._on_score``: limits,
in-flight cap, lifecycle state) under one in-process client id; each ``SCORE_OK`` or
``ERROR`` comes back
through :func:`~miniverl.teacher_server.server_state.send`, which hands frames addressed to a
local client to its sink instead of the socket. The same rules as ``mvl-score/1``: a
bind off loopback needs a bearer token (``--openai-token-file``); admin messages exist
only on the ZeroMQ side; every number sent is finite (the batcher refuses a reply that
is not, and this module encodes JSON with ``allow_nan=False``; a ``tail_logmass`` of
``-inf`` — the top-k is the whole vocabulary — is sent as ``null``); a request larger
than the teacher's limits (body size, prompts, tokens, one prompt's length) is refused
with a 4xx naming the limit, and a body nested deeper than :data:`MAX_NESTING` with a
400 before it is decoded. Every answer is JSON, aiohttp's own refusals included; a fault
of ours is one logged line and a 500, never a traceback.

It does not tokenize text (``prompt`` must be token ids), generate tokens, or steer the
teacher. HTTP is aiohttp's (the ``openai`` extra); no HTTP is parsed here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from miniverl.common.errors import ConfigError, require
from miniverl.protocol import messages as m
from miniverl.protocol.codec import decode, decode_header_only
from miniverl.protocol.endpoints import is_loopback
from miniverl.protocol.messages import ErrorCode, TeacherState
from miniverl.teacher_server.server import _on_score
from miniverl.teacher_server.server_state import ServerState, log

# The client id the front end's SCOREs carry. ZeroMQ's own routing ids are 5 bytes, and a
# peer may not choose one that starts with a zero byte, so no socket peer can be this one.
OPENAI_CLIENT = b"\x00openai-http"
STUDENT_VERSION_FIELD = "miniverl_student_version"
# Request fields understood; vLLM's other sampling fields are refused by name.
REQUEST_FIELDS = {"model", "prompt", "max_tokens", "temperature", "prompt_logprobs", "n",
                  "stream", "logprobs", "echo", "user", STUDENT_VERSION_FIELD}
HTTP_STATUS = {
    ErrorCode.BAD_REQUEST: 400, ErrorCode.UNSUPPORTED: 400, ErrorCode.TOKENIZER_MISMATCH: 400,
    ErrorCode.TOO_LARGE: 413, ErrorCode.OVERLOADED: 429, ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.DEADLINE_EXCEEDED: 504, ErrorCode.RELOADING: 503, ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.NEED_HELLO: 503, ErrorCode.INTERNAL: 500, ErrorCode.TEACHER_DEAD: 503,
}
SERVING = (TeacherState.READY, TeacherState.PARKED)


class HttpRefusal(Exception):
    """A request refused with an HTTP status and a one-line message."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass
class OpenAIConfig:
    """Where the front end binds and the bearer token it requires (None: none)."""

    host: str
    port: int
    token: str | None = None


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as ``(host, port)``, or a ConfigError."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--openai {text!r} is not HOST:PORT (e.g. 127.0.0.1:8000); "
                          "pass the address and port to serve HTTP on")
    return host, int(port)



def openai_config(bind: str, token_file: str | None) -> OpenAIConfig:
    """The front end's settings; off loopback a token file is required (mvl-score/1's rule:
    no unauthenticated bind a remote host can reach)."""
    host, port = parse_bind(bind)
    token = None
    if token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"--openai-token-file {token_file}: {exc.strerror}; name a "
                              "readable file holding the bearer token") from None
        if len(token) < 16:
            raise ConfigError(f"--openai-token-file {token_file} holds {len(token)} "
                              "characters; write a token of at least 16 (e.g. `openssl rand "
                              "-hex 32 > FILE`)")
    elif not is_loopback(host):
        raise ConfigError(f"--openai {bind}: a non-loopback address needs a bearer token; "
                          "pass --openai-token-file FILE, or bind 127.0.0.1")
    return OpenAIConfig(host=host, port=port, token=token)


@dataclass
class OpenAIFrontEnd:
    """The HTTP listener and the requests it has open (touched on the server's loop only)."""

    srv: ServerState
    config: OpenAIConfig
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    ids: Any = field(default_factory=lambda: itertools.count(1))
    runner: Any = None
    bound: tuple[str, int] | None = None
    _decoders: dict[int, Any] = field(default_factory=dict)

    async def start(self) -> None:
        web = require("aiohttp.web", "openai")
        @web.middleware
        async def auth(request, handler):
            return await self._auth(request, handler)

        # A body larger than max_body_bytes cannot be a request within the teacher's
        # limits; aiohttp refuses it without reading it whole.
        app = web.Application(client_max_size=max_body_bytes(self.srv.config.limits),
                              middlewares=[auth])
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        self.srv.local_clients[OPENAI_CLIENT] = self._deliver
        self.srv.hello[OPENAI_CLIENT] = "openai-http"
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.config.host, self.config.port)
        try:
            await site.start()
        except OSError as exc:
            await self.runner.cleanup()
            raise ConfigError(f"cannot bind --openai {self.config.host}:{self.config.port}: "
                              f"{exc.strerror}; pick another port") from None
        sock = site._server.sockets[0]  # aiohttp keeps the bound socket here
        self.bound = sock.getsockname()[:2]
        log(self.srv, "info", "openai_bound", host=self.bound[0], port=self.bound[1],
            auth="bearer" if self.config.token else "none (loopback)")

    async def stop(self) -> None:
        self.srv.local_clients.pop(OPENAI_CLIENT, None)
        for future in self.pending.values():
            if not future.done():
                future.cancel()
        if self.runner is not None:
            await self.runner.cleanup()

    # ------------------------------------------------------------------ delivery

    def _deliver(self, frames: list) -> None:
        """A SCORE_OK or ERROR the server addressed to this front end. Never raises: it
        runs inside the batcher's reply loop, whose other jobs must still be answered."""
        try:
            msg, arrays = decode(frames, self.srv.limits)
            rid = msg.ref_id if isinstance(msg, m.ErrorReply) else msg.id
            result: Any = (msg, {k: np.array(v) for k, v in arrays.items()})
        except Exception as exc:
            try:
                header = decode_header_only(frames[0], self.srv.limits)
                rid = header.get("ref_id", header.get("id"))
            except Exception:
                log(self.srv, "error", "openai_reply_unreadable", error=str(exc)[:200])
                return
            result = HttpRefusal(500, f"the teacher's reply could not be read: {exc}")
        future = self.pending.pop(rid, None)
        if future is None or future.done():
            return
        if isinstance(result, HttpRefusal):
            future.set_exception(result)
        else:
            future.set_result(result)

    # ------------------------------------------------------------------ handlers

    def _json(self, body: Any, status: int = 200):
        web = require("aiohttp.web", "openai")
        return web.Response(text=json.dumps(body, allow_nan=False), status=status,
                            content_type="application/json")

    def _error(self, status: int, message: str, param: str | None = None):
        kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                413: "RequestTooLargeError", 429: "RateLimitError"}.get(status, "ServerError")
        return self._json({"error": {"message": message, "type": kind, "param": param,
                                     "code": status}}, status)

    async def _auth(self, request, handler):
        """Every route but ``/health`` (the lifecycle state only, as vLLM's) needs the token.
        aiohttp's own refusals (an unknown route, a method not served, a body past its
        cap) come back as the same JSON error as ours."""
        web = require("aiohttp.web", "openai")
        token = self.config.token
        if token is not None and request.path != "/health":
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode("utf-8", "replace"),
                                       f"Bearer {token}".encode()):
                return self._error(401, "missing or wrong bearer token; send "
                                   "'Authorization: Bearer TOKEN' (the --openai-token-file)")
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            served = "GET /health, GET /v1/models, POST /v1/completions"
            return self._error(exc.status, f"{request.method} {_shown(request.path, quote=False)}"
                               f": {exc.reason}; this teacher serves {served}")

    async def _health(self, request):
        state = self.srv.state
        if state in SERVING:
            return self._json({"status": "ok", "state": state.value})
        return self._json({"status": "unavailable", "state": state.value}, 503)

    def _model_id(self) -> str | None:
        backend = self.srv.backend
        return None if backend is None else str(backend.info.get("name") or backend.info["model"])

    async def _models(self, request):
        backend = self.srv.backend
        if backend is None:
            return self._error(503, "the teacher is still loading its model; retry later")
        card = {"id": self._model_id(), "object": "model", "created": int(time.time()),
                "owned_by": "miniverl", "root": str(backend.info.get("model")), "parent": None,
                "max_model_len": getattr(backend, "context_len", None), "permission": []}
        return self._json({"object": "list", "data": [card]})

    async def _completions(self, request):
        web = require("aiohttp.web", "openai")
        try:
            # The limits narrowed to the loaded model's context may be tighter than the
            # listener's (set before the load): a declared length over them is not read.
            bound = max_body_bytes(self.srv.limits)
            if request.content_length is not None and request.content_length > bound:
                raise HttpRefusal(413, f"request body of {request.content_length} bytes, over "
                                  f"{bound} (max_inflight SCOREs of max_tokens each); send "
                                  "fewer prompts per request")
            try:
                data = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise HttpRefusal(413, f"request body over {request.client_max_size} bytes: "
                                  "more tokens than the teacher's max_tokens; send fewer "
                                  "prompts per request") from None
            if len(data) > bound:
                raise HttpRefusal(413, f"request body of {len(data)} bytes, over {bound} "
                                  "(max_inflight SCOREs of max_tokens each); send fewer "
                                  "prompts per request")
            return self._json(await self._score(parse_body(data)))
        except HttpRefusal as exc:
            return self._error(exc.status, exc.message, exc.param)
        except Exception as exc:  # a bug of ours: one logged line and a JSON 500, no traceback
            log(self.srv, "error", "openai_internal_error",
                error=f"{type(exc).__name__}: {str(exc)[:200]}")
            return self._error(500, f"the teacher failed on this request ({type(exc).__name__});"
                               " its log has the reason")

    async def _score(self, body: Any) -> dict:
        srv = self.srv
        backend = srv.backend
        if backend is None or srv.state == TeacherState.LOADING:
            raise HttpRefusal(503, "the teacher is still loading its model; retry later")
        request = parse_request(body, self._model_id(), backend.vocab_size, srv.limits)
        seqs = request["prompts"]
        scored = [b for b, seq in enumerate(seqs) if len(seq) > 1]  # one token: no position
        groups = pack([len(seqs[b]) for b in scored], srv.limits)
        if len(groups) > srv.limits.max_inflight:
            raise HttpRefusal(413, f"{len(seqs)} prompts need {len(groups)} SCOREs of at most "
                              f"max_tokens={srv.limits.max_tokens} tokens, over the teacher's "
                              f"max_inflight={srv.limits.max_inflight}; send fewer prompts "
                              "per request (TRL: chunk_size)", "prompt")
        results = await asyncio.gather(
            *(self._score_group([seqs[scored[i]] for i in group], request) for group in groups))
        gens = {reply.gen for reply, _ in results}
        if len(gens) > 1:  # a RELOAD between two of this request's SCOREs
            raise HttpRefusal(503, "the teacher changed (reload) while this request was scored; "
                              "retry it")
        per_seq: dict[int, dict] = {}
        for group, (_, parts) in zip(groups, results, strict=True):
            for i, part in zip(group, parts, strict=True):
                per_seq[scored[i]] = part
        reply = results[0][0] if results else None
        return self._response(request, per_seq, reply)

    async def _score_group(self, seqs: list[list[int]], request: dict):
        """One SCORE for ``seqs`` (packed): ``(SCORE_OK, [arrays of each sequence])``."""
        cu = np.zeros(len(seqs) + 1, dtype=np.int32)
        cu[1:] = np.cumsum([len(seq) for seq in seqs])
        positions = np.concatenate(
            [np.arange(cu[b], cu[b + 1] - 1, dtype=np.int32) for b in range(len(seqs))])
        rid = next(self.ids)
        msg = m.Score(id=rid, student_version=request["student_version"] or 0, kind="topk",
                      k=request["k"], temperature=request["temperature"])
        arrays = {"tokens": np.concatenate([np.asarray(seq, dtype=np.int32) for seq in seqs]),
                  "cu_seqlens": cu, "positions": positions}
        future = asyncio.get_running_loop().create_future()
        self.pending[rid] = future
        try:
            await _on_score(self.srv, OPENAI_CLIENT, msg, arrays)
            reply, out = await future
        finally:
            self.pending.pop(rid, None)
        if isinstance(reply, m.ErrorReply):
            raise HttpRefusal(HTTP_STATUS.get(reply.code, 500),
                              f"{reply.code.value}: {reply.message}")
        # Row r of the reply is positions[r]; sequence b owns rows cu[b] - b .. cu[b+1] - b - 2.
        parts, row = [], 0
        for seq in seqs:
            rows = slice(row, row + len(seq) - 1)
            parts.append({name: out[name][rows] for name in m.TOPK_ARRAYS})
            row += len(seq) - 1
        return reply, parts

    def _decoder(self):
        """Token id -> text with the served model's tokenizer (None when it has no
        ``tokenizer.json`` this module can find: ``decoded_token`` is null then)."""
        backend = self.srv.backend
        key = id(backend)
        if key not in self._decoders:
            model_dir = getattr(getattr(backend, "loaded", None), "model_dir", None)
            path = Path(model_dir) / "tokenizer.json" if model_dir is not None else None
            decoder = None
            if path is not None and path.is_file():
                with contextlib.suppress(Exception):
                    from tokenizers import Tokenizer

                    decoder = Tokenizer.from_file(str(path))
            self._decoders = {key: decoder}
        return self._decoders[key]

    def _response(self, request: dict, per_seq: dict[int, dict], reply) -> dict:
        """vLLM's completion response for ``request`` from each scored sequence's arrays."""
        seqs, k = request["prompts"], request["k"]
        texts = self._texts(seqs, per_seq)
        choices, tails = [], []
        for index, seq in enumerate(seqs):
            lps: list[dict | None] = [None]
            tail: list[float | None] = [None]
            part = per_seq.get(index)
            for j in range(1, len(seq)):
                row = j - 1  # position j - 1 predicts token j
                entry = {}
                for rank, (tok, lp) in enumerate(
                        zip(part["ids"][row], part["logprobs"][row], strict=True), start=1):
                    entry[str(int(tok))] = {"logprob": float(lp), "rank": rank,
                                            "decoded_token": texts.get(int(tok))}
                actual = int(seq[j])
                if str(actual) not in entry:
                    # Outside the top-k: its true log-prob; its rank is at least k + 1
                    # (the teacher does not rank past k; docs/engine-teachers.md).
                    entry[str(actual)] = {"logprob": float(part["target_logprobs"][row]),
                                          "rank": k + 1, "decoded_token": texts.get(actual)}
                lps.append(entry)
                t = float(part["tail_logmass"][row])
                tail.append(t if np.isfinite(t) else None)
            choices.append({"index": index, "text": "", "logprobs": None,
                            "finish_reason": "length", "stop_reason": None,
                            "prompt_logprobs": lps, "prompt_token_ids": list(seq)})
            tails.append(tail)
        n_tokens = sum(len(seq) for seq in seqs)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": self._model_id(), "choices": choices,
            "usage": {"prompt_tokens": n_tokens, "completion_tokens": 0,
                      "total_tokens": n_tokens},
            "miniverl": {
                # The version the request named, as the SCORE_OK carried it back.
                "student_version": (reply.student_version
                                    if reply is not None and request["student_version"] is not None
                                    else request["student_version"]),
                "instance": self.srv.instance,
                "gen": reply.gen if reply is not None else self.srv.gen,
                "teacher": dict(self.srv.backend.info),
                "k": k,
                "tail_logmass": tails,
            },
        }

    def _texts(self, seqs: list[list[int]], per_seq: dict[int, dict]) -> dict[int, str]:
        """``decoded_token`` of every id the response names ({} without a tokenizer)."""
        decoder = self._decoder()
        if decoder is None or not per_seq:
            return {}
        wanted = {int(t) for part in per_seq.values() for t in np.unique(part["ids"])}
        wanted |= {int(t) for seq in seqs for t in seq}
        ordered = sorted(wanted)
        return dict(zip(ordered, decoder.decode_batch([[t] for t in ordered],
                                                      skip_special_tokens=False), strict=True))


MAX_BODY_BYTES = 64 << 20
# A request is an object holding a list of lists of ids: 3 levels. Deeper JSON is refused
# before it is walked (a body nested 100,000 deep once escaped as the decoder's
# RecursionError, a 500).
MAX_NESTING = 8


def parse_body(data: bytes) -> Any:
    """The JSON of a request body, or a 400 naming the rule: UTF-8 JSON, at most
    :data:`MAX_NESTING` levels deep."""
    depth = json_depth(data)
    if depth > MAX_NESTING:
        raise HttpRefusal(400, f"the body nests JSON more than {MAX_NESTING} levels deep "
                          f"(the limit); a request is an object holding lists of token ids")
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise HttpRefusal(400, "the body is not JSON (UTF-8); send a JSON object") from None


_BRACKET_STEP = np.zeros(256, np.int8)
_BRACKET_STEP[[0x5B, 0x7B]], _BRACKET_STEP[[0x5D, 0x7D]] = 1, -1  # [ {  and  ] }
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_depth(data: bytes) -> int:
    """How deep ``data``'s brackets nest outside strings: linear, no recursion, without
    decoding the JSON (strings are blanked first, so a bracket inside one is not counted)."""
    bare = np.frombuffer(_STRING.sub(b'""', data), dtype=np.uint8)
    steps = _BRACKET_STEP[bare]
    steps = steps[steps != 0]
    return int(np.cumsum(steps, dtype=np.int64).max()) if steps.size else 0


def max_body_bytes(lim) -> int:
    """The largest body a request within ``lim`` can have: ``max_inflight`` SCOREs of
    ``max_tokens`` ids (at most 11 characters of JSON each), capped at 64 MiB of JSON."""
    return min(12 * lim.max_tokens * lim.max_inflight + (64 << 10), MAX_BODY_BYTES)


def pack(lengths: list[int], lim) -> list[list[int]]:
    """Consecutive sequences grouped into SCOREs within ``max_tokens``, ``max_positions``
    and ``max_sequences``: indices into ``lengths`` per group (each length fits alone:
    :func:`parse_request` checked)."""
    groups: list[list[int]] = []
    tokens = positions = 0
    for i, n in enumerate(lengths):
        if (not groups or tokens + n > lim.max_tokens or positions + n - 1 > lim.max_positions
                or len(groups[-1]) >= lim.max_sequences):
            groups.append([])
            tokens = positions = 0
        groups[-1].append(i)
        tokens += n
        positions += n - 1
    return groups


def parse_request(body: Any, model_id: str | None, vocab_size: int, lim) -> dict:
    """The request's prompts, k, temperature and student version, or an HttpRefusal
    naming the field, the rule and the fix."""
    if not isinstance(body, dict):
        raise HttpRefusal(400, "the body must be a JSON object")
    unknown = sorted(set(body) - REQUEST_FIELDS)
    if unknown:
        raise HttpRefusal(400, f"fields {_shown(unknown)} are not served: this teacher scores prompts "
                          f"(it understands {sorted(REQUEST_FIELDS)})", unknown[0][:60])
    if body.get("model") != model_id:
        raise HttpRefusal(404, f"The model `{_shown(body.get('model'), quote=False)}` does not exist; this teacher "
                          f"serves `{model_id}` (GET /v1/models)", "model")
    if body.get("stream") or body.get("echo") or body.get("logprobs") not in (None, 0):
        raise HttpRefusal(400, "stream, echo and logprobs are not served; ask for "
                          "prompt_logprobs only")
    if body.get("n", 1) != 1:
        raise HttpRefusal(400, f"n={_shown(body.get('n'))}: one choice per prompt; leave n out",
                          "n")
    max_tokens = body.get("max_tokens", 1)
    if max_tokens not in (0, 1) or isinstance(max_tokens, bool):
        raise HttpRefusal(400, f"max_tokens={_shown(max_tokens)}: this teacher scores prompts and "
                          "generates nothing; send max_tokens 1 (or 0)", "max_tokens")
    k = body.get("prompt_logprobs")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= min(lim.max_k, vocab_size):
        raise HttpRefusal(400, f"prompt_logprobs={_shown(k)}: ask for k top log-probs per position "
                          f"with 1 <= k <= {min(lim.max_k, vocab_size)}", "prompt_logprobs")
    temperature = body.get("temperature", 1.0)
    if (isinstance(temperature, bool) or not isinstance(temperature, int | float)
            or not m.TEMPERATURE_MIN <= temperature <= m.TEMPERATURE_MAX):
        raise HttpRefusal(400, f"temperature={_shown(temperature)} is outside [{m.TEMPERATURE_MIN}, "
                          f"{m.TEMPERATURE_MAX}]; pick one inside", "temperature")
    version = body.get(STUDENT_VERSION_FIELD)
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or not 0 <= version <= m.MAX_ID):
        raise HttpRefusal(400, f"{STUDENT_VERSION_FIELD}={_shown(version)}: the student's parameter "
                          "version, an integer >= 0", STUDENT_VERSION_FIELD)
    prompts = body.get("prompt")
    if isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts):
        prompts = [prompts]
    if (not isinstance(prompts, list) or not prompts
            or not all(isinstance(s, list) and s for s in prompts)):
        raise HttpRefusal(400, "prompt must be token ids: a non-empty list of ints or a list "
                          "of such lists (this teacher does not tokenize text)", "prompt")
    most_prompts = lim.max_sequences * lim.max_inflight
    if len(prompts) > most_prompts:
        raise HttpRefusal(413, f"{len(prompts)} prompts, over the {most_prompts} one request may "
                          "hold (max_sequences per SCORE x max_inflight SCOREs); send fewer "
                          "prompts per request", "prompt")
    most_tokens = lim.max_tokens * lim.max_inflight
    n_tokens = sum(len(seq) for seq in prompts)
    if n_tokens > most_tokens:
        raise HttpRefusal(413, f"{n_tokens} tokens in all, over the {most_tokens} one request "
                          "may hold (max_tokens per SCORE x max_inflight SCOREs); send fewer "
                          "prompts per request", "prompt")
    for i, seq in enumerate(prompts):
        for t in seq:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
                raise HttpRefusal(400, f"prompt {i} holds {_shown(t)}; token ids are ints in "
                                  f"[0, {vocab_size})", "prompt")
        longest = min(lim.max_tokens, lim.max_positions + 1,
                      lim.max_seq_len if lim.max_seq_len is not None else lim.max_tokens)
        if len(seq) > longest:
            raise HttpRefusal(413, f"prompt {i} has {len(seq)} tokens, over the {longest} one "
                              "SCORE of this teacher takes (its max_tokens, max_positions and "
                              "context); send shorter sequences", "prompt")
    return {"prompts": prompts, "k": k, "temperature": float(temperature),
            "student_version": version}


def _shown(value: Any, *, quote: bool = True) -> str:
    """A client's value as an error message shows it: its repr, cut at 60 characters (a
    60 MB field is not echoed back)."""
    text = repr(value) if quote else str(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def run_with_openai(server, config: OpenAIConfig) -> int:
    """Run ``server`` (a TeacherServer) with the HTTP front end beside its ZeroMQ socket;
    SIGTERM and SIGINT mean ``SHUTDOWN drain``, as ``run_server``."""
    import signal

    async def main() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, server.request_shutdown, "drain")
        serving = asyncio.create_task(server.serve())
        await asyncio.sleep(0)  # serve() binds the ZeroMQ socket before its first await
        if serving.done():
            return serving.result()
        front = OpenAIFrontEnd(server.srv, config)
        try:
            await front.start()
        except BaseException:
            server.request_shutdown("abort")
            with contextlib.suppress(Exception):
                await serving
            raise
        try:
            return await serving
        finally:
            await front.stop()

    return asyncio.run(main())
