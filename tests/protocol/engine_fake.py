"""A fake vLLM / SGLang server for the engine-teacher tests: a real local HTTP server.

:class:`FakeEngine` runs the standard library's ``ThreadingHTTPServer`` on a loopback
port and answers the routes ``protocol/engine_client.py`` calls, in the documented
shapes of each flavour (vLLM: ``GET /v1/models``, ``POST /tokenize``, ``POST
/v1/completions`` with ``prompt_logprobs``; SGLang: ``GET /get_model_info``, ``POST
/generate`` with ``input_token_logprobs`` / ``input_top_logprobs``). The numbers are our
own teacher's: ``teacher_server.scoring.score_positions`` on a toy model, each float32
written as the JSON number that reads back as that float32, so a test compares the
client's targets with our teacher's exactly. Like vLLM, a position whose actual token is
outside the top-k carries it as a ``k + 1``-th entry.

Knobs a test turns between requests: ``model`` (the name served: a restart with other
weights), ``tokenize`` (the server's tokenizer), ``fail_next`` (answer that many
requests ``503``), ``delay_s``, ``mangle(route, body) -> body | bytes`` (garbage).
``requests`` records every (route, body) received.

Not a test module: ``from tests.protocol.engine_fake import FakeEngine``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np


def _f(x: Any) -> float:
    return float(np.float32(x))


class FakeEngine:
    def __init__(self, model: Any, tokenizer: Any, *, flavour: str = "vllm",
                 name: str = "toy-teacher", api_key: str | None = None):
        self.torch_model, self.flavour, self.model = model, flavour, name
        self.tokenize: Callable[[str, bool], list[int]] = (
            lambda text, special: tokenizer.encode(text, add_special_tokens=special))
        self.api_key = api_key
        self.fail_next = 0
        self.delay_s = 0.0
        self.mangle: Callable[[str, Any], Any] | None = None
        self.requests: list[tuple[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
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
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ----------------------------------------------------------------- answering
    def _handle(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        route = handler.path
        with self._lock:
            self.requests.append((route, body))
            self.headers.append(dict(handler.headers))
            failing = self.fail_next > 0
            self.fail_next -= failing
        if self.delay_s:
            time.sleep(self.delay_s)
        if failing:
            return self._send(handler, 503, {"error": {"message": "overloaded"}})
        if self.api_key and handler.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._send(handler, 401, {"error": {"message": "bad key"}})
        try:
            status, answer = 200, self._answer(route, body)
        except KeyError as exc:
            status, answer = 404, {"error": {"message": f"no route {exc}"}}
        if self.mangle is not None:
            answer = self.mangle(route, answer)
        self._send(handler, status, answer)

    def _send(self, handler: BaseHTTPRequestHandler, status: int, answer: Any) -> None:
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _answer(self, route: str, body: Any) -> Any:
        vllm = self.flavour == "vllm"
        if vllm and route == "/v1/models":
            return {"object": "list", "data": [{"id": self.model, "object": "model",
                                                "root": self.model, "max_model_len": 1024}]}
        if vllm and route == "/tokenize":
            tokens = self.tokenize(body["prompt"], body.get("add_special_tokens", True))
            return {"count": len(tokens), "max_model_len": 1024, "tokens": tokens}
        if vllm and route == "/v1/completions":
            prompts = body["prompt"]
            return {"id": "cmpl-1", "object": "text_completion", "model": self.model,
                    "choices": [{"index": i, "text": "", "finish_reason": "length",
                                 "prompt_logprobs": self._vllm_entries(seq,
                                                                       body["prompt_logprobs"])}
                                for i, seq in enumerate(prompts)]}
        if not vllm and route == "/get_model_info":
            return {"model_path": self.model, "tokenizer_path": self.model,
                    "is_generation": True}
        if not vllm and route == "/generate":
            if "text" in body:  # the tokenizer probe: SGLang adds special tokens
                seq = self.tokenize(body["text"], True)
                return {"text": "", "meta_info": self._sglang_meta(seq, 1)}
            k = body["top_logprobs_num"]
            return [{"text": "", "meta_info": self._sglang_meta(seq, k)}
                    for seq in body["input_ids"]]
        raise KeyError(route)

    def score(self, seq: list[int], k: int) -> dict[str, np.ndarray]:
        """Our teacher's targets for every position of ``seq`` (0 .. n-2)."""
        from miniverl.teacher_server.scoring import score_positions

        n = len(seq)
        return score_positions(self.torch_model, np.asarray(seq, np.int32),
                               np.array([0, n], np.int32), np.arange(n - 1, dtype=np.int32),
                               kind="topk", k=k)

    def _vllm_entries(self, seq: list[int], k: int) -> list:
        if len(seq) < 2:
            return [None] * len(seq)
        arrays = self.score(seq, k)
        entries: list = [None]
        for j in range(len(seq) - 1):
            entry = {str(int(i)): {"logprob": _f(lp), "rank": r + 1, "decoded_token": "?"}
                     for r, (i, lp) in enumerate(zip(arrays["ids"][j], arrays["logprobs"][j],
                                                     strict=True))}
            actual = str(seq[j + 1])
            if actual not in entry:  # vLLM adds the actual token as a (k+1)-th entry
                entry[actual] = {"logprob": _f(arrays["target_logprobs"][j]), "rank": k + 5,
                                 "decoded_token": "?"}
            entries.append(entry)
        return entries

    def _sglang_meta(self, seq: list[int], k: int) -> dict:
        tokens: list = [[None, int(seq[0]), None]] if seq else []
        tops: list = [None] if seq else []
        if len(seq) >= 2:
            arrays = self.score(seq, k)
            for j in range(len(seq) - 1):
                tokens.append([_f(arrays["target_logprobs"][j]), int(seq[j + 1]), None])
                tops.append([[_f(lp), int(i), None] for i, lp in
                             zip(arrays["ids"][j], arrays["logprobs"][j], strict=True)])
        return {"id": "r1", "prompt_tokens": len(seq), "completion_tokens": 1,
                "input_token_logprobs": tokens, "input_top_logprobs": tops}
