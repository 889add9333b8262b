"""`miniverl cache stats|validate|prune`: what a user sees, and the exit codes scripts rely on."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from miniverl.cli.app import app, main
from miniverl.student.targets_cache import TargetsCache
from miniverl.student.targets_entries import CacheIdentity, EntryKey

IDENT = CacheIdentity("sha256:abc", 64, "topk", 2, "bucketed_topk_tail", 1.0)
runner = CliRunner()


def _arrays(p=3):
    return {
        "ids": np.arange(p * 2, dtype=np.int32).reshape(p, 2),
        "logprobs": np.full((p, 2), -1.0, dtype=np.float32),
        "tail_logmass": np.full(p, -2.0, dtype=np.float32),
        "target_logprobs": np.full(p, -0.5, dtype=np.float32),
    }


@pytest.fixture
def cache_dir(tmp_path):
    root = tmp_path / "run" / "targets"
    cache = TargetsCache(root, IDENT)
    cache.put(EntryKey("t0", 0, "toy", "inst", 0), _arrays())
    cache.put(EntryKey("t1", 1, "toy", "inst", 1), _arrays(4))
    return root


def test_stats_human_and_json(cache_dir):
    result = runner.invoke(app, ["cache", "stats", str(cache_dir)])
    assert result.exit_code == 0, result.output
    assert "entries        2 (2 trajectories, 7 positions)" in result.output
    assert "versions       0..1 (2)" in result.output
    result = runner.invoke(app, ["cache", "stats", str(cache_dir), "--json"])
    info = json.loads(result.output)
    assert info["entries"] == 2 and info["shards"] == 2 and info["versions"] == [0, 1]
    assert [t["gen"] for t in info["teachers"]] == [0, 1]


def test_a_run_directory_is_accepted(cache_dir):
    result = runner.invoke(app, ["cache", "stats", str(cache_dir.parent), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["entries"] == 2


def test_validate_ok_then_exit_1_with_one_line_per_problem(cache_dir):
    result = runner.invoke(app, ["cache", "validate", str(cache_dir)])
    assert result.exit_code == 0 and result.output.startswith("ok: 2 entries in 2 shards")
    shard = sorted((cache_dir / "shards").iterdir())[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    result = runner.invoke(app, ["cache", "validate", str(cache_dir)])
    assert result.exit_code == 1
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2  # the shard hash and the entry hash
    assert all("sha256 differs" in line for line in lines)


def test_prune_from_the_command_line(cache_dir):
    result = runner.invoke(app, ["cache", "prune", str(cache_dir), "--keep-last-versions", "1"])
    assert result.exit_code == 0 and "removed 1 entries and 1 shards" in result.output
    assert TargetsCache(cache_dir).stats()["versions"] == [1]


def test_missing_cache_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["miniverl", "cache", "validate", str(tmp_path / "nope")])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no targets cache at")
