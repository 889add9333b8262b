"""Fixtures of the integration tests that several modules share."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from miniverl.common.tokenizer_id import fingerprint_tokenizer
from tests.common.cross_tokenizer_kit import byte_fallback_tokenizer
from tests.toy_kit import TEACHER, bare_qwen3


@pytest.fixture
def other_teacher(tmp_path):
    """The endpoint of a real server around a teacher with the byte-fallback tokenizer."""
    from miniverl.teacher_server.loader import LoadedTeacher
    from miniverl.teacher_server.server import TeacherServer
    from miniverl.teacher_server.server_state import ServerConfig
    from miniverl.teacher_server.torch_backend import TorchTeacher

    tok = byte_fallback_tokenizer()
    torch.manual_seed(1)
    model = bare_qwen3(TEACHER, vocab=len(tok), max_positions=2048).eval()
    loaded = LoadedTeacher(model, None, fingerprint_tokenizer(tok), len(tok),
                           {"name": "byte-fallback-teacher", "model": "byte-fallback-teacher"},
                           "cpu", "float32", extra={"tokenizer": tok})
    backend = TorchTeacher(loaded, exact_max_vocab=1 << 20, max_batch_tokens=8192)
    server = TeacherServer(ServerConfig(endpoint=f"ipc://{tmp_path}/teacher.sock"),
                           lambda request: backend)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while server.endpoint is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.endpoint is not None
    yield server.endpoint, fingerprint_tokenizer(tok)
    server.shutdown_threadsafe("abort")
    thread.join(10)
