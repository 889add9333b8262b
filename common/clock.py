"""Wall-clock timestamps for records that people read (manifests, events, indexes).

One place decides the format: UTC, ISO 8601. Durations are measured with
``time.perf_counter`` / ``time.monotonic`` where they happen, never from these strings.
"""

from __future__ import annotations

from datetime import datetime, timezone


def utc_now(timespec: str = "seconds") -> str:
    """UTC now as ISO 8601 with ``+00:00``, e.g. ``2026-01-31T12:00:00+00:00``."""
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


def utc_now_ms() -> str:
    """UTC now with milliseconds and a ``Z`` suffix, e.g. ``2026-01-31T12:00:00.123Z``."""
    return utc_now("milliseconds").replace("+00:00", "Z")
