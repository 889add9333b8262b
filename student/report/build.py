"""Write a run's report: one offline HTML file and, on request, a markdown summary.

``build_report(run_dir)`` reads the run (:mod:`~miniverl.student.report.load`) and
writes ``report.html`` (:mod:`~miniverl.student.report.html`) and optionally a
markdown summary (:mod:`~miniverl.student.report.markdown`). Missing or corrupted
inputs are listed in the report instead of failing. It never changes the run
directory except for the report files it is asked to write; it is torch-free.

Run it with ``miniverl report RUN [--out FILE] [--markdown FILE]``.
"""

from __future__ import annotations

from pathlib import Path

from miniverl.common.atomic import atomic_write_text
from miniverl.common.errors import MiniverlError
from miniverl.student.report.html import render_html
from miniverl.student.report.load import load_run
from miniverl.student.report.markdown import render_markdown


def build_report(
    run_dir: str | Path, out: str | Path | None = None, markdown: str | Path | None = None
) -> Path:
    """Write the run's HTML report (default ``<run>/report.html``) and return its path.

    ``markdown`` also writes a markdown summary. Missing or corrupted inputs are listed in
    the report instead of failing; only an absent run directory or an unwritable output
    raises :class:`MiniverlError`.
    """
    data = load_run(run_dir)
    out_path = Path(out) if out else data.run_dir / "report.html"
    write_page(out_path, render_html(data))
    if markdown:
        write_page(Path(markdown), render_markdown(data))
    return out_path


def write_page(path: Path, text: str) -> None:
    """Write one report file (shareable permissions); an unwritable path is one line."""
    try:
        atomic_write_text(path, text, shared=True)  # a report is made to be shared
    except OSError as exc:
        raise MiniverlError(
            f"cannot write {path} ({exc.strerror}); choose a writable path with --out"
        ) from exc
