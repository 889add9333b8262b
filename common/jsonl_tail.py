"""Read the rows a process appends to a JSONL file, a few at a time or all at once.

``up`` follows the student's ``metrics.jsonl`` for its progress bar and the demo's live
board follows ``events.jsonl`` and ``metrics.jsonl`` of two runs, both while the writer
is still appending; the model card reads a finished run's events in one call. :class:`JsonlTail` remembers how far it has read, returns
only complete lines (a half-written last line waits for the next call) and skips a
line that is not JSON rather than stopping the display.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class JsonlTail:
    """``tail.read()`` returns the rows appended since the last call (``[]`` if none)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.pos = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.pos)
                chunk = fh.read()
        except OSError:  # not written yet
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.pos += end + 1
        rows = []
        for line in chunk[: end + 1].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows
