"""Several runs on one offline page: curves overlaid, summaries side by side, recipe diffs.

``build_comparison([run_a, run_b, ...], out)`` reads each run with
:func:`~miniverl.student.report.load.load_run` (so a damaged run is listed, not fatal)
and writes one self-contained HTML page (``miniverl report RUN_A RUN_B ... --out
compare.html``): each run gets a letter and a colour; the loss, divergence, held-out
success, rollout success and teacher-wait curves of all runs share one chart each; the
summary table has one column per run; and every resolved-recipe field whose value
differs between the runs is listed with each run's value.

Like the single-run page it uses inline CSS and SVG only (no script, no font, no link
that leaves the file), escapes every string that comes from a run, and is torch-free.
"""

from __future__ import annotations

import json
from collections import Counter
from html import escape
from pathlib import Path
from typing import Any

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import dotted_items
from miniverl.student.report import svg
from miniverl.student.report.build import write_page
from miniverl.student.report.data import ReportData
from miniverl.student.report.html import CSS
from miniverl.student.report.load import load_run
from miniverl.student.report.summary import summary_rows

MAX_RUNS = len(svg.PALETTE)  # one colour each; past that the curves cannot be told apart
LETTERS = "ABCDEFGH"
MISSING = "—"
CURVES = (  # (metrics.jsonl column, chart title, y label, fixed y range)
    ("loss", "Training loss", "loss", None),
    ("divergence", "Teacher–student divergence", "divergence", None),
    ("train_success", "Success of training rollouts", "success", (0.0, 1.0)),
    ("time_teacher_wait_s", "Waiting for the teacher per step", "seconds", None),
)


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def recipe_differences(runs: list[ReportData]) -> tuple[list[tuple[str, list[str]]], int]:
    """``([(field, [value per run]), ...], fields that agree)`` over the resolved recipes."""
    flats = [dotted_items(data.resolved) for data in runs]
    keys = sorted(set().union(*flats))
    missing = object()
    rows = []
    for key in keys:
        values = [flat.get(key, missing) for flat in flats]
        if any(v != values[0] for v in values):
            rows.append((key, [MISSING if v is missing else _show(v) for v in values]))
    return rows, len(keys) - len(rows)


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _series(metrics: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    pts = []
    for i, row in enumerate(metrics):
        value, x = row.get(key), row.get("step", i)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (value, x)):
            pts.append((float(x), float(value)))
    return pts


def _held_out(data: ReportData) -> tuple[str, list[tuple[float, float]]]:
    splits = Counter(str(e.get("split", "eval")) for e in data.evals)
    if not splits:
        return "eval", []
    split = splits.most_common(1)[0][0]
    pts = sorted(
        (float(e["version"]), float(e["success"])) for e in data.evals
        if str(e.get("split", "eval")) == split and isinstance(e.get("version"), int)
        and isinstance(e.get("success"), (int, float))
    )
    return split, pts


def _key(runs: list[ReportData], labels: list[str]) -> str:
    rows = "".join(
        f'<tr><td><span class="swatch" style="background:{svg.PALETTE[i]};color:#fff">'
        f"{_e(label)}</span></td><td>{_e(data.run_id)}</td><td>{_e(data.mode)}</td>"
        f"<td>{_e(data.status.get('status', 'unknown'))}</td><td>{_e(data.run_dir)}</td></tr>"
        for i, (label, data) in enumerate(zip(labels, runs, strict=True))
    )
    return ("<table><thead><tr><th>run</th><th>id</th><th>mode</th><th>status</th>"
            f"<th>directory</th></tr></thead><tbody>{rows}</tbody></table>")


def _curves(runs: list[ReportData], labels: list[str]) -> str:
    charts = []
    for key, title, y_label, y_range in CURVES:
        charts.append(svg.line_chart(
            [(label, _series(data.metrics, key)) for label, data in zip(labels, runs, strict=True)],
            title=title, width=520, x_label="optimizer step", y_label=y_label, y_range=y_range,
            empty_reason=f"no run recorded {key} in metrics.jsonl",
        ))
    held = [(label, *_held_out(data)) for label, data in zip(labels, runs, strict=True)]
    charts.insert(2, svg.line_chart(
        [(f"{label} ({split})", pts) for label, split, pts in held],
        title="Held-out success (greedy eval)", width=520, x_label="parameter version",
        y_label="success", y_range=(0.0, 1.0), empty_reason="no run recorded an evaluation",
    ))
    return f'<h2>Learning curves</h2><div class="charts">{"".join(charts)}</div>'


def _side_by_side(runs: list[ReportData], labels: list[str]) -> str:
    columns = [summary_rows(data) for data in runs]
    head = "".join(f"<th>{_e(label)}</th>" for label in labels)
    body = "".join(
        f"<tr><td>{_e(name)}</td>" + "".join(f"<td>{_e(col[i][1])}</td>" for col in columns)
        + "</tr>"
        for i, (name, _) in enumerate(columns[0])
    )
    return (f'<h2>Summaries side by side</h2><table class="kv"><thead><tr><th></th>{head}'
            f"</tr></thead><tbody>{body}</tbody></table>")


def _differences(runs: list[ReportData], labels: list[str]) -> str:
    rows, same = recipe_differences(runs)
    if not rows:
        table = '<p class="note">The resolved recipes are identical.</p>'
    else:
        head = "".join(f"<th>{_e(label)}</th>" for label in labels)
        body = "".join(
            f"<tr><td><code>{_e(key)}</code></td>"
            + "".join(f"<td>{_e(v)}</td>" for v in values) + "</tr>"
            for key, values in rows
        )
        table = f"<table><thead><tr><th>field</th>{head}</tr></thead><tbody>{body}</tbody></table>"
    return (f"<h2>Recipe differences</h2><p class=\"note\">{len(rows)} field(s) differ, "
            f"{same} agree (resolved recipes, defaults filled in).</p>{table}")


def render_comparison(runs: list[ReportData]) -> str:
    """The comparison page as one string."""
    labels = list(LETTERS[: len(runs)])
    problems = [f"{label} ({data.run_id}): {p}"
                for label, data in zip(labels, runs, strict=True) for p in data.problems]
    notice = ""
    if problems:
        items = "".join(f"<li>{_e(p)}</li>" for p in problems)
        notice = f'<div class="problems"><b>Missing or unreadable inputs</b><ul>{items}</ul></div>'
    title = " vs ".join(data.run_id for data in runs)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>miniverl comparison: {_e(title)}</title><style>{CSS}</style></head>"
        f"<body><main><h1>miniverl run comparison</h1>{_key(runs, labels)}{notice}"
        f"{_curves(runs, labels)}{_side_by_side(runs, labels)}{_differences(runs, labels)}"
        "</main></body></html>\n"
    )


def load_runs(run_dirs: list[str | Path]) -> list[ReportData]:
    """Each run parsed for the comparison; two to eight distinct runs."""
    paths = [Path(p) for p in run_dirs]
    if not 2 <= len(paths) <= MAX_RUNS:
        raise ConfigError(
            f"a comparison takes 2 to {MAX_RUNS} runs (got {len(paths)}); pass fewer runs, "
            "or one run for its own report"
        )
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:
            raise ConfigError(f"run {path} is given twice; pass each run once")
        seen.add(path.resolve())
    return [load_run(path) for path in paths]


def build_comparison(run_dirs: list[str | Path], out: str | Path) -> tuple[Path, list[ReportData]]:
    """Write the comparison page of ``run_dirs`` to ``out``; returns it and the parsed runs."""
    runs = load_runs(run_dirs)
    out_path = Path(out)
    write_page(out_path, render_comparison(runs))
    return out_path, runs
