"""Scorers: what turns a teacher spec into the backend that answers ``SCORE``.

A scorer is a factory, looked up by name::

    factory(spec: TeacherSpec, *, exact_max_vocab: int, max_batch_tokens: int,
            options: dict[str, Any]) -> Backend

where ``Backend`` is :class:`miniverl.teacher_server.backend.Backend` (``info``,
``tokenizer_fp``, ``vocab_size``, ``score_batch``, ``park``, ``wake``, ``memory``,
``stats``, ``close``). The built-in ``causal_lm`` loads the spec's model (plus its PEFT
adapter) and scores with :mod:`~miniverl.teacher_server.scoring`. Other scorers come
from installed packages through the ``miniverl.scorers`` entry-point group::

    [project.entry-points."miniverl.scorers"]
    sharpen = "miniverl_sharpen:make_scorer"

``examples/custom_teacher/`` is one (a causal LM whose distribution is sharpened by
a temperature). A scorer should change ``info["name"]`` so runs record which scorer
produced their targets. Select one with ``--scorer NAME`` (and ``--scorer-option
KEY=VALUE``) or the recipe's ``teacher.scorer`` / ``teacher.scorer_options``.

:func:`make_loader` turns a spec and a scorer name into the loader the server calls at
start (``None``) and on ``RELOAD`` (the request's model, revision and adapter with the
same device, dtype and offline setting). This module finds factories and builds that
loader; it does not score anything itself, and importing it does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

from miniverl.common.errors import ConfigError
from miniverl.common.runtime import apply_cpu_threads
from miniverl.teacher_server.backend import Loader, served_adapters
from miniverl.teacher_server.loader import TeacherSpec, load_teacher
from miniverl.teacher_server.prefix_cache import PREFIX_CACHE_TOKENS, PrefixCache
from miniverl.teacher_server.torch_backend import TorchTeacher

ENTRY_POINT_GROUP = "miniverl.scorers"
DEFAULT_SCORER = "causal_lm"

ScorerFactory = Callable[..., Any]


def causal_lm(
    spec: Any, *, exact_max_vocab: int, max_batch_tokens: int, options: dict[str, Any]
) -> Any:
    """The default scorer: the spec's causal LM (+ merged adapter), frozen."""
    if options:
        raise ConfigError(
            f"scorer {DEFAULT_SCORER!r} takes no options (got {sorted(options)}); drop "
            "--scorer-option / teacher.scorer_options"
        )
    return TorchTeacher(
        load_teacher(spec), exact_max_vocab=exact_max_vocab, max_batch_tokens=max_batch_tokens
    )


def _entry_points() -> list[Any]:
    return list(metadata.entry_points(group=ENTRY_POINT_GROUP))


def list_scorers() -> list[str]:
    """The built-in scorer and every installed ``miniverl.scorers`` entry point."""
    return sorted({DEFAULT_SCORER, *(ep.name for ep in _entry_points())})


def get_scorer(name: str) -> ScorerFactory:
    """The factory registered as ``name``; :class:`ConfigError` names the installed ones."""
    if name == DEFAULT_SCORER:
        return causal_lm
    matches = [ep for ep in _entry_points() if ep.name == name]
    if not matches:
        raise ConfigError(
            f"unknown scorer {name!r}; installed: {', '.join(list_scorers())}. Install the "
            f"package that provides it (an entry point in group {ENTRY_POINT_GROUP!r})"
        )
    try:
        factory = matches[0].load()
    except Exception as exc:
        raise ConfigError(
            f"scorer {name!r} ({matches[0].value}) failed to import: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not callable(factory):
        raise ConfigError(f"scorer {name!r} ({matches[0].value}) is not callable")
    return factory


def make_loader(
    spec: TeacherSpec | Callable[[], TeacherSpec],
    *,
    exact_max_vocab: int = 262144,
    max_batch_tokens: int = 8192,
    threads: int | None = None,
    scorer: str = DEFAULT_SCORER,
    scorer_options: dict[str, Any] | None = None,
    prefix_cache_tokens: int = PREFIX_CACHE_TOKENS,
) -> Loader:
    """The loader a :class:`~miniverl.teacher_server.server.TeacherServer` calls (worker thread).

    ``spec`` may be a callable, resolved on the worker thread at the first load: a
    recipe's toy teacher is then built after the socket is bound, not before.
    ``threads`` is applied on the worker thread (where every forward pass runs) at
    the first load, so importing torch never delays the bind. ``scorer`` names the
    factory that builds the backend (the default is the causal LM itself),
    ``scorer_options`` its keyword options. ``prefix_cache_tokens`` sizes the built-in
    backend's prefix cache (``teacher_server/prefix_cache.py``).
    """
    factory = get_scorer(scorer)  # an unknown scorer fails before the bind

    def load(request: dict[str, Any] | None) -> TorchTeacher:
        nonlocal spec
        if request is None and threads is not None:
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
        if chosen.adapters and set(served_adapters(backend)) != set(chosen.adapters):
            # A backend that does not say which it serves would score every request with
            # whatever it holds, under each adapter's name.
            backend.close()
            raise ConfigError(
                f"scorer {scorer!r} does not serve the named adapters "
                f"{', '.join(chosen.adapters)} (its backend lists "
                f"{', '.join(served_adapters(backend)) or 'none'}); drop --adapters, or use "
                f"the {DEFAULT_SCORER} scorer")
        return backend

    return load


def parse_options(pairs: list[str] | None) -> dict[str, Any]:
    """``["tau=0.5", "name=x"]`` -> ``{"tau": 0.5, "name": "x"}`` (numbers and booleans parsed)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--scorer-option {pair!r} is not KEY=VALUE; e.g. tau=0.5")
        out[key.strip()] = _value(raw.strip())
    return out


def _value(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw
