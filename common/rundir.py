"""The run directory: one folder per run, one lock, an atomic status file.

```
runs/<id>/  recipe.yaml  recipe.resolved.yaml  manifest.json  status.json
            events.jsonl  metrics.jsonl  trajectories.jsonl  report.html  .lock
            eval/  targets/  checkpoints/  logs/
```

Status moves ``ready -> running -> completed | failed | interrupted``; a failed or
interrupted run may go back to ``running`` when it is resumed; a completed run is
final. :meth:`RunDir.verify` checks the sealed files (manifest, trajectories). The lock
is an OS advisory lock (``fcntl.flock``) on ``.lock``, released by
the kernel if the holder dies, so a crashed run never needs manual cleanup; a
second writer fails fast with :class:`RunLockedError` naming the holder.

This module does not train, score or render anything; it only owns the layout.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .atomic import atomic_write_json, atomic_write_text
from .clock import utc_now_ms
from .errors import ConfigError, ProvenanceError, RunLockedError
from .manifest import build_manifest, read_manifest, write_manifest
from .recipe import Recipe, dump_resolved, load_recipe, recipe_digest
from .trajectory import iter_trajectories

STATUSES = ("ready", "running", "completed", "failed", "interrupted")
TRANSITIONS: dict[str, frozenset[str]] = {
    "ready": frozenset({"running", "failed", "interrupted"}),
    "running": frozenset({"completed", "failed", "interrupted"}),
    "interrupted": frozenset({"running", "failed"}),
    "failed": frozenset({"running"}),
    "completed": frozenset(),
}
SUBDIRS = ("eval", "targets", "checkpoints", "logs")


def new_run_id(name: str) -> str:
    """``<name>-<YYYYmmdd-HHMMSS>-<4 hex>``: sortable by time and unique per process."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def _append_line(path: Path, record: dict[str, Any]) -> None:
    line = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str) + "\n"
    # One write() on an O_APPEND descriptor: concurrent appenders never interleave
    # inside a line of this size.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


class _RunLock:
    """Context manager returned by :meth:`RunDir.lock` (already acquired)."""

    def __init__(self, run: RunDir):
        self.run = run

    def __enter__(self) -> RunDir:
        return self.run

    def __exit__(self, *exc: object) -> None:
        self.run.release()


class RunDir:
    """Handle on ``runs/<id>/``; create with :meth:`create`, reopen with :meth:`open`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.id = self.path.name
        self._lock_fd: int | None = None
        # Called as observer(kind, record) after each line is written, kind "event" or
        # "metric": experiment trackers mirror the run from here (student/trackers.py).
        self.observers: list[Callable[[str, dict[str, Any]], None]] = []

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- layout ------------------------------------------------------------------------

    recipe_path = property(lambda self: self.path / "recipe.yaml")
    resolved_recipe_path = property(lambda self: self.path / "recipe.resolved.yaml")
    manifest_path = property(lambda self: self.path / "manifest.json")
    status_path = property(lambda self: self.path / "status.json")
    events_path = property(lambda self: self.path / "events.jsonl")
    metrics_path = property(lambda self: self.path / "metrics.jsonl")
    trajectories_path = property(lambda self: self.path / "trajectories.jsonl")
    report_path = property(lambda self: self.path / "report.html")
    lock_path = property(lambda self: self.path / ".lock")
    eval_dir = property(lambda self: self.path / "eval")
    targets_dir = property(lambda self: self.path / "targets")
    checkpoints_dir = property(lambda self: self.path / "checkpoints")
    logs_dir = property(lambda self: self.path / "logs")

    # -- creation ----------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        output_dir: str | Path,
        recipe: Recipe,
        recipe_text: str | None = None,
        run_id: str | None = None,
    ) -> RunDir:
        """Make a fresh run directory with the recipe, resolved recipe, manifest and status."""
        run_id = run_id or new_run_id(recipe.run.name)
        path = Path(output_dir) / run_id
        try:
            path.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise ConfigError(
                f"run directory {path} already exists; pick another run id or resume it"
            ) from None
        run = cls(path)
        for sub in SUBDIRS:
            (path / sub).mkdir()
        resolved = dump_resolved(recipe)
        atomic_write_text(run.recipe_path, recipe_text if recipe_text is not None else resolved)
        atomic_write_text(run.resolved_recipe_path, resolved)
        write_manifest(run, build_manifest(recipe, run_id))
        atomic_write_json(
            run.status_path, {"status": "ready", "updated_at": utc_now_ms(), "reason": None}
        )
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """Reopen an existing run directory (for status, resume, report)."""
        run = cls(path)
        if not run.status_path.is_file():
            raise ConfigError(
                f"{run.path} is not a miniverl run directory (no status.json); "
                "pass a folder under runs/"
            )
        return run

    def recipe(self) -> Recipe:
        """The resolved recipe this run was created with."""
        return load_recipe(self.resolved_recipe_path)

    def record_filled(self, recipe: Recipe, filled: dict[str, Any]) -> None:
        """Record the recipe that runs once the memory plan has filled in what the
        submitted one left null (``filled``: ``{"train.micro_batch_tokens": 16384}``):
        ``recipe.resolved.yaml`` and the manifest's ``recipe_digest`` become its, and the
        manifest's ``memory_plan.filled`` names the fields (:meth:`filled`); ``recipe.yaml``
        stays as it was submitted."""
        atomic_write_text(self.resolved_recipe_path, dump_resolved(recipe))
        write_manifest(self, None, recipe_digest=recipe_digest(recipe),
                       memory_plan={"filled": filled})

    def filled(self) -> dict[str, Any]:
        """The fields the memory plan filled in for this run (:meth:`record_filled`); {}
        when it filled none."""
        return dict((read_manifest(self).get("memory_plan") or {}).get("filled") or {})

    def verify(self) -> None:
        """Check the run's sealed files (``manifest.json``, every line of
        ``trajectories.jsonl``) against their digests; the first mismatch raises
        :class:`ProvenanceError` naming the file and line. Resume and ``eval`` call it
        before they read anything else; absent files are not an error here."""
        if self.manifest_path.is_file():
            read_manifest(self)
        if self.trajectories_path.is_file():
            for _ in iter_trajectories(self.trajectories_path):
                pass

    # -- lock --------------------------------------------------------------------------

    def holder(self) -> dict[str, Any] | None:
        """Who wrote the lock file last (pid, host, since); None when unknown."""
        try:
            text = self.lock_path.read_text(encoding="utf-8").strip()
            return json.loads(text) if text else None
        except (OSError, ValueError):
            return None

    def lock(self) -> _RunLock:
        """Take the run's exclusive lock now; use as ``with run.lock(): ...``."""
        if self._lock_fd is not None:
            return _RunLock(self)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.holder() or {}
            who = (
                f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}"
                if holder
                else "another process"
            )
            raise RunLockedError(
                f"run {self.id} is locked by {who}; stop it first (miniverl stop "
                f"{self.path}) or wait for it to finish"
            ) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": utc_now_ms()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
        self._lock_fd = fd
        return _RunLock(self)

    def release(self) -> None:
        """Drop the lock (no-op when not held)."""
        if self._lock_fd is None:
            return
        fd, self._lock_fd = self._lock_fd, None
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @property
    def locked_by_me(self) -> bool:
        return self._lock_fd is not None

    # -- status ------------------------------------------------------------------------

    def read_status(self) -> dict[str, Any]:
        try:
            status = json.loads(self.status_path.read_bytes())
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError: a corrupted file
            raise ProvenanceError(
                f"{self.status_path}: not valid JSON ({str(exc).splitlines()[0][:120]}); the "
                "run status is corrupted, restore it from a copy or rerun"
            ) from None
        if not isinstance(status, dict) or not isinstance(status.get("status"), str):
            raise ProvenanceError(
                f"{self.status_path}: not a run status (a JSON object with 'status'); the "
                "file is corrupted, restore it from a copy or rerun"
            )
        return status

    @property
    def status(self) -> str:
        return self.read_status()["status"]

    def set_status(self, status: str, reason: str | None = None) -> dict[str, Any]:
        """Move to ``status`` atomically; an illegal transition raises ConfigError."""
        if status not in STATUSES:
            raise ConfigError(f"unknown run status {status!r}; one of {', '.join(STATUSES)}")
        current = self.status
        if status not in TRANSITIONS[current]:
            allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing (final)"
            raise ConfigError(
                f"run {self.id} cannot go from {current!r} to {status!r}; from {current!r} it "
                f"may go to {allowed}"
            )
        record = {"status": status, "updated_at": utc_now_ms(), "reason": reason}
        atomic_write_json(self.status_path, record)
        return record

    # -- logs --------------------------------------------------------------------------

    def event(self, name: str, **fields: Any) -> dict[str, Any]:
        """Append ``{"ts", "event": name, **fields}`` to events.jsonl."""
        record = {"ts": utc_now_ms(), "event": name, **fields}
        _append_line(self.events_path, record)
        self._notify("event", record)
        return record

    def metric(self, row: dict[str, Any]) -> dict[str, Any]:
        """Append a metrics row (with ``ts``) to metrics.jsonl."""
        record = {"ts": utc_now_ms(), **row}
        _append_line(self.metrics_path, record)
        self._notify("metric", record)
        return record

    def _notify(self, kind: str, record: dict[str, Any]) -> None:
        for observer in list(self.observers):
            observer(kind, record)

    def read_jsonl(self, name: str) -> list[dict[str, Any]]:
        """Rows of ``events.jsonl`` / ``metrics.jsonl``; a torn last line is skipped."""
        path = self.path / name
        if not path.is_file():
            return []
        rows = []
        # Split on "\n" only: str.splitlines also splits at U+2028, U+0085 and the like,
        # which json.dumps(ensure_ascii=False) leaves raw inside strings.
        for line in path.read_text(encoding="utf-8").split("\n"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return rows

    def events(self) -> list[dict[str, Any]]:
        return self.read_jsonl("events.jsonl")

    def metrics(self) -> list[dict[str, Any]]:
        return self.read_jsonl("metrics.jsonl")
