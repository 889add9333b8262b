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

import argparse
import json
import sys
from pathlib import Path
from typing import Any

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
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", required=True, help="the record, relative to the repository")
    ap.add_argument("--commit", default=None,
                    help="the commit that holds the record: the table gets its annotation")
    args = ap.parse_args(argv)
    path = Path(args.record) if Path(args.record).is_absolute() else ROOT / args.record
    if not path.is_file():
        sys.exit(f"error: {args.record} does not exist; run python "
                 "benchmarks/cross_tokenizer_alignment.py first, or name a committed record")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not data.get("pairs"):
        sys.exit(f"error: {args.record} holds no pairs; name what "
                 "benchmarks/cross_tokenizer_alignment.py recorded")
    out = table(data)
    if args.commit:
        out += (f"\n<!-- table: {args.record} @ {args.commit} by python "
                f"benchmarks/cross_tokenizer_alignment_report.py --record {args.record} -->\n")
    print(out, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
