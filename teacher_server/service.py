"""The teacher as a transport backend: a loaded model behind ``score_batch``/``park``/``wake``.

:class:`TorchTeacher` adapts a :class:`~miniverl.teacher_server.loader.LoadedTeacher` to
the :class:`miniverl.protocol.server.Backend` interface: coalesced jobs go through
:func:`~miniverl.teacher_server.scoring.score_requests` in one decoder pass, scoring
errors become per-job ``BackendError`` s, and park/wake move the weights between the
accelerator and host memory. :func:`make_loader` turns a :class:`TeacherSpec` into the
loader the transport calls at start (``None``) and on ``RELOAD`` (the request's model,
revision and adapter with the same device, dtype and offline setting).

Parking on CPU: the weights already live in host memory, so PARK/WAKE only change the
state the server reports (``PARKED``/``READY``); a ``SCORE`` while parked wakes the
teacher implicitly (the server logs ``implicit_wake``). This module does not touch
sockets.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from miniverl.protocol.messages import ErrorCode
from miniverl.protocol.server import BackendError, Loader, ScoreJob
from miniverl.teacher_server.loader import LoadedTeacher, TeacherSpec
from miniverl.teacher_server.prefix_cache import PREFIX_CACHE_TOKENS, PrefixCache
from miniverl.teacher_server.scoring import ScoringBadRequest, ScoringUnsupported, score_requests


class TorchTeacher:
    """A frozen causal LM that scores coalesced jobs (runs on the server's worker thread)."""

    def __init__(self, loaded: LoadedTeacher, *, exact_max_vocab: int, max_batch_tokens: int):
        self.loaded = loaded
        self.model = loaded.model
        self.info = dict(loaded.info)
        self.tokenizer_fp = loaded.tokenizer_fp
        self.vocab_size = loaded.vocab_size
        self.device = loaded.device
        self.exact_max_vocab = exact_max_vocab
        self.max_batch_tokens = max_batch_tokens
        self.prefix_cache = PrefixCache()  # make_loader sizes it (--prefix-cache-tokens)
        self.parked = False

    def score_batch(self, jobs: list[ScoreJob]) -> list[dict | BackendError]:
        results = score_requests(
            self.model,
            jobs,
            exact_max_vocab=self.exact_max_vocab,
            max_batch_tokens=self.max_batch_tokens,
            prefix_cache=self.prefix_cache,
        )
        out: list[dict | BackendError] = []
        for result in results:
            if isinstance(result, ScoringUnsupported):
                out.append(BackendError(ErrorCode.UNSUPPORTED, str(result)))
            elif isinstance(result, ScoringBadRequest):
                out.append(BackendError(ErrorCode.BAD_REQUEST, str(result)))
            else:
                out.append(result)
        return out

    def stats(self) -> dict[str, Any]:
        """Counters the server logs with each batch (``--log-level debug``)."""
        return {"prefix_cache": self.prefix_cache.stats()}

    def _on_accelerator(self) -> bool:
        return not self.device.startswith("cpu")

    def park(self) -> None:
        if self.parked:
            return
        self.prefix_cache.clear()  # its KV lives on the accelerator too
        if self._on_accelerator():
            import torch

            self.model.to("cpu")
            torch.cuda.empty_cache()
        self.parked = True

    def wake(self) -> None:
        if not self.parked:
            return
        if self._on_accelerator():
            self.model.to(self.device)
        self.parked = False

    def memory(self) -> dict[str, Any]:
        if not self._on_accelerator():
            return {"device": self.device}
        import torch

        dev = torch.device(self.device)
        return {
            "device": self.device,
            "allocated_bytes": int(torch.cuda.memory_allocated(dev)),
            "reserved_bytes": int(torch.cuda.memory_reserved(dev)),
            "total_bytes": int(torch.cuda.get_device_properties(dev).total_memory),
        }

    def close(self) -> None:
        self.prefix_cache.clear()
        self.model = None
        self.loaded.model = None
        gc.collect()
        if self._on_accelerator():
            import torch

            torch.cuda.empty_cache()


def make_loader(
    spec: TeacherSpec | Callable[[], TeacherSpec],
    *,
    exact_max_vocab: int = 262144,
    max_batch_tokens: int = 8192,
    threads: int | None = None,
    scorer: str = "causal_lm",
    scorer_options: dict[str, Any] | None = None,
    prefix_cache_tokens: int = PREFIX_CACHE_TOKENS,
) -> Loader:
    """The loader a :class:`~miniverl.protocol.server.TeacherServer` calls (worker thread).

    ``spec`` may be a callable, resolved on the worker thread at the first load: a
    recipe's toy teacher is then built after the socket is bound, not before.
    ``threads`` is applied on the worker thread (where every forward pass runs) at
    the first load, so importing torch never delays the bind. ``scorer`` names the
    factory that builds the backend (``teacher_server/scorers.py``; the default is the
    causal LM itself), ``scorer_options`` its keyword options. ``prefix_cache_tokens``
    sizes the built-in backend's prefix cache (``teacher_server/prefix_cache.py``).
    """
    from miniverl.teacher_server.scorers import get_scorer

    factory = get_scorer(scorer)  # an unknown scorer fails before the bind

    def load(request: dict[str, Any] | None) -> TorchTeacher:
        nonlocal spec
        if request is None and threads is not None:
            from miniverl.common.runtime import apply_cpu_threads

            apply_cpu_threads(threads)
        if callable(spec):
            spec = spec()
        chosen = spec
        if request is not None:
            chosen = spec.with_model(
                request["model"], request.get("revision"), request.get("adapter"),
                request.get("adapter_revision"),
            )
        backend = factory(
            chosen,
            exact_max_vocab=exact_max_vocab,
            max_batch_tokens=max_batch_tokens,
            options=dict(scorer_options or {}),
        )
        if isinstance(backend, TorchTeacher):  # a plug-in scorer manages its own
            backend.prefix_cache = PrefixCache(prefix_cache_tokens)
        return backend

    return load
