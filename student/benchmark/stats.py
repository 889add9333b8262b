"""Benchmark statistics: per-arm means, percentile bootstrap intervals, paired differences.

Each arm is compared with the baseline arm by a paired bootstrap over seeds (numpy,
seeded): the interval of the mean per-seed difference. :func:`summary_markdown` is
the summary table that ``miniverl benchmark`` prints and writes to ``summary.md``.

This module computes over :class:`~miniverl.student.benchmark.results.BenchmarkResults`;
it runs and reads nothing.
"""

from __future__ import annotations

import json
import math

import numpy as np

from miniverl.student.benchmark.config import BenchmarkConfig, Metric
from miniverl.student.benchmark.results import ArmSummary, BenchmarkResults, CellResult


def bootstrap_mean_interval(
    values: list[float], samples: int, confidence: float, seed: int
) -> tuple[float, float, float]:
    """Mean of ``values`` and a percentile bootstrap interval of that mean."""
    arr = np.asarray(values, dtype=np.float64)
    mean = float(arr.mean())
    if len(arr) < 2:
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, len(arr), size=(samples, len(arr)))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return mean, float(lo), float(hi)


def metric_value(result: CellResult, metric: Metric) -> float | None:
    """The cell's value of ``metric``; None for a failed cell or a missing/non-finite value."""
    if result.status != "ok":
        return None
    if metric == "success_gain":
        if result.success_after is None or result.success_before is None:
            return None
        return result.success_after - result.success_before
    value = getattr(result, metric)
    return None if value is None or not math.isfinite(value) else float(value)


def summarize(results: BenchmarkResults, config: BenchmarkConfig) -> list[ArmSummary]:
    """Per-arm mean, bootstrap interval, and paired difference to the baseline arm."""
    boot = config.bootstrap
    by_arm: dict[str, dict[int, float]] = {a.name: {} for a in config.arms}
    failed: dict[str, int] = {a.name: 0 for a in config.arms}
    walls: dict[str, list[float]] = {a.name: [] for a in config.arms}
    updates: dict[str, list[float]] = {a.name: [] for a in config.arms}
    for cell in results.cells:
        if cell.arm not in by_arm:
            continue
        value = metric_value(cell.result, config.metric)
        if value is None:
            failed[cell.arm] += cell.result.status != "ok"
            continue
        by_arm[cell.arm][cell.seed] = value
        if cell.result.wall_s is not None:
            walls[cell.arm].append(cell.result.wall_s)
        if cell.result.updates is not None:
            updates[cell.arm].append(float(cell.result.updates))
    base = by_arm[config.baseline]
    out = []
    for arm in config.arms:
        values = by_arm[arm.name]
        mean = std = lo = hi = d_mean = d_lo = d_hi = None
        if values:
            mean, lo, hi = bootstrap_mean_interval(
                list(values.values()), boot.samples, boot.confidence, boot.seed
            )
            std = float(np.std(list(values.values()), ddof=1)) if len(values) > 1 else 0.0
        paired = sorted(set(values) & set(base))
        if paired and arm.name != config.baseline:
            diffs = [values[s] - base[s] for s in paired]
            d_mean, d_lo, d_hi = bootstrap_mean_interval(
                diffs, boot.samples, boot.confidence, boot.seed
            )
        out.append(
            ArmSummary(
                arm=arm.name,
                n_ok=len(values),
                n_failed=failed[arm.name],
                mean=mean,
                std=std,
                mean_low=lo,
                mean_high=hi,
                diff_vs_baseline=d_mean,
                diff_low=d_lo,
                diff_high=d_hi,
                n_pairs=len(paired) if arm.name != config.baseline else 0,
                mean_wall_s=float(np.mean(walls[arm.name])) if walls[arm.name] else None,
                mean_updates=float(np.mean(updates[arm.name])) if updates[arm.name] else None,
            )
        )
    return out


def summary_markdown(results: BenchmarkResults) -> str:
    """The per-arm summary as a markdown table (``summary.md``)."""

    def f(v: float | None, digits: int = 3) -> str:
        return "n/a" if v is None else f"{v:.{digits}f}"

    conf = results.config.get("bootstrap", {}).get("confidence", 0.95)
    lines = [
        f"# Benchmark {results.name}",
        "",
        f"Metric: `{results.metric}`; baseline arm: `{results.baseline}`; "
        f"budget: {json.dumps(results.config.get('budget'))}; "
        f"{'complete' if results.complete else 'incomplete'}.",
        "",
        f"| arm | ok | failed | mean | {conf:.0%} interval | Δ vs baseline | paired {conf:.0%} interval | mean wall s | mean updates |",
        "| --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: |",
    ]
    for s in results.summary:
        lines.append(
            f"| {s.arm} | {s.n_ok} | {s.n_failed} | {f(s.mean)} | [{f(s.mean_low)}, {f(s.mean_high)}] | "
            f"{f(s.diff_vs_baseline)} | [{f(s.diff_low)}, {f(s.diff_high)}] | {f(s.mean_wall_s, 1)} | "
            f"{f(s.mean_updates, 1)} |"
        )
    return "\n".join(lines) + "\n"
