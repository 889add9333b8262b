"""``miniverl.testing``: test ``mvl-score/1`` clients and teachers without sockets.

- :class:`FakeTeacher` — a scriptable in-memory teacher: scripted replies, delays,
  errors, lost and held requests, restarts, reloads, stale and duplicate replies
  (the steps in :mod:`miniverl.testing.script`);
- :class:`FakeTeacherClient` — an in-process ``ScoringClient`` over a torch model (no
  wire), for testing a trainer: real targets, the client's staleness rule, counters;
- :class:`MemoryTransport`, :class:`MemoryNetwork` — the in-memory connections a
  client's ``transport_factory`` opens;
- :class:`TeacherHarness` — any ``Backend``, loader or scorer behind the real teacher
  server's admission, batcher and lifecycle, over in-memory connections;
- :class:`FakeBackend`, :func:`next_token_targets` — known, finite targets without a model;
- :class:`HostileEngine` — a loopback vLLM- or SGLang-shaped server with one scripted
  misbehaviour (:data:`HOSTILE_BEHAVIOURS`), for testing an engine-teacher client;
- pytest fixtures (``fake_teacher``, ``fake_teacher_client``, ``teacher_harness``),
  registered by the ``miniverl`` pytest plugin (:mod:`miniverl.testing.plugin`).

``docs/testing.md`` shows each with an example; ``examples/testing/`` is a user's test
suite written against this package only. Nothing else in miniverl imports it. Beside
the kit, :mod:`miniverl.testing.toy_recipe` holds the few-second toy recipe (a dict)
that miniverl's own tests and benchmarks build their runs from; it is not documented
there.

The names load on first use (PEP 562): pytest imports this package for its plugin in
every session of every project that installs miniverl, and the kit itself (the client,
the server, pydantic models) takes about a second to import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from miniverl.protocol.messages import ErrorCode
    from miniverl.teacher_server.backend import BackendError, ScoreJob
    from miniverl.testing.backends import (
        FAKE_TOKENIZER_FP,
        FAKE_VOCAB,
        FakeBackend,
        next_token_targets,
    )
    from miniverl.testing.fake_teacher import FAST_SETTINGS, FakeTeacher, FakeTeacherClient
    from miniverl.testing.harness import TeacherHarness
    from miniverl.testing.hostile_engine import HOSTILE_BEHAVIOURS, HostileEngine
    from miniverl.testing.memory import MemoryNetwork, MemoryTransport
    from miniverl.testing.router import RawConnection
    from miniverl.testing.script import (
        Received,
        Step,
        answer,
        drop,
        duplicate,
        error,
        hold,
        reload,
        restart,
        stale,
        wrong_id,
    )

_HOME: dict[str, str] = {
    "ErrorCode": "miniverl.protocol.messages",
    "BackendError": "miniverl.teacher_server.backend",
    "ScoreJob": "miniverl.teacher_server.backend",
    "FAKE_TOKENIZER_FP": "miniverl.testing.backends",
    "FAKE_VOCAB": "miniverl.testing.backends",
    "FakeBackend": "miniverl.testing.backends",
    "next_token_targets": "miniverl.testing.backends",
    "FAST_SETTINGS": "miniverl.testing.fake_teacher",
    "FakeTeacher": "miniverl.testing.fake_teacher",
    "FakeTeacherClient": "miniverl.testing.fake_teacher",
    "TeacherHarness": "miniverl.testing.harness",
    "HOSTILE_BEHAVIOURS": "miniverl.testing.hostile_engine",
    "HostileEngine": "miniverl.testing.hostile_engine",
    "MemoryNetwork": "miniverl.testing.memory",
    "MemoryTransport": "miniverl.testing.memory",
    "RawConnection": "miniverl.testing.router",
    "Received": "miniverl.testing.script",
    "Step": "miniverl.testing.script",
    "answer": "miniverl.testing.script",
    "drop": "miniverl.testing.script",
    "duplicate": "miniverl.testing.script",
    "error": "miniverl.testing.script",
    "hold": "miniverl.testing.script",
    "reload": "miniverl.testing.script",
    "restart": "miniverl.testing.script",
    "stale": "miniverl.testing.script",
    "wrong_id": "miniverl.testing.script",
}
__all__ = [
    "BackendError",
    "ErrorCode",
    "FAKE_TOKENIZER_FP",
    "FAKE_VOCAB",
    "FAST_SETTINGS",
    "FakeBackend",
    "FakeTeacher",
    "FakeTeacherClient",
    "HOSTILE_BEHAVIOURS",
    "HostileEngine",
    "MemoryNetwork",
    "MemoryTransport",
    "RawConnection",
    "Received",
    "ScoreJob",
    "Step",
    "TeacherHarness",
    "answer",
    "drop",
    "duplicate",
    "error",
    "hold",
    "next_token_targets",
    "reload",
    "restart",
    "stale",
    "wrong_id",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'miniverl.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
