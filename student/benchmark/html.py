"""Render benchmark results as one offline HTML page (same look as the run report).

Charts: the primary metric per arm (mean, bootstrap interval, one dot per seed), the
paired difference to the baseline arm, wall clock per arm and mean loss curves. A
summary table and a table of every cell follow. No script and nothing that leaves
the page; every string from the results file is HTML-escaped.

This module only formats :class:`~miniverl.student.benchmark.results.BenchmarkResults`.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from miniverl.student.benchmark.results import BenchmarkResults
from miniverl.student.benchmark.stats import metric_value
from miniverl.student.report import svg
from miniverl.student.report.html import CSS


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _f(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def render_benchmark_html(results: BenchmarkResults) -> str:
    """The whole benchmark page as one string."""
    per_seed: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    curves: dict[str, list[list[float]]] = {}
    for cell in results.cells:
        value = metric_value(cell.result, results.metric)
        if value is not None:
            per_seed.setdefault(cell.arm, []).append(value)
        if cell.result.status == "ok" and cell.result.wall_s is not None:
            walls.setdefault(cell.arm, []).append(cell.result.wall_s)
        if cell.result.loss_curve:
            curves.setdefault(cell.arm, []).append(cell.result.loss_curve)
    metric_rows = [
        (s.arm, s.mean, s.mean_low, s.mean_high, per_seed.get(s.arm, []))
        for s in results.summary
        if s.mean is not None
    ]
    diff_rows = [
        (s.arm, s.diff_vs_baseline, s.diff_low, s.diff_high, [])
        for s in results.summary
        if s.diff_vs_baseline is not None
    ]
    wall_rows = [(arm, sum(v) / len(v), min(v), max(v), v) for arm, v in walls.items() if v]
    loss_series = []
    for arm, runs in curves.items():
        length = min(len(r) for r in runs)
        mean_curve = [sum(r[i] for r in runs) / len(runs) for i in range(length)]
        loss_series.append((arm, [(float(i), v) for i, v in enumerate(mean_curve)]))
    charts = "".join(
        [
            svg.interval_chart(
                metric_rows, title=f"{results.metric} per arm", value_label=results.metric
            ),
            svg.interval_chart(
                diff_rows,
                title=f"Paired difference vs baseline '{results.baseline}'",
                value_label=f"Δ {results.metric}",
            ),
            svg.interval_chart(
                wall_rows, title="Wall clock per cell (range over seeds)", value_label="seconds"
            ),
            svg.line_chart(
                loss_series,
                title="Mean training loss per arm",
                x_label="optimizer step",
                y_label="loss",
                width=520,
                empty_reason="no loss curves recorded",
            ),
        ]
    )
    head = [
        "arm",
        "ok",
        "failed",
        "mean",
        "interval",
        "Δ vs baseline",
        "paired interval",
        "wall s",
        "updates",
    ]
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{_e(c)}</td>"
            for c in (
                s.arm,
                s.n_ok,
                s.n_failed,
                _f(s.mean),
                f"[{_f(s.mean_low)}, {_f(s.mean_high)}]",
                _f(s.diff_vs_baseline),
                f"[{_f(s.diff_low)}, {_f(s.diff_high)}]",
                _f(s.mean_wall_s, 1),
                _f(s.mean_updates, 1),
            )
        )
        + "</tr>"
        for s in results.summary
    )
    cell_rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{_e(c)}</td>"
            for c in (
                c.arm,
                c.seed,
                c.result.status,
                _f(c.result.success_before),
                _f(c.result.success_after),
                _f(c.result.final_loss),
                c.result.updates,
                _f(c.result.wall_s, 1),
                "" if c.budget_matched is None else ("yes" if c.budget_matched else "NO"),
                c.result.error or "",
            )
        )
        + "</tr>"
        for c in results.cells
    )
    cell_head = [
        "arm",
        "seed",
        "status",
        "success before",
        "success after",
        "final loss",
        "updates",
        "wall s",
        "budget matched",
        "error",
    ]
    state = "complete" if results.complete else "incomplete (resume with --resume)"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>miniverl benchmark: {_e(results.name)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>miniverl benchmark: {_e(results.name)}</h1>"
        f'<p class="note">metric {_e(results.metric)}, baseline {_e(results.baseline)}, '
        f"budget {_e(json.dumps(results.config.get('budget')))}, {_e(state)}, updated {_e(results.updated_at)}</p>"
        f'<h2>Comparison</h2><div class="charts">{charts}</div>'
        "<h2>Summary</h2><table><thead><tr>"
        + "".join(f"<th>{_e(h)}</th>" for h in head)
        + f"</tr></thead><tbody>{rows}</tbody></table>"
        "<h2>Cells</h2><table><thead><tr>"
        + "".join(f"<th>{_e(h)}</th>" for h in cell_head)
        + f"</tr></thead><tbody>{cell_rows}</tbody></table>"
        f"<h2>Config</h2><pre>{_e(json.dumps(results.config, indent=2))}</pre>"
        "</main></body></html>\n"
    )
