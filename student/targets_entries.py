"""What one targets-cache entry is: the cache's identity, an entry's key, the arrays it
must hold and the sha256 that covers them.

:class:`CacheIdentity` is what a cache's targets were made for (tokenizer, vocabulary,
kind, k, objective, temperature); :class:`EntryKey` says which trajectory, scored for
which student version, by which teacher process. :func:`entry_sha256` hashes names,
dtypes, shapes and little-endian bytes, so the same arrays hash the same everywhere.
:func:`scored_entries` turns a run's scored trajectories into entries: every target a
run trains on is recorded, so its report can show exactly what it trained on.

This module is torch-free and reads or writes no files (``targets_cache.py`` does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from miniverl.common.errors import ProvenanceError

KINDS = ("topk", "exact")


@dataclass(frozen=True)
class CacheIdentity:
    """What a cache's targets were made for; all of it must match to reuse them."""

    tokenizer_fp: str
    vocab_size: int
    kind: str
    k: int
    objective: str
    temperature: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CacheIdentity:
        return cls(
            tokenizer_fp=str(data["tokenizer_fp"]),
            vocab_size=int(data["vocab_size"]),
            kind=str(data["kind"]),
            k=int(data["k"]),
            objective=str(data["objective"]),
            temperature=float(data["temperature"]),
        )


@dataclass(frozen=True, order=True)
class EntryKey:
    """Which trajectory, scored for which student version, by which teacher process."""

    trajectory_id: str
    student_version: int
    teacher: str
    instance: str
    gen: int

    def token(self) -> str:
        # JSON, not a joined string: trajectory ids may contain any separator.
        return json.dumps(
            [self.trajectory_id, self.student_version, self.teacher, self.instance, self.gen]
        )


def teacher_key(teacher: dict[str, Any], mode: str = "standard") -> str:
    """The teacher part of an entry's key: its name, plus its adapter and its mode
    (``teacher.mode``) when those change what it answers."""
    # Targets depend on the adapter and on what the teacher was shown, not only on
    # its name: a privileged view of the same trajectory is another entry.
    key = str(teacher.get("name"))
    if teacher.get("adapter_sha256"):
        key += f"+adapter:{teacher['adapter_sha256']}"
    if mode != "standard":
        key += f"+{mode}"
    return key


def scored_entries(scored: Iterable[Any]) -> Iterator[tuple[EntryKey, dict[str, np.ndarray]]]:
    """``(key, arrays)`` of every scored trajectory that has positions (a
    ``student.train.teacher.link.Scored``: its trajectory, the version the targets were
    scored for, the teacher's identity and what it was shown (``mode``: its route's, in
    a run of several teachers), the reply's arrays and its positions)."""
    for s in scored:
        if len(s.positions_P):
            key = EntryKey(trajectory_id=s.traj.id, student_version=s.student_version,
                           teacher=teacher_key(s.teacher, s.mode),
                           instance=str(s.teacher.get("instance")),
                           gen=int(s.teacher.get("gen", 0)))
            yield key, {**s.arrays, "positions": s.positions_P.astype(np.int32)}


def entry_sha256(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over names, dtypes, shapes and little-endian bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        arr = canonical(arrays[name])
        digest.update(f"{name}\0{arr.dtype.str}\0{list(arr.shape)}\0".encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def canonical(arr: np.ndarray) -> np.ndarray:
    """``arr`` as a little-endian C-contiguous array (what is stored and hashed)."""
    arr = np.asarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr)


def check_entry_arrays(ident: CacheIdentity, key: EntryKey, arrays: dict[str, np.ndarray]) -> None:
    """Raise ProvenanceError unless ``arrays`` are targets of the kind ``ident`` holds."""
    last_dim = ident.k if ident.kind == "topk" else ident.vocab_size
    wanted = (
        {"ids": 2, "logprobs": 2, "tail_logmass": 1, "target_logprobs": 1}
        if ident.kind == "topk"
        else {"logprobs": 2, "target_logprobs": 1}
    )
    rows = None
    for name, ndim in wanted.items():
        if name not in arrays:
            raise ProvenanceError(
                f"entry {key.trajectory_id!r}: {ident.kind} targets need array {name!r}; "
                f"got {sorted(arrays)}"
            )
        arr = np.asarray(arrays[name])
        if arr.ndim != ndim or (ndim == 2 and arr.shape[1] != last_dim):
            expect = "[P, k]" if ident.kind == "topk" else "[P, V]"
            raise ProvenanceError(
                f"entry {key.trajectory_id!r}: array {name!r} has shape {list(arr.shape)}, "
                f"but this cache holds {ident.kind} targets with "
                f"{'k' if ident.kind == 'topk' else 'vocab_size'}={last_dim} "
                f"(shape {expect}); use a cache made for these targets"
            )
        if rows is not None and arr.shape[0] != rows:
            raise ProvenanceError(
                f"entry {key.trajectory_id!r}: arrays disagree on the number of positions "
                f"({rows} vs {arr.shape[0]} in {name!r})"
            )
        rows = arr.shape[0]


_IDENTITY_WHAT = {
    "tokenizer_fp": "tokenizer",
    "vocab_size": "vocabulary",
    "kind": "target kind (topk or exact)",
    "k": "top-k",
    "objective": "loss objective",
    "temperature": "temperature",
}


def check_identity(root: Path, stored: CacheIdentity, wanted: CacheIdentity) -> None:
    """Raise ProvenanceError naming the first field where ``stored`` and ``wanted`` differ."""
    for field in dataclasses.fields(CacheIdentity):
        have, want = getattr(stored, field.name), getattr(wanted, field.name)
        if have != want:
            raise ProvenanceError(
                f"targets cache {root}: {field.name} is {have!r} in the cache but {want!r} now; "
                f"its targets were made for another {_IDENTITY_WHAT[field.name]}. Point "
                f"cache.dir at a new directory or delete {root}"
            )
