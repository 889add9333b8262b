"""A scriptable hostile vLLM / SGLang server: test what an engine-teacher client refuses.

:class:`HostileEngine` is a real loopback HTTP server (the standard library's
``ThreadingHTTPServer``) that answers the routes ``protocol/engine_client.py`` calls, in
either flavour's documented shape (vLLM: ``GET /v1/models``, ``POST /tokenize``, ``POST
/v1/completions`` with ``prompt_logprobs``; SGLang: ``GET /get_model_info``, ``POST
/generate``), honestly at first and then with one misbehaviour
(:data:`HOSTILE_BEHAVIOURS`)::

    from miniverl.testing import HostileEngine

    with HostileEngine(tokenize=encode, vocab_size=V, behaviour="positive_logprobs") as engine:
        ...  # a recipe with teacher.endpoint: engine.url, teacher.api: engine.flavour

``tokenize(text, add_special_tokens)`` is the tokenizer it claims to serve (the
handshake's probes must match the student's); ``after`` is how many scoring requests it
answers honestly before it misbehaves (a run then makes that many requests' worth of
progress first); ``behaviour`` may be changed between requests. Its honest numbers are
a fixed, torch-free distribution per position (seeded by the previous token and the
position), so the targets a client builds from them are known in advance
(:meth:`HostileEngine.targets`).

``reply_with(route, body) -> (status, bytes)``, when set, answers every scoring request
instead (a generated reply: ``benchmarks/http_fuzz.py``); :meth:`HostileEngine.honest`
is the honest answer to mutate. ``scored`` counts the scoring requests received, ``misbehaved`` those answered with
the misbehaviour; ``requests`` records every ``(route, body)``.

This module does not check what a client does with an answer; the tests do
(``tests/testing/test_hostile_engine.py``, ``docs/testing.md``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

HOSTILE_BEHAVIOURS: dict[str, str] = {
    "honest": "answers every request correctly",
    "positive_logprobs": "every log-prob is +5.0 (raw logits, not log-probabilities)",
    "mass_over_one": "every top-k log-prob is log(0.9): each at most 0, their sum above 1",
    "nan_logprob": "one log-prob is NaN",
    "infinite_logprob": "one log-prob is +Infinity",
    "short": "one entry fewer than the prompt has tokens",
    "missing_actual": "the actual token's log-prob is missing (another id in its place)",
    "out_of_vocab": "a token id past the vocabulary",
    "model_changed": "the reply (vLLM) or /get_model_info (SGLang) names another model",
    "http_500": "HTTP 500 to every scoring request",
    "huge": "a reply of huge_bytes (300 MB by default), streamed",
    "drip": "the right reply, one byte every drip_s seconds",
    "never_ends": "a reply that streams whitespace until the client hangs up",
    "ranks_shuffled": "the top-k in reverse order, ranks numbered backwards (harmless)",
    "duplicate_ids": "one position names a token id twice",
    "redirect": "HTTP 307 to another address",
    "deep_nesting": "a JSON body nested 100,000 deep",
    "not_json": "an HTML error page with status 200",
}
SCORE_ROUTES = ("/v1/completions", "/generate")
CHUNK = 1 << 20


class HostileEngine:
    """A loopback vLLM- or SGLang-shaped server with one scripted misbehaviour."""

    def __init__(self, *, tokenize: Callable[[str, bool], list[int]], vocab_size: int,
                 flavour: str = "vllm", model: str = "hostile-teacher",
                 behaviour: str = "honest", after: int = 0, huge_bytes: int = 300 << 20,
                 drip_s: float = 20.0, seed: int = 0):
        if flavour not in ("vllm", "sglang"):
            raise ValueError(f"flavour {flavour!r} is not vllm or sglang")
        self.tokenize, self.vocab_size, self.flavour, self.model = (
            tokenize, vocab_size, flavour, model)
        self.behaviour, self.after = behaviour, after
        self.huge_bytes, self.drip_s, self.seed = huge_bytes, drip_s, seed
        self.scored = self.misbehaved = 0
        self.reply_with: Callable[[str, Any], tuple[int, bytes]] | None = None
        self.requests: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                engine._handle(self, None)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                engine._handle(self, json.loads(self.rfile.read(length) or b"null"))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def behaviour(self) -> str:
        return self._behaviour

    @behaviour.setter
    def behaviour(self, name: str) -> None:
        if name not in HOSTILE_BEHAVIOURS:
            raise ValueError(f"behaviour {name!r} is not one of {', '.join(HOSTILE_BEHAVIOURS)}")
        self._behaviour = name

    def __enter__(self) -> HostileEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving; a dripping or endless answer stops at its next write."""
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()

    # ----------------------------------------------------------------- honest numbers
    def distribution(self, prev: int, position: int) -> np.ndarray:
        """log-probs (float64, over the vocabulary) of the token at ``position`` after
        ``prev``: a fixed function of the two and the seed."""
        rng = np.random.default_rng([self.seed, int(prev), int(position)])
        logits = rng.normal(0.0, 3.0, self.vocab_size)
        return logits - np.logaddexp.reduce(logits)

    def targets(self, seq: list[int], k: int) -> dict[str, np.ndarray]:
        """What an honest answer means for positions ``0 .. len(seq) - 2``: top-k ids
        (highest first, ties by id), their log-probs and the actual token's, float32."""
        ids, lps, actual = [], [], []
        for j in range(1, len(seq)):
            lp = self.distribution(seq[j - 1], j).astype(np.float32)
            top = np.lexsort((np.arange(len(lp)), -lp))[:k]
            ids.append(top)
            lps.append(lp[top])
            actual.append(lp[seq[j]])
        return {"ids": np.array(ids, np.int32).reshape(-1, k),
                "logprobs": np.array(lps, np.float32).reshape(-1, k),
                "target_logprobs": np.array(actual, np.float32)}

    # ----------------------------------------------------------------- answering
    def _handle(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        route = handler.path
        with self._lock:
            self.requests.append((route, body))
            scoring = route in SCORE_ROUTES and isinstance(body, dict) and (
                "prompt" in body or "input_ids" in body)
            if scoring:
                self.scored += 1
            active = self.behaviour != "honest" and self.scored > self.after
            hostile = scoring and active
            if hostile:
                self.misbehaved += 1
        try:
            if scoring and self.reply_with is not None:
                status, data = self.reply_with(route, body)
                self._send(handler, status, data)
                return
            if hostile and self._transport_fault(handler):
                return
            answer = self._answer(route, body, active)
            if answer is None:
                self._send(handler, 404, json.dumps({"error": {"message": route}}).encode())
                return
            data = self._mangle(answer, body) if hostile else json.dumps(answer).encode()
            if hostile and self.behaviour == "drip":
                self._drip(handler, data)
                return
            self._send(handler, 200, data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up, as it should on a bad answer

    def _send(self, handler: BaseHTTPRequestHandler, status: int, data: bytes,
              headers: dict[str, str] | None = None) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)

    def _transport_fault(self, handler: BaseHTTPRequestHandler) -> bool:
        """Answer a fault that needs no honest body; False for the others."""
        name = self.behaviour
        if name == "http_500":
            self._send(handler, 500, b'{"error": {"message": "engine fell over"}}')
        elif name == "redirect":
            self._send(handler, 307, b"{}", {"Location": "http://127.0.0.1:9/elsewhere"})
        elif name == "deep_nesting":
            self._send(handler, 200, b"[" * 100_000 + b"]" * 100_000)
        elif name == "not_json":
            self._send(handler, 200, b"<html><body>502 upstream error</body></html>")
        elif name == "huge":
            head, tail = b'{"choices": [], "padding": "', b'"}'
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(self.huge_bytes))
            handler.end_headers()
            handler.wfile.write(head)
            left, block = self.huge_bytes - len(head) - len(tail), b"x" * CHUNK
            while left > 0 and not self._closing.is_set():
                handler.wfile.write(block[:min(left, CHUNK)])
                left -= CHUNK
            handler.wfile.write(tail)
        elif name == "never_ends":
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Connection", "close")  # close-delimited: no length
            handler.end_headers()
            handler.wfile.write(b"{")
            while not self._closing.is_set():
                handler.wfile.write(b" " * 65536)
        else:
            return False
        return True

    def _drip(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        for i in range(len(data)):
            handler.wfile.write(data[i:i + 1])
            handler.wfile.flush()
            if self._closing.wait(self.drip_s):
                return

    def honest(self, route: str, body: Any) -> Any:
        """The honest answer (JSON-ready) to ``body`` at ``route``; None for a route not
        served."""
        return self._answer(route, body, active=False)

    def _answer(self, route: str, body: Any, active: bool) -> Any:
        served = "another-model" if active and self.behaviour == "model_changed" else self.model
        if self.flavour == "vllm":
            if route == "/v1/models":
                return {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            if route == "/tokenize":
                tokens = self.tokenize(body["prompt"], body.get("add_special_tokens", True))
                return {"count": len(tokens), "max_model_len": 4096, "tokens": tokens}
            if route == "/v1/completions":
                k = int(body["prompt_logprobs"])
                return {"id": "cmpl-hostile", "object": "text_completion", "model": self.model,
                        "choices": [{"index": i, "text": "", "finish_reason": "length",
                                     "prompt_logprobs": self._vllm_entries(seq, k)}
                                    for i, seq in enumerate(body["prompt"])]}
            return None
        if route == "/get_model_info":
            return {"model_path": served, "tokenizer_path": served, "is_generation": True}
        if route == "/generate":
            if "text" in body:  # the tokenizer probe; SGLang adds special tokens
                seq = self.tokenize(body["text"], True)
                return {"text": "", "meta_info": self._sglang_meta(seq, 1)}
            k = int(body["top_logprobs_num"])
            return [{"text": "", "meta_info": self._sglang_meta(seq, k)}
                    for seq in body["input_ids"]]
        return None

    def _vllm_entries(self, seq: list[int], k: int) -> list:
        out: list = [None]
        if len(seq) < 2:
            return out[:len(seq)]
        t = self.targets(seq, k)
        for j in range(len(seq) - 1):
            entry = {str(int(i)): {"logprob": float(lp), "rank": r + 1, "decoded_token": None}
                     for r, (i, lp) in enumerate(zip(t["ids"][j], t["logprobs"][j],
                                                     strict=True))}
            actual = str(int(seq[j + 1]))
            if actual not in entry:
                entry[actual] = {"logprob": float(t["target_logprobs"][j]), "rank": k + 1,
                                 "decoded_token": None}
            out.append(entry)
        return out

    def _sglang_meta(self, seq: list[int], k: int) -> dict:
        tokens: list = [[None, int(seq[0]), None]] if seq else []
        tops: list = [None] if seq else []
        if len(seq) >= 2:
            t = self.targets(seq, k)
            for j in range(len(seq) - 1):
                tokens.append([float(t["target_logprobs"][j]), int(seq[j + 1]), None])
                tops.append([[float(lp), int(i), None]
                             for i, lp in zip(t["ids"][j], t["logprobs"][j], strict=True)])
        return {"id": "hostile", "prompt_tokens": len(seq), "completion_tokens": 1,
                "input_token_logprobs": tokens, "input_top_logprobs": tops}

    # ----------------------------------------------------------------- the faults
    def _mangle(self, answer: Any, request: dict) -> bytes:
        """The honest ``answer`` with the misbehaviour applied at every position of every
        prompt (a client reads only the positions it trains on), as bytes."""
        name = self.behaviour
        vllm = self.flavour == "vllm"
        prompts = request["prompt"] if vllm else request["input_ids"]
        if vllm:
            answer["model"] = "another-model" if name == "model_changed" else answer["model"]
            spots = [(c["prompt_logprobs"], seq)
                     for c, seq in zip(answer["choices"], prompts, strict=True)]
        else:
            spots = [(item["meta_info"], seq) for item, seq in zip(answer, prompts, strict=True)]
        if name == "short":
            for entries, _ in spots:
                (entries if vllm else entries["input_top_logprobs"]).pop()
            return json.dumps(answer).encode()
        if name == "duplicate_ids" and vllm:  # JSON allows a key twice; a reader keeping
            text = json.dumps(answer)         # the last silently loses an entry
            for entries, _ in spots:
                for entry in entries[1:]:
                    key, value = next(iter(entry.items()))
                    one = f'"{key}": {json.dumps(value)}'
                    text = text.replace(one, f"{one}, {one}", 1)
            return text.encode()
        value = {"positive_logprobs": 5.0, "mass_over_one": float(np.log(0.9)),
                 "nan_logprob": float("nan"), "infinite_logprob": float("inf")}.get(name)
        for entries, seq in spots:
            for j in range(1, _count(entries, vllm)):
                actual = int(seq[j])
                if value is not None:
                    slots = _slots(entries, j, vllm)
                    for container, key in (slots if name in ("positive_logprobs",
                                                             "mass_over_one") else slots[:1]):
                        container[key] = value
                elif name == "ranks_shuffled":
                    if vllm:
                        items = list(entries[j].items())[::-1]
                        entries[j] = {key: {**v, "rank": len(items) - r}
                                      for r, (key, v) in enumerate(items)}
                    else:
                        entries["input_top_logprobs"][j].reverse()
                elif name == "missing_actual":
                    other = next(t for t in range(self.vocab_size) if t != actual and (
                        not vllm or str(t) not in entries[j]))
                    if vllm:  # the actual token is always there (k + 1-th outside the top-k)
                        entries[j][str(other)] = entries[j].pop(str(actual))
                    else:
                        entries["input_token_logprobs"][j][1] = other
                elif name == "out_of_vocab":
                    if vllm:
                        key = next(k for k in entries[j] if k != str(actual))
                        entries[j][str(self.vocab_size + 7)] = entries[j].pop(key)
                    else:
                        entries["input_top_logprobs"][j][0][1] = self.vocab_size + 7
                elif name == "duplicate_ids":  # SGLang: a triple twice in the list
                    tops = entries["input_top_logprobs"][j]
                    tops[-1] = list(tops[0])
        return json.dumps(answer).encode()


def _count(entries: Any, vllm: bool) -> int:
    return len(entries) if vllm else len(entries["input_top_logprobs"])


def _slots(entries: Any, j: int, vllm: bool) -> list[tuple[Any, Any]]:
    """Where position ``j``'s log-probs sit, as ``(container, key)`` pairs."""
    if vllm:
        return [(value, "logprob") for value in entries[j].values()]
    return ([(triple, 0) for triple in entries["input_top_logprobs"][j]]
            + [(entries["input_token_logprobs"][j], 0)])

