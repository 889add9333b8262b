"""The built-in backend serves xvocab from its model directory's tokenizer
(teacher_server/torch_backend.py, teacher_server/xvocab.py)."""

from __future__ import annotations

import pytest

from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.teacher_server.loader import LoadedTeacher
from miniverl.teacher_server.torch_backend import TorchTeacher
from miniverl.teacher_server.xvocab import serves_xvocab
from tests.toy_kit import STUDENT, toy_dir


def _backend(model_dir):
    loaded = LoadedTeacher(object(), model_dir, "sha256:" + "0" * 64, 263,
                           {"name": "toy", "model": "toy"}, "cpu", "float32")
    return TorchTeacher(loaded, exact_max_vocab=1 << 20, max_batch_tokens=1024)


@pytest.mark.slow  # imports transformers' tokenizers: over tests/tiers.py's SLOW_S alone
def test_the_model_directory_tokenizer_is_loaded_on_first_use():
    backend = _backend(toy_dir(STUDENT))
    assert serves_xvocab(backend)
    assert fingerprint_tokenizer(backend.tokenizer).startswith("sha256:")
    assert backend.tokenizer is backend.tokenizer  # loaded once


def test_a_backend_without_a_directory_serves_no_xvocab():
    assert not serves_xvocab(_backend(None))
