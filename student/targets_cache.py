"""On-disk cache of teacher targets: safetensors shards plus one JSON index.

Layout of a cache directory::

    index.json                       identity, shards (sha256, bytes), entries
    shards/shard-000001.safetensors  the arrays of one or more entries

An entry is the teacher's answer for one trajectory, keyed by
``(trajectory id, student version, teacher name, teacher instance, gen)``; its
arrays are the ``SCORE_OK`` arrays (``ids``, ``logprobs``, ``tail_logmass``,
``target_logprobs`` for top-k; ``logprobs``, ``target_logprobs`` for exact) plus
whatever the caller adds (e.g. ``positions``). Every entry and every shard
carries a sha256.

Guarantees:

* **Atomic publish.** A shard is written to a temporary file, fsynced and renamed;
  the index is rewritten the same way *after* its shards exist, so a reader (or a
  crash at any point) sees the previous index or the new one, never one that
  points at missing data. Pruning rewrites the index first and deletes files after.
* **Identity.** A cache records the tokenizer fingerprint, vocabulary size, target
  kind, k, loss objective and temperature it was made for; opening it with another
  identity raises :class:`ProvenanceError` naming the field.
* **Staleness.** :meth:`TargetsCache.lookup` with a student version and
  ``max_lag=0`` (strict on-policy) raises :class:`StaleTargetError` instead of
  returning another version's targets.

One writer at a time (the run lock guarantees it); any number of readers. This
module is torch-free (numpy + safetensors.numpy + json) so ``miniverl cache``
works on the core install. It does not score anything or decide what to cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy
from safetensors import safe_open

from miniverl.common.atomic import atomic_write_bytes, atomic_write_json
from miniverl.common.clock import utc_now
from miniverl.common.errors import ProvenanceError, StaleTargetError
from miniverl.common.hashing import sha256_file
from miniverl.protocol.pending import within_lag
from miniverl.student.targets_entries import (
    KINDS,
    CacheIdentity,
    EntryKey,
    canonical,
    check_entry_arrays,
    check_identity,
    entry_sha256,
)

FORMAT = "miniverl-targets/1"
INDEX_NAME = "index.json"
SHARD_DIR = "shards"


def _fsync_dir(path: Path) -> None:
    # The rename itself must reach the disk before the index that refers to it.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


class TargetsCache:
    """A directory of cached teacher targets; see the module docstring.

    ``TargetsCache(root, identity)`` opens or creates a cache for ``identity``
    (a mismatch with the stored one raises :class:`ProvenanceError`);
    ``TargetsCache(root)`` opens an existing cache with whatever identity it has
    (for inspection: ``stats``, ``validate``, reads).
    """

    def __init__(self, root: str | Path, identity: CacheIdentity | None = None):
        self.root = Path(root)
        self.index_path = self.root / INDEX_NAME
        self.shard_dir = self.root / SHARD_DIR
        if self.index_path.exists():
            self._index = self._read_index()
            stored = CacheIdentity.from_json(self._index["identity"])
            if identity is not None:
                check_identity(self.root, stored, identity)
            self.identity = stored
        elif identity is None:
            raise ProvenanceError(
                f"no targets cache at {self.root} ({INDEX_NAME} is missing); pass a cache "
                f"directory such as <run>/targets"
            )
        else:
            if identity.kind not in KINDS:
                raise ProvenanceError(f"cache kind {identity.kind!r} is not one of {KINDS}")
            self.identity = identity
            self._index = {
                "format": FORMAT,
                "identity": identity.to_json(),
                "created": utc_now(timespec="seconds"),
                "next_shard": 1,
                "shards": {},
                "entries": [],
            }
            self.shard_dir.mkdir(parents=True, exist_ok=True)
            self._publish()
        self._entries = {self._key_of(e): e for e in self._index["entries"]}

    # -- index I/O -----------------------------------------------------------------------

    def _read_index(self) -> dict[str, Any]:
        try:
            index = json.loads(self.index_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ProvenanceError(
                f"{self.index_path}: unreadable targets index ({exc}); delete the cache "
                f"directory to rescore"
            ) from exc
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            found = index.get("format") if isinstance(index, dict) else None
            raise ProvenanceError(
                f"{self.index_path}: format {found!r} is not {FORMAT!r}; this cache was "
                f"written by another tool or version, use a fresh cache directory"
            )
        for field in ("identity", "shards", "entries"):
            if field not in index:
                raise ProvenanceError(f"{self.index_path}: missing {field!r}; the index is damaged")
        return index

    def _publish(self) -> None:
        self._index["updated"] = utc_now(timespec="seconds")
        # One line: json's C encoder only runs without indent. The index is rewritten on
        # every put and grows with the run (4,096 entries, 3.3 MB after a 256-update OPD
        # run); indented, its pure-Python encoding took 0.26 s a put by the end
        # (benchmarks/targets_cache_growth.py).
        atomic_write_json(self.index_path, self._index, indent=None)
        _fsync_dir(self.root)

    @staticmethod
    def _key_of(entry: dict[str, Any]) -> EntryKey:
        return EntryKey(
            trajectory_id=entry["trajectory_id"],
            student_version=int(entry["student_version"]),
            teacher=entry["teacher"],
            instance=entry["instance"],
            gen=int(entry["gen"]),
        )

    def reload(self) -> None:
        """Re-read the index (another process may have published since)."""
        self._index = self._read_index()
        self._entries = {self._key_of(e): e for e in self._index["entries"]}

    # -- writing ----------------------------------------------------------------------------

    def put(self, key: EntryKey, arrays: dict[str, np.ndarray]) -> None:
        """Store one entry (its own shard); see :meth:`put_many`."""
        self.put_many([(key, arrays)])

    def put_many(self, items: Iterable[tuple[EntryKey, dict[str, np.ndarray]]]) -> str | None:
        """Store entries in one new shard and publish them; returns the shard name.

        An entry with an existing key replaces the old one. Nothing is visible to
        readers until the index is rewritten, which happens last.
        """
        items = list(items)
        if not items:
            return None
        tensors: dict[str, np.ndarray] = {}
        records: list[dict[str, Any]] = []
        seen: set[EntryKey] = set()
        for i, (key, arrays) in enumerate(items):
            if key in seen:
                raise ProvenanceError(f"entry {key.token()} appears twice in one write")
            seen.add(key)
            check_entry_arrays(self.identity, key, arrays)
            canon = {name: canonical(arr) for name, arr in arrays.items()}
            prefix = f"e{i}"
            for name, arr in canon.items():
                tensors[f"{prefix}/{name}"] = arr
            records.append(
                {
                    **dataclasses.asdict(key),
                    "prefix": prefix,
                    "positions": int(next(iter(canon.values())).shape[0]),
                    "arrays": {n: [a.dtype.str, list(a.shape)] for n, a in canon.items()},
                    "sha256": entry_sha256(canon),
                    "bytes": int(sum(a.nbytes for a in canon.values())),
                    "created": utc_now(timespec="seconds"),
                }
            )
        number = int(self._index["next_shard"])
        shard_name = f"shard-{number:06d}.safetensors"
        shard_path = self.shard_dir / shard_name
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        data = safetensors.numpy.save(tensors, metadata={"format": FORMAT})
        # What a put changes, to restore on failure: the index's top-level fields (its
        # shard and entry records are replaced, never edited in place).
        old_index = {**self._index, "shards": dict(self._index["shards"]),
                     "entries": list(self._index["entries"])}
        try:
            atomic_write_bytes(shard_path, data)
            _fsync_dir(self.shard_dir)
            for record in records:
                record["shard"] = shard_name
                self._entries[self._key_of(record)] = record
            self._index["shards"][shard_name] = {
                "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data),
                "created": utc_now(timespec="seconds"),
            }
            self._index["next_shard"] = number + 1
            self._index["entries"] = list(self._entries.values())
            self._drop_unreferenced_shards_from_index()
            self._publish()
        except BaseException:
            # The previous index is still the published one: restore the in-memory view
            # and remove the shard nobody will ever reference.
            self._index = old_index
            self._entries = {self._key_of(e): e for e in self._index["entries"]}
            shard_path.unlink(missing_ok=True)
            raise
        self._delete_orphan_files()
        return shard_name

    def _drop_unreferenced_shards_from_index(self) -> None:
        used = {e["shard"] for e in self._entries.values()}
        for name in list(self._index["shards"]):
            if name not in used:
                del self._index["shards"][name]

    def _delete_orphan_files(self) -> None:
        # Runs only after a successful publish: the index no longer names these files.
        if not self.shard_dir.is_dir():
            return
        for path in self.shard_dir.iterdir():
            if path.suffix == ".safetensors" and path.name not in self._index["shards"]:
                path.unlink(missing_ok=True)

    # -- reading ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> list[EntryKey]:
        return sorted(self._entries)

    def get(self, key: EntryKey, *, verify: bool = True) -> dict[str, np.ndarray]:
        """The arrays of one entry; ``KeyError`` if absent, ProvenanceError if corrupted."""
        record = self._entries[key]
        path = self.shard_dir / record["shard"]
        try:
            with safe_open(str(path), framework="numpy") as fh:
                arrays = {
                    name: fh.get_tensor(f"{record['prefix']}/{name}") for name in record["arrays"]
                }
        except Exception as exc:  # safetensors raises several types for a damaged file
            raise ProvenanceError(
                f"{path}: cannot read entry {key.token()} ({exc}); run `miniverl cache "
                f"validate {self.root}` and delete the cache to rescore"
            ) from exc
        if verify and entry_sha256(arrays) != record["sha256"]:
            raise ProvenanceError(
                f"{path}: entry {key.token()} does not match its sha256; the shard was "
                f"modified or corrupted, run `miniverl cache validate {self.root}` and delete "
                f"the cache to rescore"
            )
        return arrays

    def lookup(
        self,
        trajectory_id: str,
        *,
        student_version: int | None = None,
        max_lag: int | None = 0,
        teacher: tuple[str, str, int] | None = None,
    ) -> tuple[EntryKey, dict[str, np.ndarray]] | None:
        """The newest usable entry for a trajectory, or ``None`` if it was never scored.

        ``student_version=None`` accepts any version (offline KD reuses targets
        across versions). Otherwise an entry must satisfy
        ``student_version - max_lag <= version <= student_version`` (``max_lag=0`` is
        strict on-policy; ``None`` means unbounded). ``teacher=(name, instance, gen)``
        also requires that teacher. When entries exist but none qualifies this raises
        :class:`StaleTargetError` rather than returning ``None``, so a strict reader
        can never mistake stale targets for a miss it might silently fill.
        """
        candidates = [k for k in self._entries if k.trajectory_id == trajectory_id]
        if not candidates:
            return None
        usable = candidates
        if teacher is not None:
            usable = [k for k in usable if (k.teacher, k.instance, k.gen) == tuple(teacher)]
        if student_version is not None:
            # The protocol's staleness rule (docs/protocol.md, "Staleness rule"), applied
            # to stored targets.
            lag = 10**18 if max_lag is None else max_lag
            usable = [k for k in usable if within_lag(student_version, k.student_version, lag)]
        if not usable:
            have = sorted({(k.student_version, k.teacher, k.gen) for k in candidates})
            described = ", ".join(f"v{v} from {t} gen {g}" for v, t, g in have)
            raise StaleTargetError(
                f"targets for trajectory {trajectory_id!r} exist only as {described}; asked "
                f"for student version {student_version} (max lag {max_lag})"
                + (f" from teacher {teacher[0]} gen {teacher[2]}" if teacher else "")
                + "; stale targets are never trained on, score the trajectory again"
            )
        key = max(usable, key=lambda k: (k.student_version, k.gen, k.instance))
        return key, self.get(key)

    # -- maintenance ----------------------------------------------------------------------

    def prune(
        self, *, keep_last_versions: int | None = None, max_bytes: int | None = None
    ) -> dict[str, int]:
        """Drop old targets; returns ``{removed_entries, removed_shards, freed_bytes}``.

        ``keep_last_versions=N`` keeps the entries of the N highest student versions;
        ``max_bytes`` then drops whole shards, oldest first, until the shards fit.
        The index is published before any file is deleted.
        """
        before_entries = len(self._entries)
        before_shards = dict(self._index["shards"])
        if keep_last_versions is not None:
            if keep_last_versions < 0:
                raise ValueError(f"keep_last_versions={keep_last_versions} must be >= 0")
            versions = sorted({k.student_version for k in self._entries}, reverse=True)
            keep = set(versions[:keep_last_versions])
            self._entries = {k: e for k, e in self._entries.items() if k.student_version in keep}
            self._index["entries"] = list(self._entries.values())
            self._drop_unreferenced_shards_from_index()
        if max_bytes is not None:
            shards = self._index["shards"]
            # Shard numbers grow with every write, so name order is age order.
            for name in sorted(shards):
                if sum(s["bytes"] for s in shards.values()) <= max_bytes:
                    break
                self._entries = {k: e for k, e in self._entries.items() if e["shard"] != name}
                del shards[name]
            self._index["entries"] = list(self._entries.values())
        removed = [n for n in before_shards if n not in self._index["shards"]]
        if removed or len(self._entries) != before_entries:
            self._publish()
            self._delete_orphan_files()
        return {
            "removed_entries": before_entries - len(self._entries),
            "removed_shards": len(removed),
            "freed_bytes": int(sum(before_shards[n]["bytes"] for n in removed)),
        }

    def stats(self) -> dict[str, Any]:
        """Counts for humans and scripts (``miniverl cache stats``)."""
        teachers: dict[tuple[str, str, int], int] = {}
        for k in self._entries:
            teachers[(k.teacher, k.instance, k.gen)] = (
                teachers.get((k.teacher, k.instance, k.gen), 0) + 1
            )
        return {
            "path": str(self.root),
            "format": FORMAT,
            "identity": self.identity.to_json(),
            "entries": len(self._entries),
            "trajectories": len({k.trajectory_id for k in self._entries}),
            "positions": int(sum(e.get("positions", 0) for e in self._entries.values())),
            "shards": len(self._index["shards"]),
            "bytes": int(sum(s["bytes"] for s in self._index["shards"].values())),
            "versions": sorted({k.student_version for k in self._entries}),
            "teachers": [
                {"name": name, "instance": inst, "gen": gen, "entries": n}
                for (name, inst, gen), n in sorted(teachers.items())
            ],
        }

    def validate(self) -> list[str]:
        """Recompute every hash and cross-check index and shards; one line per problem."""
        problems: list[str] = []
        shards = self._index["shards"]
        readable: dict[str, Any] = {}
        for name, info in sorted(shards.items()):
            path = self.shard_dir / name
            if not path.is_file():
                problems.append(f"shard {name}: listed in the index but missing on disk")
                continue
            size = path.stat().st_size
            if size != info.get("bytes"):
                problems.append(
                    f"shard {name}: {size} bytes on disk, index says {info.get('bytes')}"
                )
            if sha256_file(path) != info.get("sha256"):
                problems.append(
                    f"shard {name}: sha256 differs from the index (modified or corrupted)"
                )
            try:
                readable[name] = safetensors.numpy.load_file(str(path))
            except Exception as exc:  # a damaged header raises several types
                problems.append(f"shard {name}: not a readable safetensors file ({exc})")
        for key in self.keys():
            record = self._entries[key]
            where = f"entry {key.token()}"
            shard = record.get("shard")
            if shard not in shards:
                problems.append(f"{where}: shard {shard!r} is not in the index")
                continue
            tensors = readable.get(shard)
            if tensors is None:
                continue
            arrays = {}
            for name, (dtype, shape) in record["arrays"].items():
                arr = tensors.get(f"{record['prefix']}/{name}")
                if arr is None:
                    problems.append(f"{where}: array {name!r} missing from shard {shard}")
                elif arr.dtype.str != dtype or list(arr.shape) != shape:
                    problems.append(
                        f"{where}: array {name!r} is {arr.dtype.str}{list(arr.shape)}, "
                        f"index says {dtype}{shape}"
                    )
                else:
                    arrays[name] = arr
            if len(arrays) != len(record["arrays"]):
                continue
            if entry_sha256(arrays) != record["sha256"]:
                problems.append(f"{where}: sha256 differs from the index (modified or corrupted)")
            try:
                check_entry_arrays(self.identity, key, arrays)
            except ProvenanceError as exc:
                problems.append(f"{where}: {exc}")
        if self.shard_dir.is_dir():
            for path in sorted(self.shard_dir.iterdir()):
                if path.name not in shards:
                    problems.append(
                        f"{SHARD_DIR}/{path.name}: not in the index (left by an interrupted "
                        f"write or prune); safe to delete"
                    )
        return problems
