"""The two gates a distillation benchmark checks before its first cell: plateau and margin.

On-policy distillation's published setting is a student trained to the plateau of the
data its user has, and a teacher clearly above that plateau (docs/distillbench.md,
version 3). Both are figures of the preparations, so both are checked once, before any
cell runs, and a benchmark outside either stops with one line naming the figure, the
rule and the fix (as ``student_prepare_band`` does):

- :func:`plateau_gate`: the student's last two validation evaluations (T=1 success, made
  while it trained on the user's data with a decaying rate) differ by at most
  ``tolerance``: more of the same training would not move it.
- :func:`margin_gate`: the teacher's T=1 validation success is at least ``margin``
  above the plateau (the student's last evaluation): there is a gap to close.

:func:`validation_curve` reads the evaluations a run recorded (its ``eval`` events).
This module trains nothing and reads no model; it judges figures already measured.
"""

from __future__ import annotations

from typing import Any

from miniverl.common.errors import ConfigError


def validation_curve(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ``eval`` event of a run as ``{"update", "greedy", "t1", "split", "n"}``, by
    update (a version evaluated twice keeps its last)."""
    by_update: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.get("event") == "eval":
            by_update[int(event["version"])] = {
                "update": int(event["version"]), "greedy": event.get("success"),
                "t1": (event.get("sampled") or {}).get("success"),
                "split": event.get("split"), "n": event.get("n")}
    return [by_update[u] for u in sorted(by_update)]


def plateau_gate(curve: list[dict[str, Any]], tolerance: float, what: str) -> float:
    """The plateau (the last evaluation's T=1 success) when the last two evaluations are
    within ``tolerance``; ConfigError (one line) otherwise. ``what`` names the training
    in the message (its recipe)."""
    scored = [p for p in curve if p.get("t1") is not None]
    if len(scored) < 2:
        raise ConfigError(
            f"{what} has {len(scored)} T=1 validation evaluation(s); the plateau rule needs "
            "the last two: give its train.eval_every a value that divides train.cycles and "
            "its eval section samples: N")
    before, last = scored[-2], scored[-1]
    step = abs(last["t1"] - before["t1"])
    if step > tolerance + 1e-12:
        raise ConfigError(
            f"{what} is not at a plateau: T=1 validation success {before['t1']:.3f} at update "
            f"{before['update']} and {last['t1']:.3f} at {last['update']} differ by "
            f"{step:.3f} > {tolerance:g}; train it longer (train.cycles) with a decaying "
            "rate in a new commit, before any result")
    return float(last["t1"])


def margin_gate(teacher_t1: float | None, plateau: float, margin: float, what: str) -> float:
    """The teacher's margin over the plateau (T=1 validation success) when it is at least
    ``margin``; ConfigError (one line) otherwise. ``what`` names the teacher."""
    if teacher_t1 is None:
        raise ConfigError(
            f"{what} has no T=1 validation success; give its preparation's eval section "
            "samples: N so the margin over the student's plateau can be measured")
    gap = teacher_t1 - plateau
    if gap < margin - 1e-12:
        raise ConfigError(
            f"{what}'s T=1 validation success {teacher_t1:.3f} is {gap:+.3f} over the student's "
            f"plateau {plateau:.3f}, below the required margin {margin:g}; give the student "
            "less data (fewer prompts) or a stronger teacher in a new commit, before any result")
    return float(gap)
