"""The built-in backend: a loaded torch model behind ``score_batch``/``park``/``wake``.

:class:`TorchTeacher` adapts a :class:`~miniverl.teacher_server.loader.LoadedTeacher` to
the :class:`~miniverl.teacher_server.backend.Backend` interface: coalesced jobs go through
:func:`~miniverl.teacher_server.scoring.score_requests` in one decoder pass (the server
checked each job when it arrived, the batcher checks each reply before it is sent), and
park/wake move the weights between the accelerator and host memory. A teacher loaded
with named adapters (``--adapters``) holds one PEFT model over one base; each batch,
whose jobs all name one adapter (``batcher.take_batch``), is scored with that adapter
active (PEFT's ``set_adapter``), and the prefix cache keys its blocks by adapter. The loader the server calls is built by
:func:`~miniverl.teacher_server.scorers.make_loader`.

Parking on CPU: the weights already live in host memory, so PARK/WAKE only change the
state the server reports (``PARKED``/``READY``); a ``SCORE`` while parked wakes the
teacher implicitly (the server logs ``implicit_wake``). This module does not touch
sockets.
"""

from __future__ import annotations

import gc
from typing import Any

from miniverl.teacher_server.backend import BackendError, ScoreJob
from miniverl.teacher_server.loader import LoadedTeacher
from miniverl.teacher_server.prefix_cache import PrefixCache
from miniverl.teacher_server.scoring import score_requests


def pinned_host_copy(tensor: Any) -> Any:
    """A page-locked host copy of an accelerator tensor (copies from pinned memory run at
    full bus speed and asynchronously; pageable memory is staged through a bounce buffer)."""
    import torch

    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


def park_to_host(model: Any) -> None:
    """Move ``model``'s parameters and buffers to pinned host memory (``wake``'s
    ``model.to(device)`` then copies back from it). A quantized model's parameters carry
    their own quantization state: those go through ``model.to("cpu")``."""
    import torch

    tensors = [*model.parameters(), *model.buffers()]
    if any(type(p) not in (torch.nn.Parameter, torch.Tensor) for p in tensors):
        model.to("cpu")
        return
    for t in tensors:
        t.data = pinned_host_copy(t.data)
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # every non-blocking copy has landed before the free

class TorchTeacher:
    """A frozen causal LM that scores coalesced jobs (runs on the server's worker thread)."""

    def __init__(self, loaded: LoadedTeacher, *, exact_max_vocab: int, max_batch_tokens: int):
        self.loaded = loaded
        self.model = loaded.model
        self.info = dict(loaded.info)
        self.tokenizer_fp = loaded.tokenizer_fp
        self.vocab_size = loaded.vocab_size
        self.context_len = loaded.context_len
        self.device = loaded.device
        # The server refuses exact SCOREs above it (limits.max_exact_vocab, set from the
        # same --exact-max-vocab) before a job is made; kept as the loader passed it.
        self.exact_max_vocab = exact_max_vocab
        self.max_batch_tokens = max_batch_tokens
        self.prefix_cache = PrefixCache()  # make_loader sizes it (--prefix-cache-tokens)
        self.parked = False
        self._tokenizer: Any = loaded.extra.get("tokenizer")
        self.adapters = dict(loaded.adapters)  # name -> adapter_sha256; {} for one model
        self._active_adapter: str | None = None

    @property
    def tokenizer(self) -> Any:
        """The model directory's tokenizer, loaded on first use (``xvocab`` renders and
        tokenizes episodes with it, teacher_server/xvocab.py); None without a directory."""
        if self._tokenizer is None and self.loaded.model_dir is not None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.loaded.model_dir))
        return self._tokenizer

    def score_batch(self, jobs: list[ScoreJob]) -> list[dict | BackendError]:
        # A deterministic job comes alone (batcher.take_batch) and skips the prefix cache:
        # whether a cached prefix is hit depends on earlier requests, and a prefix computed
        # apart from its suffix rounds differently from one forward pass over both.
        deterministic = any(getattr(job, "deterministic", False) for job in jobs)
        adapter = self._activate({job.adapter for job in jobs})
        return score_requests(
            self.model,
            jobs,
            max_batch_tokens=self.max_batch_tokens,
            prefix_cache=None if deterministic else self.prefix_cache.keyed(adapter),
        )

    def _activate(self, asked: set[str | None]) -> str | None:
        """Make the one adapter a batch asks for the active one; returns its name."""
        if len(asked) != 1:  # batcher.take_batch coalesces one adapter's jobs only
            raise RuntimeError(f"one batch asks for several adapters: {sorted(map(str, asked))}")
        (adapter,) = asked
        served = adapter in self.adapters if self.adapters else adapter is None
        if not served:  # the server refuses such a SCORE on receipt: a bug, not a request
            raise RuntimeError(f"a job asks for adapter {adapter!r}; this backend serves "
                               f"{sorted(self.adapters) or 'none'}")
        if adapter is not None and adapter != self._active_adapter:
            self.model.set_adapter(adapter)
            # set_adapter makes the adapter trainable (and not every PEFT we accept has
            # its inference_mode=); the teacher stays frozen.
            self.model.requires_grad_(False)
            self._active_adapter = adapter
        return adapter

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

            park_to_host(self.model)
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
