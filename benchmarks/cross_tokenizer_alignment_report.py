"""The cross-tokenizer alignment measurement as docs/cross-tokenizer.md's table, from its record.

    python benchmarks/cross_tokenizer_alignment_report.py --record benchmarks/results/cross_tokenizer_alignment.json
    python benchmarks/cross_tokenizer_alignment_report.py --record benchmarks/results/cross_tokenizer_alignment.json --commit <sha>

Reads what ``benchmarks/cross_tokenizer_alignment.py`` recorded and prints one row per
student → teacher pair: the vocabulary map (ids mapped, the shares of each vocabulary),
the student positions scored, the share in trainable groups, the share of model
positions aligned and, of those, exact. With ``--commit`` (the commit holding the
record) the table is followed by its table annotation (tests/docs/figures.py): the docs
test prints it again from the record at that commit and compares it whole. It computes
nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from table_report import markdown, report_main

ROOT = Path(__file__).resolve().parents[1]
NAMES = {"toy": "toy byte", "qwen3": "Qwen3", "smollm2": "SmolLM2"}  # as the page names them


def table(data: dict[str, Any]) -> str:
    header = ["student → teacher", "map ids", "of student vocab", "of teacher vocab",
              "student positions", "in trainable groups", "model positions aligned",
              "of those, exact"]
    rows = []
    for p in data["pairs"]:
        vmap = p["vocab_map"]
        rows.append([f"{NAMES.get(p['student'], p['student'])} → "
                     f"{NAMES.get(p['teacher'], p['teacher'])}",
                     f"{vmap['mapped']:,}", f"{vmap['student_share']:.1%}",
                     f"{vmap['teacher_share']:.1%}", f"{p['totals']['student_positions']:,}",
                     f"{p['trainable_share']:.1%}", f"{p['model_aligned_share']:.1%}",
                     f"{p['exact_share_of_aligned_model']:.1%}"])
    return markdown(header, rows)


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, doc=__doc__, script="benchmarks/cross_tokenizer_alignment_report.py",
                       producer="benchmarks/cross_tokenizer_alignment.py", key="pairs", table=table)


if __name__ == "__main__":
    sys.exit(main())
