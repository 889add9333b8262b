"""Shared by the ``TeacherClient`` tests: one small batch and a client on the fake teacher.

``run(body, teacher)`` opens an async ``TeacherClient`` (fast heartbeats and timeouts)
on ``miniverl.testing``'s in-memory ``FakeTeacher``, runs ``await body(client,
teacher)`` and fails after 10 s. Not a test module: pytest collects nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import numpy as np

from miniverl.protocol.client import TeacherClient
from miniverl.testing import FAKE_TOKENIZER_FP, FAKE_VOCAB, FakeTeacher, Step

FP, VOCAB = FAKE_TOKENIZER_FP, FAKE_VOCAB

# Two sequences (5 and 4 tokens); positions 0-2 of the first, 0-1 of the second.
TOKENS = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9], np.int32)
CU = np.array([0, 5, 9], np.int32)
POS = np.array([0, 1, 2, 5, 6], np.int32)


def make_client(teacher: FakeTeacher, **kw) -> TeacherClient:
    opts = dict(
        tokenizer_fp=FP,
        vocab_size=VOCAB,
        heartbeat_ms=20,
        request_timeout_s=0.15,
        unavailable_timeout_s=1.5,
        transport_factory=teacher.transport_factory,
    )
    opts.update(kw)
    return TeacherClient("tcp://127.0.0.1:5555", **opts)


def run(test, teacher: FakeTeacher | None = None, *, script: Sequence[Step] = (), **kw):
    """``await test(client, teacher)`` on a fresh or given teacher, ``script`` queued first;
    ``kw`` overrides the client's settings. Returns the teacher."""
    teacher = teacher or FakeTeacher()
    teacher.script(*script)

    async def main():
        with anyio.fail_after(10):
            async with make_client(teacher, **kw) as client:
                await test(client, teacher)

    anyio.run(main, backend="asyncio")
    return teacher
