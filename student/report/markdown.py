"""A short markdown summary of a parsed run (``miniverl report RUN --markdown FILE``).

The HTML page (:mod:`~miniverl.student.report.html`) has the full picture; this is
the part that fits in a pull request or a chat message. It only formats.
"""

from __future__ import annotations

from miniverl.student.report.data import ReportData
from miniverl.student.report.summary import (
    fmt_bytes,
    fmt_seconds,
    provenance_rows,
    summary_rows,
)


def render_markdown(data: ReportData) -> str:
    """A short markdown summary of the run (the HTML report has the full picture)."""
    lines = [f"# Run report: {data.run_id}", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {_md(v)} |" for k, v in summary_rows(data)]
    split = data.time_split()
    total = sum(split.values())
    lines += ["", "## Where the time went", ""]
    for label, seconds in split.items():
        share = f" ({seconds / total:.0%})" if total else ""
        lines.append(f"- {label}: {fmt_seconds(seconds)}{share}")
    tp = data.throughput()
    rate = tp["positions_per_s"]
    lines.append(
        f"- positions scored: {tp['positions_scored']:.0f}"
        f" ({'n/a' if rate is None else f'{rate:.1f}'} /s); bytes sent "
        f"{fmt_bytes(tp['bytes_sent'])}, received {fmt_bytes(tp['bytes_received'])}"
    )
    lines += [
        "",
        "## Token provenance",
        "",
        "| span | role | tokens | share |",
        "| --- | --- | ---: | ---: |",
    ]
    lines += [f"| {s} | {r} | {n} | {f:.1%} |" for s, r, n, f in provenance_rows(data)]
    if data.evals:
        lines += [
            "",
            "## Evaluations",
            "",
            "| version | split | success | n |",
            "| ---: | --- | ---: | ---: |",
        ]
        lines += [
            f"| {e.get('version', '?')} | {_md(str(e.get('split', 'eval')))} | "
            f"{float(e['success']):.1%} | {e.get('n', '?')} |"
            for e in data.evals
        ]
    if data.stop_reasons:
        lines += ["", "## Stop reasons", ""]
        lines += [f"- {_md(k)}: {v}" for k, v in data.stop_reasons.most_common()]
    if data.failures:
        lines += ["", "## Verifier failures", ""]
        lines += [f"- {_md(k)}: {v}" for k, v in data.failures.most_common(10)]
    if data.problems:
        lines += ["", "## Missing or unreadable inputs", ""]
        lines += [f"- {_md(p)}" for p in data.problems]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
