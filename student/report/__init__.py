"""The offline run report: read a run directory, write one self-contained HTML page.

Rooms: :mod:`.load` reads a run directory into :class:`.data.ReportData` (never
raising on bad files), :mod:`.targets` fetches the teacher's per-token targets from
the run's cache, :mod:`.html` and :mod:`.svg` draw the page, :mod:`.markdown` the
short summary, and :mod:`.build` writes the files (``miniverl report RUN``).

This package is torch-free: the report works on the core install. It trains and
scores nothing. Import what you need from its modules; this file exports nothing.
"""
