"""Digests of files and trees; the per-process CPU thread setting."""

from __future__ import annotations

import hashlib
import os

import pytest

from miniverl.common.errors import ConfigError
from miniverl.common.hashing import file_digests, prefixed, sha256_bytes, sha256_dir, sha256_file
from miniverl.common.runtime import apply_cpu_threads


def test_file_and_bytes_digests_agree(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 3_000_000)  # spans several read chunks
    assert (
        sha256_file(path)
        == sha256_bytes(b"x" * 3_000_000)
        == hashlib.sha256(b"x" * 3_000_000).hexdigest()
    )
    assert prefixed("ab") == "sha256:ab" and prefixed("sha256:ab") == "sha256:ab"


def test_dir_digest_sees_content_and_names_not_location(tmp_path):
    a = tmp_path / "a"
    (a / "sub").mkdir(parents=True)
    (a / "sub" / "w.bin").write_bytes(b"1")
    (a / "cfg.json").write_text("{}")
    before = sha256_dir(a)
    assert sha256_dir(a.rename(tmp_path / "b")) == before  # moving the folder changes nothing
    b = tmp_path / "b"
    (b / "sub" / "w.bin").rename(b / "sub" / "v.bin")
    assert sha256_dir(b) != before
    assert set(file_digests(b)) == {"cfg.json", "sub/v.bin"}


def test_apply_cpu_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert apply_cpu_threads(1) == 1
    assert os.environ["OMP_NUM_THREADS"] == "1" and os.environ["MKL_NUM_THREADS"] == "1"
    with pytest.raises(ConfigError, match="cpu_threads"):
        apply_cpu_threads(0)
