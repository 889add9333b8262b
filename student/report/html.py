"""Render a parsed run (:class:`~miniverl.student.report.data.ReportData`) as one offline HTML page.

The page is self-contained: inline CSS, inline SVG charts drawn by
:mod:`miniverl.student.report.svg`, hover text in ``title`` attributes, no script,
no font, no image and no link that leaves the file. Every string that comes from a
run file is HTML-escaped here. The benchmark page reuses :data:`CSS`.

This module only formats; reading and tolerating bad files is
:mod:`miniverl.student.report.load`'s job.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from miniverl.common.trajectory import CONTEXT_SPANS, SpanType, Trajectory
from miniverl.student.report import svg
from miniverl.student.report.data import ReportData, teacher_label
from miniverl.student.report.summary import fmt_bytes, fmt_seconds, provenance_rows, summary_rows

SPAN_COLOURS = {
    "system": "#e5e7eb",
    "user": "#dbeafe",
    "tool_result": "#ccfbf1",
    "assistant_text": "#ede9fe",
    "assistant_tool_call": "#ffedd5",
    "assistant_final": "#dcfce7",
}
CONTEXT_KEEP = 24  # tokens kept at each end of a long context span in the strip
TOKEN_FACTS = (  # (targets entry key, label) shown when a strip token is hovered
    ("target_lp", "teacher log p(token)"),
    ("student_lp", "student log p(token)"),
    ("divergence", "divergence"),
)

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#111827;background:#f9fafb}
main{max-width:1100px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e5e7eb;padding-bottom:4px}
h3{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;margin:6px 0;background:#fff} td,th{border:1px solid #e5e7eb;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f4f6;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #e5e7eb;padding:8px;overflow:auto;max-height:420px;font-size:12px}
.problems{background:#fef3c7;border:1px solid #f59e0b;padding:8px 12px;margin:12px 0}
.problems li{margin:2px 0} .note{color:#6b7280;font-size:12px}
.charts{display:flex;flex-wrap:wrap;gap:12px} svg.chart{background:#fff;border:1px solid #e5e7eb}
svg .ctitle{font-size:13px;font-weight:600;fill:#111827} svg .cnote{font-size:12px;fill:#6b7280}
svg .tick{font-size:10px;fill:#4b5563} svg .label{font-size:11px;fill:#374151} svg .legend{font-size:11px;fill:#374151}
svg .grid{stroke:#f3f4f6} svg .axis{stroke:#9ca3af}
.strip{background:#fff;border:1px solid #e5e7eb;padding:8px;font:12px/1.9 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-all}
.strip span.t{padding:1px 0;border-radius:2px} .strip span.gap{color:#6b7280;font-style:italic}
.swatch{display:inline-block;padding:0 6px;margin-right:6px;border-radius:3px;font-size:12px}
.kv td:first-child{font-weight:600;white-space:nowrap}
"""


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _table(
    headers: list[str], rows: list[list[Any]], num_cols: frozenset[int] = frozenset()
) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{_e(c)}</td>' if i in num_cols else f"<td>{_e(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _series(metrics: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    pts = []
    for i, row in enumerate(metrics):
        value = row.get(key)
        x = row.get("step", i)
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and isinstance(x, (int, float))
        ):
            pts.append((float(x), float(value)))
    return pts


# -- sections ----------------------------------------------------------------------------


def _summary(data: ReportData) -> str:
    rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in summary_rows(data))
    manifest = (
        f"<details><summary>manifest.json</summary><pre>{_e(json.dumps(data.manifest, indent=2, default=str))}</pre></details>"
        if data.manifest
        else '<p class="note">manifest.json was not available.</p>'
    )
    return f'<h2>Summary</h2><table class="kv">{rows}</table>{manifest}'


def _step_chart(data: ReportData, key: str, title: str, empty_reason: str) -> str:
    """One ``metrics.jsonl`` column over optimizer steps."""
    return svg.line_chart(
        [(key, _series(data.metrics, key))],
        title=title,
        width=350,
        x_label="optimizer step",
        y_label=key,
        empty_reason=empty_reason,
    )


def _curves(data: ReportData) -> str:
    loss = _step_chart(data, "loss", "Training loss", "no loss recorded in metrics.jsonl")
    div = _step_chart(
        data,
        "divergence",
        "Teacher–student divergence",
        "no divergence recorded (SFT runs have none)",
    )
    by_split: dict[str, list[tuple[float, float]]] = {}
    for row in data.evals:
        if isinstance(row.get("version"), int):
            by_split.setdefault(str(row.get("split", "eval")), []).append(
                (float(row["version"]), float(row["success"]))
            )
    train = _series(data.metrics, "train_success")
    series = [(f"{name} (greedy eval)", pts) for name, pts in sorted(by_split.items())]
    if train:
        series.append(("train rollouts", train))
    success = svg.line_chart(
        series,
        title="Success rate",
        width=350,
        x_label="parameter version / step",
        y_label="success",
        y_range=(0.0, 1.0),
        empty_reason="no evaluation recorded",
    )
    return f'<h2>Learning curves</h2><div class="charts">{loss}{div}{success}</div>'


def _time(data: ReportData) -> str:
    split = data.time_split()
    bar = svg.stacked_bar(list(split.items()), title="Where the time went (all steps)")
    keys = ("time_rollout_s", "time_teacher_wait_s", "time_update_s")
    per_step = [
        [float(row.get(k) or 0.0) if isinstance(row.get(k), (int, float)) else 0.0 for k in keys]
        for row in data.metrics
        if any(k in row for k in keys)
    ]
    cols = svg.stacked_columns(
        per_step, list(split), title="Time per step", x_label="optimizer step", y_label="seconds"
    )
    tp = data.throughput()
    rate = tp["positions_per_s"]
    rows = [
        ["positions scored by the teacher", f"{tp['positions_scored']:.0f}"],
        ["positions per second (mean over steps)", "n/a" if rate is None else f"{rate:.1f}"],
        ["bytes sent to the teacher", fmt_bytes(tp["bytes_sent"])],
        ["bytes received from the teacher", fmt_bytes(tp["bytes_received"])],
        ["total step time", fmt_seconds(sum(split.values()) or None)],
    ]
    return (
        f'<h2>Where the time went</h2><div class="charts">{bar}{cols}</div>'
        f"<h3>Throughput</h3>{_table(['measure', 'value'], rows, frozenset({1}))}"
    )


def _provenance(data: ReportData) -> str:
    if not data.n_trajectories:
        return '<h2>Token provenance</h2><p class="note">No readable trajectories.</p>'
    rows = [[s, r, n, f"{f:.1%}"] for s, r, n, f in provenance_rows(data)]
    in_loss = sum(r[2] for r in rows if r[1] == "in loss")
    total = sum(r[2] for r in rows)
    rows.append(["total", f"{in_loss} in loss, {total - in_loss} context", total, "100%"])
    versions = ", ".join(f"v{v}: {n}" for v, n in sorted(data.by_version.items()))
    return (
        "<h2>Token provenance</h2>"
        f"{_table(['span type', 'role', 'tokens', 'share'], rows, frozenset({2, 3}))}"
        f'<p class="note">{data.n_trajectories} trajectories by sampling version: {_e(versions)}. '
        "Model spans are loss candidates; the recipe's position selection may score a subset.</p>"
    )


def _teacher_timeline(data: ReportData) -> str:
    labels: list[str] = []
    segments: list[tuple[int, str]] = []
    for i, row in enumerate(data.metrics):
        label = teacher_label(row.get("teacher")) or "no teacher"
        if label not in labels:
            labels.append(label)
        segments.append((int(row.get("step", i)) if isinstance(row.get("step"), int) else i, label))
    chart = ""
    if segments:
        width, left = 700, 8
        step_w = (width - 2 * left) / len(segments)
        parts = [
            f'<svg class="chart" role="img" width="{width}" height="{60 + 14 * len(labels)}" '
            f'viewBox="0 0 {width} {60 + 14 * len(labels)}">',
            f'<text x="{left}" y="16" class="ctitle">Teacher per optimizer step</text>',
        ]
        for i, (step, label) in enumerate(segments):
            colour = svg.PALETTE[labels.index(label) % len(svg.PALETTE)]
            parts.append(
                f'<rect x="{left + i * step_w:.1f}" y="26" width="{step_w + 0.3:.1f}" height="18" '
                f'fill="{colour}"><title>step {step}: {_e(label)}</title></rect>'
            )
        for j, label in enumerate(labels):
            y = 60 + 14 * j
            parts.append(
                f'<rect x="{left}" y="{y - 9}" width="10" height="10" fill="{svg.PALETTE[j % len(svg.PALETTE)]}"/>'
            )
            parts.append(f'<text x="{left + 14}" y="{y}" class="legend">{_e(label)}</text>')
        parts.append("</svg>")
        chart = "".join(parts)
    rows = []
    for event in data.teacher_events():
        name = event.get("event", "?")
        detail = {k: v for k, v in event.items() if k not in ("ts", "event", "version")}
        if name == "teacher_changed":
            text = (
                f"{detail.get('how', '?')}: {teacher_label(detail.get('old')) or '?'} → "
                f"{teacher_label(detail.get('new')) or '?'}"
            )
        else:
            text = ", ".join(
                f"{k}={teacher_label(v) if isinstance(v, dict) else v}" for k, v in detail.items()
            )
        stamp = str(event.get("ts", ""))[:19].replace("T", " ")
        rows.append([stamp, name, event.get("version", ""), text])
    table = (
        _table(["time", "event", "version", "details"], rows)
        if rows
        else '<p class="note">No teacher events recorded.</p>'
    )
    stale = data.stale_dropped()
    return (
        f"<h2>Teacher timeline</h2>{chart}{table}"
        f"<p>Stale or wrong-generation replies dropped (never trained on): <b>{stale}</b></p>"
    )


def _token_title(
    j: int, tok: int, span: SpanType, text: str, entry: dict | None, data: ReportData
) -> str:
    lines = [f"token {j} · {span.value} · id {tok} {text!r}"]
    if entry:
        lines += [
            f"{label} = {entry[key]:.3f}"
            for key, label in TOKEN_FACTS
            if entry.get(key) is not None
        ]
        alts = list(zip(entry.get("top_ids", []), entry.get("top_lps", []), strict=False))[:5]
        if alts:
            lines.append("teacher top alternatives:")
            lines += [
                f"  {data.token_text.get(int(i), f'#{int(i)}')!r}  {float(lp):.3f}"
                for i, lp in alts
            ]
    return "\n".join(lines)


def _strip_one(traj: Trajectory, data: ReportData, scale: float) -> str:
    entries = data.targets.get(traj.id, {})
    out = []
    for span in traj.spans:
        idx = list(range(span.start, span.end))
        if span.type in CONTEXT_SPANS and len(idx) > 2 * CONTEXT_KEEP + 8:
            hidden = len(idx) - 2 * CONTEXT_KEEP
            idx = idx[:CONTEXT_KEEP] + [-hidden] + idx[-CONTEXT_KEEP:]
        for j in idx:
            if j < 0:
                out.append(f'<span class="gap"> … {-j} {span.type.value} tokens … </span>')
                continue
            tok = traj.tokens[j]
            text = data.token_text.get(tok, f"#{tok} ")
            entry = entries.get(j)
            style = f"background:{SPAN_COLOURS[span.type.value]}"
            if entry and entry.get("divergence") is not None and scale > 0:
                alpha = min(1.0, max(0.0, entry["divergence"]) / scale)
                style += f";box-shadow:inset 0 -4px 0 rgba(220,38,38,{alpha:.2f})"
            shown = text.replace("\n", "↵\n")
            out.append(
                f'<span class="t" style="{style}" title="{_e(_token_title(j, tok, span.type, text, entry, data))}">'
                f"{_e(shown)}</span>"
            )
    verdict = "success" if traj.verifier.success else f"failed: {traj.verifier.reason}"
    head = (
        f"<h3>{_e(traj.id)} — task {_e(traj.task_id)}, version {traj.policy_version}, "
        f"{_e(traj.stop_reason.value)}, {_e(verdict)}</h3>"
    )
    return f'{head}<div class="strip">{"".join(out)}</div>'


def _strip(data: ReportData) -> str:
    if not data.strip:
        return '<h2>Per-token divergence</h2><p class="note">No readable trajectories to show.</p>'
    values = sorted(
        e["divergence"]
        for traj in data.strip
        for e in data.targets.get(traj.id, {}).values()
        if e.get("divergence") is not None
    )
    scale = values[int(0.95 * (len(values) - 1))] if values else 0.0
    legend = "".join(
        f'<span class="swatch" style="background:{c}">{_e(name)}</span>'
        for name, c in SPAN_COLOURS.items()
    )
    legend += (
        '<span class="swatch" style="box-shadow:inset 0 -4px 0 rgba(220,38,38,1)">high divergence</span>'
        if values
        else ""
    )
    notes = f"{data.targets_note}. {data.token_text_note}."
    body = "".join(_strip_one(t, data, scale) for t in data.strip)
    return (
        f"<h2>Per-token divergence</h2><p>{legend}</p>"
        f'<p class="note">{_e(notes)} Hover a token for details.</p>{body}'
    )


def _outcomes(data: ReportData) -> str:
    parts = ["<h2>Stop reasons and verifier failures</h2>"]
    if data.stop_reasons:
        total = sum(data.stop_reasons.values())
        rows = [[k, v, f"{v / total:.1%}"] for k, v in data.stop_reasons.most_common()]
        parts.append(
            "<h3>Training rollouts</h3>"
            + _table(["stop reason", "count", "share"], rows, frozenset({1, 2}))
        )
        tc = data.tool_calls
        parts.append(
            f'<p class="note">Tool calls: {tc["total"]} total, {tc["parse_errors"]} parse errors, '
            f"{tc['failed']} failed. Verified successes: {data.successes} of {data.n_trajectories}.</p>"
        )
    last_eval = data.evals[-1] if data.evals else None
    if last_eval and isinstance(last_eval.get("stop_reasons"), dict):
        rows = [[k, v] for k, v in last_eval["stop_reasons"].items()]
        parts.append(
            f"<h3>Last evaluation (version {_e(last_eval.get('version', '?'))})</h3>"
            + _table(["stop reason", "count"], rows, frozenset({1}))
        )
    if data.failures:
        rows = [[k, v, data.failure_examples.get(k, "")] for k, v in data.failures.most_common(20)]
        parts.append(
            "<h3>Verifier failure taxonomy</h3>"
            + _table(["reason (grouped)", "count", "example"], rows, frozenset({1}))
        )
    if len(parts) == 1:
        parts.append('<p class="note">No trajectories or evaluations to summarise.</p>')
    return "".join(parts)


def _recipe(data: ReportData) -> str:
    text = data.resolved_text or data.recipe_text
    if not text:
        return '<h2>Resolved recipe</h2><p class="note">No recipe file was readable.</p>'
    which = "recipe.resolved.yaml" if data.resolved_text else "recipe.yaml (no resolved recipe)"
    return f'<h2>Resolved recipe</h2><p class="note">{_e(which)}</p><pre>{_e(text)}</pre>'


def render_html(data: ReportData) -> str:
    """The whole report page as one string."""
    problems = ""
    if data.problems:
        items = "".join(f"<li>{_e(p)}</li>" for p in data.problems)
        problems = (
            f'<div class="problems"><b>Missing or unreadable inputs</b><ul>{items}</ul></div>'
        )
    sections = [
        _summary(data),
        _curves(data),
        _time(data),
        _provenance(data),
        _teacher_timeline(data),
        _strip(data),
        _outcomes(data),
        _recipe(data),
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>miniverl report: {_e(data.run_id)}</title><style>{CSS}</style></head>"
        f"<body><main><h1>miniverl run report: {_e(data.run_id)}</h1>"
        f'<p class="note">{_e(str(data.run_dir))}</p>{problems}{"".join(sections)}</main></body></html>\n'
    )
