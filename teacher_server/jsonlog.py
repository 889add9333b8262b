"""JSON-lines log of the teacher process: one JSON object per line.

Each line is ``{"ts": ISO-8601 UTC, "level": ..., "event": ..., <fields>}``, written to
``--log FILE`` (appended) or to stderr, flushed per line so a supervisor tailing the
file sees events as they happen. Thread-safe (the compute thread logs too). This
module does not rotate files or filter by anything but level.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from miniverl.common.clock import utc_now
from miniverl.common.errors import ConfigError

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
RESERVED = ("ts", "level", "event")


class JsonLog:
    """A callable ``log(level, event, **fields)`` writing JSON lines."""

    def __init__(self, path: str | Path | None = None, level: str = "info"):
        if level not in LEVELS:
            raise ConfigError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
        self.threshold = LEVELS[level]
        self._lock = threading.Lock()
        self._owned = path is not None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._stream: TextIO = open(path, "a", encoding="utf-8") if path else sys.stderr  # noqa: SIM115

    def __call__(self, level: str, event: str, /, **fields: Any) -> None:
        if LEVELS.get(level, 20) < self.threshold:
            return
        record: dict[str, Any] = {
            "ts": utc_now(timespec="milliseconds"),
            "level": level,
            "event": event,
        }
        for key, value in fields.items():
            # A field named like a reserved key must not overwrite it.
            record[f"field_{key}" if key in RESERVED else key] = value
        line = json.dumps(record, default=str, separators=(",", ":"))
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()

    def close(self) -> None:
        with self._lock:
            if self._owned and not self._stream.closed:
                self._stream.close()
