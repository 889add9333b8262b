"""Targets cache: round trips, integrity, identity, staleness, pruning, atomic publish."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from miniverl.common.errors import ProvenanceError, StaleTargetError
from miniverl.student import targets_cache as tc
from miniverl.student.targets_cache import TargetsCache
from miniverl.student.targets_entries import CacheIdentity, EntryKey

IDENT = CacheIdentity(
    tokenizer_fp="sha256:abc",
    vocab_size=64,
    kind="topk",
    k=4,
    objective="bucketed_topk_tail",
    temperature=1.0,
)


def _arrays(p=5, k=4, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "ids": rng.integers(0, 64, (p, k)).astype(np.int32),
        "logprobs": rng.normal(size=(p, k)).astype(np.float32),
        "tail_logmass": np.full(p, -np.inf, dtype=np.float32),
        "target_logprobs": rng.normal(size=p).astype(np.float32),
        "positions": np.arange(p, dtype=np.int32),
    }


def _key(tid="t0", version=0, teacher="toy", instance="i1", gen=0):
    return EntryKey(tid, version, teacher, instance, gen)


def test_round_trip_and_reopen(tmp_path):
    cache = TargetsCache(tmp_path, IDENT)
    a, b = _arrays(seed=1), _arrays(p=3, seed=2)
    cache.put_many([(_key("t0"), a), (_key("t1"), b)])
    cache.put(_key("t0", version=1), _arrays(seed=3))
    reopened = TargetsCache(tmp_path, IDENT)
    assert len(reopened) == 3 and _key("t1") in reopened
    for name, arr in reopened.get(_key("t0")).items():
        np.testing.assert_array_equal(arr, a[name])
        assert arr.dtype == a[name].dtype
    assert reopened.validate() == []
    stats = reopened.stats()
    assert stats["entries"] == 3 and stats["shards"] == 2 and stats["versions"] == [0, 1]
    assert stats["teachers"] == [{"name": "toy", "instance": "i1", "gen": 0, "entries": 3}]
    assert stats["bytes"] == sum(p.stat().st_size for p in (tmp_path / "shards").iterdir())
    # Opening without an identity (inspection) works and reports the stored one.
    assert TargetsCache(tmp_path).identity == IDENT


def test_flipped_byte_is_detected(tmp_path):
    # A single corrupted byte must never be trained on: validate names it, get refuses it.
    cache = TargetsCache(tmp_path, IDENT)
    cache.put(_key(), _arrays())
    shard = next((tmp_path / "shards").iterdir())
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    problems = TargetsCache(tmp_path).validate()
    assert any("sha256 differs" in p and "shard" in p for p in problems)
    assert any(p.startswith("entry ") for p in problems)
    with pytest.raises(ProvenanceError, match="sha256"):
        TargetsCache(tmp_path).get(_key())


def test_missing_shard_and_orphans_are_reported(tmp_path):
    cache = TargetsCache(tmp_path, IDENT)
    cache.put(_key(), _arrays())
    (tmp_path / "shards" / "stray.safetensors.tmp").write_bytes(b"x")
    next(p for p in (tmp_path / "shards").iterdir() if p.name.startswith("shard-")).unlink()
    problems = TargetsCache(tmp_path).validate()
    assert any("missing on disk" in p for p in problems)
    assert any("not in the index" in p for p in problems)


@pytest.mark.parametrize(
    "field,value",
    [
        ("tokenizer_fp", "sha256:other"),
        ("vocab_size", 65),
        ("kind", "exact"),
        ("k", 8),
        ("objective", "exact_full_vocab"),
        ("temperature", 0.7),
    ],
)
def test_identity_drift_is_rejected(tmp_path, field, value):
    TargetsCache(tmp_path, IDENT).put(_key(), _arrays())
    drifted = CacheIdentity(**{**IDENT.to_json(), field: value})
    with pytest.raises(ProvenanceError, match=rf"{field} is .* in the cache but .*cache.dir"):
        TargetsCache(tmp_path, drifted)


def test_arrays_that_do_not_fit_the_identity_are_refused(tmp_path):
    cache = TargetsCache(tmp_path, IDENT)
    with pytest.raises(ProvenanceError, match="k=4"):
        cache.put(_key(), _arrays(k=8))
    bad = _arrays()
    del bad["tail_logmass"]
    with pytest.raises(ProvenanceError, match="tail_logmass"):
        cache.put(_key(), bad)
    assert len(TargetsCache(tmp_path)) == 0


def test_strict_reader_gets_stale_target_error(tmp_path):
    # Strict OPD: asking for version 3 must never silently return version 2's targets.
    cache = TargetsCache(tmp_path, IDENT)
    cache.put(_key("t0", version=2), _arrays())
    assert cache.lookup("never-scored", student_version=3) is None
    with pytest.raises(StaleTargetError, match="v2"):
        cache.lookup("t0", student_version=3)
    key, arrays = cache.lookup("t0", student_version=2)
    assert key.student_version == 2 and "ids" in arrays
    # Replay within max_lag and offline reuse accept older versions explicitly.
    assert cache.lookup("t0", student_version=3, max_lag=1)[0].student_version == 2
    assert cache.lookup("t0")[0].student_version == 2
    # Another teacher generation is stale too.
    with pytest.raises(StaleTargetError, match="gen 1"):
        cache.lookup("t0", student_version=2, teacher=("toy", "i1", 1))


def test_prune_by_versions_and_bytes(tmp_path):
    cache = TargetsCache(tmp_path, IDENT)
    for version in range(4):
        cache.put_many([(_key(f"t{i}", version=version), _arrays(seed=i)) for i in range(2)])
    assert cache.stats()["shards"] == 4
    result = cache.prune(keep_last_versions=2)
    assert result == {
        "removed_entries": 4,
        "removed_shards": 2,
        "freed_bytes": result["freed_bytes"],
    }
    assert result["freed_bytes"] > 0
    reopened = TargetsCache(tmp_path, IDENT)
    assert reopened.stats()["versions"] == [2, 3]
    assert len(list((tmp_path / "shards").iterdir())) == 2
    one_shard = reopened.stats()["bytes"] // 2
    reopened.prune(max_bytes=one_shard)
    assert TargetsCache(tmp_path).stats()["versions"] == [3]
    assert TargetsCache(tmp_path).validate() == []


def test_replacing_an_entry_frees_its_old_shard(tmp_path):
    cache = TargetsCache(tmp_path, IDENT)
    cache.put(_key(), _arrays(seed=1))
    cache.put(_key(), _arrays(seed=2))
    assert len(cache) == 1 and cache.stats()["shards"] == 1
    np.testing.assert_array_equal(cache.get(_key())["ids"], _arrays(seed=2)["ids"])
    assert cache.validate() == []


@pytest.mark.parametrize("fail_at", ["shard", "index"])
def test_crash_mid_write_leaves_the_previous_index_valid(tmp_path, monkeypatch, fail_at):
    cache = TargetsCache(tmp_path, IDENT)
    cache.put(_key("t0"), _arrays())
    before = (tmp_path / "index.json").read_text()

    real_json, real_bytes = tc.atomic_write_json, tc.atomic_write_bytes

    def boom(*args, **kwargs):
        raise OSError("disk full")

    if fail_at == "shard":
        monkeypatch.setattr(tc, "atomic_write_bytes", boom)
    else:
        monkeypatch.setattr(tc, "atomic_write_json", boom)
    with pytest.raises(OSError, match="disk full"):
        cache.put(_key("t1"), _arrays())
    monkeypatch.setattr(tc, "atomic_write_json", real_json)
    monkeypatch.setattr(tc, "atomic_write_bytes", real_bytes)

    assert (tmp_path / "index.json").read_text() == before
    reopened = TargetsCache(tmp_path, IDENT)
    assert reopened.keys() == [_key("t0")] and reopened.validate() == []
    # The writer's in-memory view is the published one, and it keeps working.
    assert cache.keys() == [_key("t0")]
    cache.put(_key("t1"), _arrays())
    assert TargetsCache(tmp_path).validate() == []


def test_bad_or_missing_index(tmp_path):
    with pytest.raises(ProvenanceError, match="no targets cache"):
        TargetsCache(tmp_path / "nothing")
    TargetsCache(tmp_path, IDENT)
    index = json.loads((tmp_path / "index.json").read_text())
    index["format"] = "other/9"
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ProvenanceError, match="other/9"):
        TargetsCache(tmp_path)


@pytest.mark.slow
def test_module_is_torch_free():
    # `miniverl cache` must work on the core install, without torch.
    code = (
        "import sys; import miniverl.student.targets_cache; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
