"""What a run report shows, already parsed: :class:`ReportData` and the facts derived from it.

``ReportData`` is filled by :func:`miniverl.student.report.load.load_run`; the HTML
page (:mod:`~miniverl.student.report.html`), the markdown summary
(:mod:`~miniverl.student.report.markdown`) and the benchmark's cell reader all read
the same derived facts from here (mode, on-policy, versions, wall clock, success
before and after, teachers, time split, throughput).

This module reads no file and renders nothing; it is torch-free.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from miniverl.common.trajectory import Trajectory

TERMINAL_EVENTS = ("run_completed", "run_failed", "run_interrupted")


@dataclass
class ReportData:
    """Everything the report shows, already parsed; ``problems`` lists what was unusable."""

    run_dir: Path
    problems: list[str] = field(default_factory=list)
    # Sealed files or lines that do not match their digest (also in ``problems``):
    # `miniverl report` still writes the page but exits 1 on any.
    tampered: list[str] = field(default_factory=list)
    recipe_text: str | None = None
    resolved_text: str | None = None
    resolved: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    n_trajectories: int = 0
    tokens_by_span: Counter = field(default_factory=Counter)
    stop_reasons: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    failure_examples: dict[str, str] = field(default_factory=dict)
    successes: int = 0
    tool_calls: Counter = field(default_factory=Counter)
    by_version: Counter = field(default_factory=Counter)
    strip: list[Trajectory] = field(default_factory=list)
    token_text: dict[int, str] = field(default_factory=dict)
    token_text_note: str = ""
    targets: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    targets_note: str = ""

    # -- derived facts used by both renderers --------------------------------------

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.run_dir.name)

    @property
    def mode(self) -> str:
        for row in self.metrics:
            if row.get("mode"):
                return str(row["mode"])
        run = self.resolved.get("run") if isinstance(self.resolved.get("run"), dict) else {}
        return str(run.get("mode") or self.manifest.get("mode") or "unknown")

    @property
    def on_policy(self) -> str:
        flags = [row.get("on_policy") for row in self.metrics if "on_policy" in row]
        if flags:
            if all(flag is True for flag in flags):
                return "yes (every update trained on its own version's rollouts)"
            off = sum(1 for flag in flags if flag is not True)
            return f"no ({off} of {len(flags)} updates off-policy)"
        if self.mode == "opd":
            return "claimed by mode opd (no per-step record)"
        return "no (mode is off-policy by design)" if self.mode != "unknown" else "unknown"

    @property
    def steps(self) -> int:
        return len([row for row in self.metrics if "step" in row])

    @property
    def versions(self) -> tuple[Any, Any]:
        seen = [
            row["version"]
            for row in self.metrics + self.evals
            if isinstance(row.get("version"), int) and not isinstance(row.get("version"), bool)
        ]
        first = min(seen) if seen else self.manifest.get("start_version")
        last = max(seen) if seen else self.manifest.get("final_version")
        if isinstance(self.manifest.get("final_version"), int):
            last = self.manifest["final_version"]
        return first, last

    def wall_clock_s(self) -> float | None:
        stamps = [_parse_ts(e.get("ts")) for e in self.events]
        stamps = [s for s in stamps if s is not None]
        if len(stamps) < 2:
            stamps += [s for s in (_parse_ts(r.get("ts")) for r in self.metrics) if s]
        if len(stamps) < 2:
            return None
        return (max(stamps) - min(stamps)).total_seconds()

    def success_before_after(self) -> tuple[dict | None, dict | None]:
        if not self.evals:
            return None, None
        splits = Counter(e.get("split", "eval") for e in self.evals)
        split = splits.most_common(1)[0][0]
        rows = sorted(
            (e for e in self.evals if e.get("split", "eval") == split),
            key=lambda e: e.get("version") if isinstance(e.get("version"), int) else -1,
        )
        if any(e.get("event") == "eval_before_skipped" for e in self.events):
            return None, rows[-1]  # eval.before: false: no eval measured the start
        return rows[0], (rows[-1] if len(rows) > 1 else None)

    def teacher_identities(self) -> list[str]:
        names: list[str] = []
        for row in self.metrics:
            ident = teacher_label(row.get("teacher"))
            if ident and ident not in names:
                names.append(ident)
        for entry in self.manifest.get("teachers") or []:
            ident = teacher_label(entry) if isinstance(entry, dict) else ""
            if ident and ident not in names:
                names.append(ident)
        for event in self.events:
            for key in ("teacher", "new"):
                ident = (
                    teacher_label(event.get(key))
                    if event.get("event", "").startswith("teacher")
                    else ""
                )
                if ident and ident not in names:
                    names.append(ident)
        return names

    def teacher_events(self) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if str(e.get("event", "")).startswith("teacher")
            or e.get("event") in TERMINAL_EVENTS
            or e.get("event") == "run_started"
        ]

    def stale_dropped(self) -> int:
        return int(cumulative_total(self.metrics, "stale_dropped"))

    def time_split(self) -> dict[str, float]:
        keys = {
            "rollout": "time_rollout_s",
            "waiting for the teacher": "time_teacher_wait_s",
            "update": "time_update_s",
        }
        return {
            label: float(sum(as_number(row.get(key)) or 0.0 for row in self.metrics))
            for label, key in keys.items()
        }

    def throughput(self) -> dict[str, float | None]:
        rates = [as_number(row.get("positions_per_s")) for row in self.metrics]
        rates = [r for r in rates if r is not None]
        key = (
            "positions_scored"
            if any("positions_scored" in r for r in self.metrics)
            else "positions"
        )
        return {
            "positions_scored": float(sum(as_number(r.get(key)) or 0 for r in self.metrics)),
            "positions_per_s": sum(rates) / len(rates) if rates else None,
            "bytes_sent": cumulative_total(self.metrics, "bytes_sent"),
            "bytes_received": cumulative_total(self.metrics, "bytes_received"),
        }


def cumulative_total(rows: list[dict[str, Any]], key: str) -> float:
    """Total of a client counter logged cumulatively per step; a drop means it restarted.

    ``stale_dropped`` and the byte counters in ``metrics.jsonl`` are the teacher client's
    running totals, so summing the rows would count every step again.
    """
    total = previous = 0.0
    for row in rows:
        value = as_number(row.get(key))
        if value is None:
            continue
        total += value - previous if value >= previous else value
        previous = value
    return total


def teacher_label(ident: Any) -> str:
    """A short human label for a teacher identity (dict or string)."""
    if isinstance(ident, dict):
        name = ident.get("name") or ident.get("model") or "teacher"
        parts = [str(name)]
        if ident.get("instance"):
            parts.append(f"instance {str(ident['instance'])[:8]}")
        if ident.get("gen") is not None:
            parts.append(f"gen {ident['gen']}")
        return " · ".join(parts)
    return str(ident) if ident else ""


def as_number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (not a bool, not NaN), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value else None  # NaN is not a number to sum


def _parse_ts(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.astimezone()
