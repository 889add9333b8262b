"""Small inline-SVG chart primitives for the run and benchmark reports.

Line charts with axes, ticks and labels; a horizontal stacked bar; stacked columns;
a dot-and-interval chart. Each function returns an ``<svg>`` string with every
label HTML-escaped. No external fonts, stylesheets or scripts: a report stays one
offline file. Hover text uses SVG ``<title>`` elements (no JavaScript).

This module draws; it does not read files or decide what to plot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04")
TIME_COLOURS = ("#60a5fa", "#f59e0b", "#34d399")

Point = tuple[float, float]


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = mag
    for mult in (1, 2, 2.5, 5, 10):
        step = mult * mag
        if (hi - lo) / step <= n:
            break
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 10))
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.3g}"


def empty_chart(title: str, reason: str, width: int = 460, height: int = 80) -> str:
    return (
        f'<svg class="chart empty" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">'
        f'<text x="8" y="20" class="ctitle">{escape(title)}</text>'
        f'<text x="8" y="48" class="cnote">{escape(reason)}</text></svg>'
    )


def line_chart(
    series: Sequence[tuple[str, Sequence[Point]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 460,
    height: int = 240,
    y_range: tuple[float, float] | None = None,
    empty_reason: str = "no data recorded",
) -> str:
    """Polylines with axes; points are (x, y); non-finite points are skipped."""
    clean = [
        (name, [(float(x), float(y)) for x, y in pts if math.isfinite(x) and math.isfinite(y)])
        for name, pts in series
    ]
    clean = [(name, pts) for name, pts in clean if pts]
    if not clean:
        return empty_chart(title, empty_reason, width)
    xs = [x for _, pts in clean for x, _ in pts]
    ys = [y for _, pts in clean for _, y in pts]
    x_ticks = nice_ticks(min(xs), max(xs))
    y_ticks = nice_ticks(*(y_range or (min(ys), max(ys))))
    left, right, top, bottom = 56, 12, 28, 42
    plot_w, plot_h = width - left - right, height - top - bottom
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / ((y1 - y0) or 1) * plot_h

    out = [
        f'<svg class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f'<text x="{left}" y="16" class="ctitle">{escape(title)}</text>',
    ]
    for t in y_ticks:
        y = sy(t)
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" class="grid"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>'
        )
    for t in x_ticks:
        x = sx(t)
        out.append(
            f'<line x1="{x:.1f}" y1="{top + plot_h}" x2="{x:.1f}" y2="{top + plot_h + 4}" class="axis"/>'
        )
        out.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 16}" class="tick" text-anchor="middle">{_fmt(t)}</text>'
        )
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" class="axis"/>')
    out.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}" class="axis"/>'
    )
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" class="label" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    out.append(
        f'<text x="14" y="{top + plot_h / 2:.1f}" class="label" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{escape(y_label)}</text>'
    )
    for i, (name, pts) in enumerate(clean):
        colour = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        out.append(
            f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.8"/>'
        )
        if len(pts) <= 40:
            for x, y in pts:
                out.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6" fill="{colour}">'
                    f"<title>{escape(name)}: x={_fmt(x)}, y={_fmt(y)}</title></circle>"
                )
    if len(clean) > 1 or clean[0][0]:
        for i, (name, _) in enumerate(clean):
            lx = left + 8 + (i % 3) * 130
            ly = top + 10 + (i // 3) * 14
            out.append(
                f'<rect x="{lx}" y="{ly - 8}" width="10" height="3" fill="{PALETTE[i % len(PALETTE)]}"/>'
            )
            out.append(f'<text x="{lx + 14}" y="{ly - 3}" class="legend">{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def stacked_bar(
    parts: Sequence[tuple[str, float]], *, title: str, unit: str = "s", width: int = 700
) -> str:
    """One horizontal bar split into labelled parts (e.g. where the time went)."""
    total = sum(max(v, 0.0) for _, v in parts)
    if total <= 0:
        return empty_chart(title, "no time split recorded in metrics.jsonl", width)
    height = 88
    left, bar_w = 8, width - 16
    out = [
        f'<svg class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f'<text x="{left}" y="16" class="ctitle">{escape(title)}</text>',
    ]
    x = float(left)
    for i, (label, value) in enumerate(parts):
        w = max(value, 0.0) / total * bar_w
        colour = TIME_COLOURS[i % len(TIME_COLOURS)]
        text = f"{label}: {value:.2f} {unit} ({value / total:.0%})"
        out.append(
            f'<rect x="{x:.1f}" y="26" width="{w:.1f}" height="26" fill="{colour}">'
            f"<title>{escape(text)}</title></rect>"
        )
        lx = left + i * (bar_w / max(len(parts), 1))
        out.append(f'<rect x="{lx:.1f}" y="64" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{lx + 14:.1f}" y="73" class="legend">{escape(text)}</text>')
        x += w
    out.append("</svg>")
    return "".join(out)


def stacked_columns(
    rows: Sequence[Sequence[float]],
    labels: Sequence[str],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 700,
    height: int = 220,
) -> str:
    """One stacked column per row (e.g. per optimizer step), binned past 200 rows."""
    if not rows:
        return empty_chart(title, "no per-step timings recorded", width)
    bin_size = max(1, math.ceil(len(rows) / 200))
    binned = [
        [
            sum(r[i] for r in rows[s : s + bin_size]) / len(rows[s : s + bin_size])
            for i in range(len(labels))
        ]
        for s in range(0, len(rows), bin_size)
    ]
    peak = max(sum(r) for r in binned) or 1.0
    ticks = nice_ticks(0.0, peak)
    left, right, top, bottom = 56, 12, 28, 42
    plot_w, plot_h = width - left - right, height - top - bottom
    col_w = plot_w / len(binned)
    out = [
        f'<svg class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f'<text x="{left}" y="16" class="ctitle">{escape(title)}</text>',
    ]
    for t in ticks:
        y = top + plot_h - t / ticks[-1] * plot_h
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" class="grid"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>'
        )
    for c, row in enumerate(binned):
        y = top + plot_h
        for i, value in enumerate(row):
            h = max(value, 0.0) / ticks[-1] * plot_h
            y -= h
            tip = f"step {c * bin_size}: {labels[i]} {value:.3f}"
            out.append(
                f'<rect x="{left + c * col_w:.1f}" y="{y:.1f}" width="{max(col_w - 1, 0.5):.1f}" '
                f'height="{h:.1f}" fill="{TIME_COLOURS[i % len(TIME_COLOURS)]}"><title>{escape(tip)}</title></rect>'
            )
    out.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}" class="axis"/>'
    )
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" class="label" text-anchor="middle">'
        f"{escape(x_label)}{' (binned)' if bin_size > 1 else ''}</text>"
    )
    out.append(
        f'<text x="14" y="{top + plot_h / 2:.1f}" class="label" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{escape(y_label)}</text>'
    )
    out.append("</svg>")
    return "".join(out)


def interval_chart(
    rows: Sequence[tuple[str, float, float | None, float | None, Sequence[float]]],
    *,
    title: str,
    value_label: str,
    width: int = 520,
) -> str:
    """Per-arm mean (dot), interval (whisker) and per-seed values (small dots)."""
    if not rows:
        return empty_chart(title, "no finished cells yet", width)
    values = [v for _, m, lo, hi, seeds in rows for v in (m, lo, hi, *seeds) if v is not None]
    ticks = nice_ticks(min(values + [0.0]), max(values))
    left, right, top = 140, 16, 28
    row_h = 28
    height = top + row_h * len(rows) + 40
    plot_w = width - left - right

    def sx(v: float) -> float:
        return left + (v - ticks[0]) / ((ticks[-1] - ticks[0]) or 1) * plot_w

    out = [
        f'<svg class="chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f'<text x="8" y="16" class="ctitle">{escape(title)}</text>',
    ]
    bottom = top + row_h * len(rows)
    for t in ticks:
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="grid"/>')
        out.append(
            f'<text x="{x:.1f}" y="{bottom + 14}" class="tick" text-anchor="middle">{_fmt(t)}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{bottom + 32}" class="label" text-anchor="middle">'
        f"{escape(value_label)}</text>"
    )
    for i, (name, mean, lo, hi, seeds) in enumerate(rows):
        y = top + row_h * i + row_h / 2
        colour = PALETTE[i % len(PALETTE)]
        out.append(
            f'<text x="{left - 8}" y="{y + 4:.1f}" class="tick" text-anchor="end">{escape(name)}</text>'
        )
        if lo is not None and hi is not None:
            out.append(
                f'<line x1="{sx(lo):.1f}" y1="{y:.1f}" x2="{sx(hi):.1f}" y2="{y:.1f}" '
                f'stroke="{colour}" stroke-width="2"/>'
            )
        for v in seeds:
            out.append(
                f'<circle cx="{sx(v):.1f}" cy="{y + 7:.1f}" r="2" fill="{colour}" opacity="0.5"/>'
            )
        tip = f"{name}: mean {_fmt(mean)}" + (
            f", interval [{_fmt(lo)}, {_fmt(hi)}]" if lo is not None and hi is not None else ""
        )
        out.append(
            f'<circle cx="{sx(mean):.1f}" cy="{y:.1f}" r="4.5" fill="{colour}"><title>{escape(tip)}</title></circle>'
        )
    out.append("</svg>")
    return "".join(out)
