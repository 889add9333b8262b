"""The real-model protocol measurement as docs/real-models.md's table, printed from its record.

    python benchmarks/real_model_protocol_report.py --record benchmarks/results/real_model_protocol.json
    python benchmarks/real_model_protocol_report.py --record benchmarks/results/real_model_protocol.json --commit <sha>

Reads what ``benchmarks/real_model_protocol.py`` recorded (per request shape and target
kind: the median seconds of scoring in-process and over ipc, their ratio and the bytes
on the wire per scored position) and prints one row per measurement, the request named
on the first row of its group. With ``--commit`` (the commit holding the record) the
table is followed by its table annotation (tests/docs/figures.py): the docs test prints
it again from the record at that commit and compares it whole. It computes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from table_report import markdown, report_main

ROOT = Path(__file__).resolve().parents[1]


def table(data: dict[str, Any]) -> str:
    header = ["request", "positions", "kind", "in-process", "ipc", "ipc / in-process",
              "wire bytes / position"]
    rows, last = [], None
    for r in data["rows"]:
        group = (r["episodes"], r["tokens"], r["positions"])
        first = group != last
        last = group
        request = (f"{r['episodes']} episode{'s' if r['episodes'] != 1 else ''} "
                   f"({r['tokens']} tokens), {r['positions'].replace('all', 'all positions')}"
                   if first else "")
        kind = "exact" if r["kind"] == "exact" else f"{r['kind']} {r['k']}"
        rows.append([request, str(r["n_positions"]) if first else "", kind,
                     f"{r['in_process_s']:.2f}", f"{r['ipc_s']:.2f}", f"x{r['ipc_ratio']:.2f}",
                     f"{r['wire_bytes_per_position']:,.0f}"])
    return markdown(header, rows)


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, doc=__doc__, script="benchmarks/real_model_protocol_report.py",
                       producer="benchmarks/real_model_protocol.py", key="rows", table=table)


if __name__ == "__main__":
    sys.exit(main())
