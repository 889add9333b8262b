"""Charts and an HTML page for the recovery benchmark's analysis (benchmarks/recovery_bench.py).

:func:`write_report` draws four SVG charts from the analysis summary (no plotting
library: plain SVG text, readable offline) and writes ``recovery_report.html`` beside
them: the metrics per arm with their intervals, the paired difference to the baseline
of recovery and of strict success on faulted tasks, and the wall time split per arm.
:func:`extract_figures` writes the benchmark report's own charts (``report.html``) as
``figure-N.svg`` files so docs can link them.

This module computes nothing; it draws what the summary holds.
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLORS = ("#3b6ea8", "#d9822b", "#5a9e5a", "#a33b3b", "#7b5ea8")
LABELS = {"faulted_success": "strict success (faulted)", "recovery": "recovery after error",
          "retry": "retry attempted",
          "fault_free_success": "success (fault-free)",
          "success": "success (all)"}
TIMES = (("rollout_s", "rollout"), ("teacher_wait_s", "teacher wait"), ("update_s", "update"),
         ("other_s", "evals + start-up"))


def record_path(path: Path, base: Path) -> str:
    """How a record names ``path``: from the repository root when it lies inside it (the
    committed results), else relative to ``base`` (the record's folder); never absolute."""
    path = path.resolve()
    if path.is_relative_to(ROOT):
        return path.relative_to(ROOT).as_posix()
    return Path(os.path.relpath(path, base.resolve())).as_posix()


def extract_figures(out_dir: Path, base: Path) -> list[str]:
    """The benchmark report's SVG charts as files beside it (no second renderer); their
    paths as :func:`record_path` names them from ``base``."""
    page = out_dir / "report.html"
    if not page.is_file():
        return []
    text = page.read_text(encoding="utf-8")
    style = re.search(r"<style>(.*?)</style>", text, flags=re.S)
    css = f"<style>{style.group(1)}</style>" if style else ""
    names = []
    for i, match in enumerate(re.finditer(r"<svg\b.*?</svg>", text, flags=re.S), start=1):
        svg = match.group(0)
        if "xmlns=" not in svg[:200]:  # inline SVG in HTML may omit it; a file may not
            svg = svg.replace("<svg", '<svg xmlns="http://www.w3.org/2000/svg"', 1)
        svg = re.sub(r"(<svg\b[^>]*>)", lambda m: m.group(1) + css, svg, count=1)
        path = out_dir / f"figure-{i}.svg"
        path.write_text(svg + "\n", encoding="utf-8")
        names.append(record_path(path, base))
    return names


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'
            f'<text x="8" y="16" font-size="13">{html.escape(title)}</text>'
            + "".join(body) + "</svg>\n")


def _axis(x0: int, y0: int, h: int, w: int, lo: float, hi: float) -> list[str]:
    out = [f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 - h}" stroke="#444"/>']
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        y = y0 - h * k / 4
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 4}" y="{y + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    return out


def metrics_chart(summary: dict) -> str:
    """Grouped bars: recovery, retry, faulted and fault-free success per arm, with
    intervals."""
    arms = list(summary["arms"])
    metrics = ("recovery", "retry", "faulted_success", "fault_free_success")
    x0, y0, h, group = 48, 250, 200, 36 * len(metrics) + 24
    width = x0 + group * max(1, len(arms)) + 20
    body = _axis(x0, y0, h, width - x0 - 10, 0.0, 1.0)
    for i, arm in enumerate(arms):
        entry = summary["arms"][arm]
        for j, metric in enumerate(metrics):
            m = entry.get(metric)
            x = x0 + 12 + i * group + j * 36
            if m is None:
                continue
            top = y0 - h * m["mean"]
            body.append(f'<rect x="{x}" y="{top:.1f}" width="30" height="{y0 - top:.1f}" '
                        f'fill="{COLORS[j]}"><title>{arm} {LABELS[metric]}: {m["mean"]:.3f} '
                        f'[{m["low"]:.3f}, {m["high"]:.3f}]</title></rect>')
            ylo, yhi = y0 - h * m["low"], y0 - h * m["high"]
            body.append(f'<line x1="{x + 15}" y1="{ylo:.1f}" x2="{x + 15}" y2="{yhi:.1f}" '
                        'stroke="#000"/>')
        body.append(f'<text x="{x0 + 12 + i * group + group / 2 - 12:.0f}" y="{y0 + 16}" '
                    f'text-anchor="middle">{html.escape(arm)}</text>')
    for j, metric in enumerate(metrics):
        body.append(f'<rect x="{x0 + 150 * j}" y="{y0 + 28}" width="10" height="10" '
                    f'fill="{COLORS[j]}"/><text x="{x0 + 150 * j + 14}" y="{y0 + 37}">'
                    f'{LABELS[metric]}</text>')
    return _svg(max(width, 800), y0 + 50, body, "held-out greedy eval after training "
                "(mean over seeds, 95% bootstrap interval)")


def difference_chart(summary: dict, metric: str) -> str:
    """Paired difference to the baseline of ``metric``, per arm, with intervals."""
    base = summary["baseline"]
    rows = [(arm, e.get(f"{metric}_vs_{base}")) for arm, e in summary["arms"].items()
            if arm != base]
    rows = [(a, d) for a, d in rows if d is not None]
    x0, w, top = 110, 360, 30
    body = []
    lo = min([-0.1, *(d["low"] for _, d in rows)])
    hi = max([0.1, *(d["high"] for _, d in rows)])

    def x(v: float) -> float:
        return x0 + w * (v - lo) / (hi - lo)

    body.append(f'<line x1="{x(0):.1f}" y1="{top}" x2="{x(0):.1f}" y2="{top + 28 * len(rows) + 8}" '
                'stroke="#444"/>')
    for i, (arm, d) in enumerate(rows):
        y = top + 18 + 28 * i
        body.append(f'<text x="{x0 - 8}" y="{y + 4}" text-anchor="end">{html.escape(arm)}</text>')
        body.append(f'<line x1="{x(d["low"]):.1f}" y1="{y}" x2="{x(d["high"]):.1f}" y2="{y}" '
                    'stroke="#000" stroke-width="2"/>')
        body.append(f'<circle cx="{x(d["mean"]):.1f}" cy="{y}" r="4" fill="{COLORS[0]}">'
                    f'<title>{d["mean"]:+.3f} [{d["low"]:+.3f}, {d["high"]:+.3f}]</title></circle>')
    y_axis = top + 28 * len(rows) + 24
    for v in (lo, 0.0, hi):
        body.append(f'<text x="{x(v):.1f}" y="{y_axis}" text-anchor="middle">{v:+.2f}</text>')
    return _svg(x0 + w + 30, y_axis + 12, body,
                f"{LABELS[metric]}: arm - {base} (paired by seed, 95% bootstrap)")


def time_chart(summary: dict) -> str:
    """Stacked bars: mean wall time per cell, split into rollout, wait, update, the rest."""
    arms = [(a, e["mean_time_split"]) for a, e in summary["arms"].items()
            if e.get("mean_time_split")]
    x0, y0, h = 48, 250, 200
    peak = max([1.0, *(sum(max(0.0, t.get(k) or 0.0) for k, _ in TIMES) for _, t in arms)])
    width = x0 + 70 * max(1, len(arms)) + 20
    body = _axis(x0, y0, h, width - x0 - 10, 0.0, peak)
    for i, (arm, t) in enumerate(arms):
        y = float(y0)
        for j, (key, label) in enumerate(TIMES):
            seconds = max(0.0, t.get(key) or 0.0)
            height = h * seconds / peak
            y -= height
            body.append(f'<rect x="{x0 + 14 + 70 * i}" y="{y:.1f}" width="44" '
                        f'height="{height:.1f}" '
                        f'fill="{COLORS[j]}"><title>{arm} {label}: {seconds:.1f} s</title></rect>')
        body.append(f'<text x="{x0 + 36 + 70 * i}" y="{y0 + 16}" text-anchor="middle">'
                    f'{html.escape(arm)}</text>')
    for j, (_, label) in enumerate(TIMES):
        body.append(f'<rect x="{x0 + 110 * j}" y="{y0 + 28}" width="10" height="10" '
                    f'fill="{COLORS[j]}"/><text x="{x0 + 110 * j + 14}" y="{y0 + 37}">'
                    f'{label}</text>')
    return _svg(max(width, 480), y0 + 50, body, "wall time per cell, seconds (mean over seeds)")


def _table(summary: dict) -> str:
    base = summary["baseline"]

    def iv(e: dict | None) -> str:
        return "-" if not e else f"{e['mean']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"

    head = ("arm", "ok/cells", "recovery", f"Δ vs {base} (seeds)", f"Δ vs {base} (tasks)",
            "retry", "faulted success", f"Δ vs {base} (seeds)", f"Δ vs {base} (tasks)",
            "fault-free success", "wall s", "positions", "MB on the wire")
    rows = []
    for arm, e in summary["arms"].items():
        cells = (arm, f"{e['ok']}/{e['cells']}", iv(e.get("recovery")),
                 iv(e.get(f"recovery_vs_{base}")), iv(e.get(f"recovery_vs_{base}_task_paired")),
                 iv(e.get("retry")), iv(e.get("faulted_success")),
                 iv(e.get(f"faulted_success_vs_{base}")),
                 iv(e.get(f"faulted_success_vs_{base}_task_paired")),
                 iv(e.get("fault_free_success")), f"{e.get('mean_wall_s', 0):.1f}",
                 f"{e.get('mean_positions_scored', 0):.0f}", f"{e.get('mean_bytes', 0) / 1e6:.2f}")
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join(rows) + "</table>")


def write_report(out_dir: Path, summary: dict, base: Path) -> list[str]:
    """The four charts as ``recovery-N.svg`` and ``recovery_report.html``; returns their
    paths as :func:`record_path` names them from ``base``."""
    charts = [metrics_chart(summary), difference_chart(summary, "recovery"),
              difference_chart(summary, "faulted_success"), time_chart(summary)]
    names = []
    for i, svg in enumerate(charts, start=1):
        path = out_dir / f"recovery-{i}.svg"
        path.write_text(svg, encoding="utf-8")
        names.append(record_path(path, base))
    ratio = summary.get("cost_ratio_opd_vs_frozen") or {}
    ratio_text = (f"OPD cell / frozen-state KD cell wall time: mean {ratio['mean_cell']:.2f}x, "
                  f"max {ratio['max_cell']:.2f}x; training only {ratio['mean_training']:.2f}x."
                  if ratio.get("per_seed") else "No OPD / frozen-state KD pair finished.")
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>recovery benchmark</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;"
        "padding:3px 6px;font-size:13px}table{border-collapse:collapse}</style></head><body>"
        f"<h1>Recovery benchmark</h1><p>config {html.escape(summary['config_digest'][:19])}, "
        f"budget {html.escape(str(summary['budget']))}, seeds {summary['seeds']}, "
        f"{'complete' if summary['complete'] else 'incomplete'}; baseline "
        f"{html.escape(summary['baseline'])}.</p>{_table(summary)}<p>{ratio_text}</p>"
        + "".join(charts) + "</body></html>\n")
    (out_dir / "recovery_report.html").write_text(page, encoding="utf-8")
    return names
