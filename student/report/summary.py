"""The run's summary as rows and formatted numbers, shared by the HTML page and the markdown.

Both renderers show the same summary table and token provenance; they take them from
here so the two never disagree. This module formats; it reads no file.
"""

from __future__ import annotations

from typing import Any

from miniverl.common.trajectory import MODEL_SPANS, SpanType
from miniverl.student.report.data import ReportData


def fmt_success(row: dict | None) -> str:
    if not row:
        return "n/a"
    return f"{float(row['success']):.1%} (v{row.get('version', '?')}, n={row.get('n', '?')})"


def fmt_by_environment(row: dict | None) -> str | None:
    """A mixture's eval row as each environment's success (None for one environment)."""
    envs = (row or {}).get("by_environment")
    if not isinstance(envs, dict) or not envs:
        return None
    return ", ".join(f"{name} {float(e['success']):.1%} (n={e.get('n', '?')}, weight "
                     f"{float(e.get('weight', 0)):g})" for name, e in envs.items())


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def last_by_teacher(metrics: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each route's counters in the last metrics row that has them (several teachers,
    docs/several-teachers.md); empty for a run with one teacher."""
    for row in reversed(metrics):
        if isinstance(row.get("by_teacher"), dict):
            return row["by_teacher"]
    return {}


def fmt_by_teacher(by_teacher: dict[str, dict[str, Any]]) -> list[str]:
    """One line per route: what it scored, how long the student waited, what it dropped,
    and the episodes held back while its teacher was down (when there were any)."""
    return [f"{name}: {int(c.get('positions_scored', 0)):,} positions of "
            f"{int(c.get('episodes', 0))} episodes, {float(c.get('wait_s', 0.0)):.1f} s "
            f"waiting, {int(c.get('stale_dropped', 0))} stale dropped"
            + (f", {int(c['held_back'])} episodes held back (teacher down)"
               if c.get("held_back") else "")
            for name, c in by_teacher.items()]


def summary_rows(data: ReportData) -> list[tuple[str, str]]:
    """The summary as (label, value) pairs, shared by the HTML and markdown output."""
    before, after = data.success_before_after()
    first, last = data.versions
    status = data.status.get("status", "unknown")
    if data.status.get("reason"):
        status += f" ({data.status['reason']})"
    by_environment = fmt_by_environment(after)
    return [
        ("run", data.run_id),
        ("status", str(status)),
        ("mode", data.mode),
        ("on-policy", data.on_policy),
        (
            "parameter versions",
            f"{first if first is not None else '?'} → {last if last is not None else '?'}",
        ),
        ("optimizer steps", str(data.steps)),
        ("wall clock", fmt_seconds(data.wall_clock_s())),
        ("success before → after", f"{fmt_success(before)} → {fmt_success(after)}"),
        *([("success by environment", by_environment)] if by_environment else []),
        ("teachers", "; ".join(data.teacher_identities()) or "none recorded"),
        *([("by teacher", "; ".join(fmt_by_teacher(last_by_teacher(data.metrics))))]
          if last_by_teacher(data.metrics) else []),
        ("stale replies dropped", str(data.stale_dropped())),
        ("trajectories", str(data.n_trajectories)),
    ]


def provenance_rows(data: ReportData) -> list[tuple[str, str, int, float]]:
    total = sum(data.tokens_by_span.values()) or 1
    return [
        (
            span.value,
            "in loss" if span in MODEL_SPANS else "context",
            data.tokens_by_span.get(span.value, 0),
            data.tokens_by_span.get(span.value, 0) / total,
        )
        for span in SpanType
    ]
