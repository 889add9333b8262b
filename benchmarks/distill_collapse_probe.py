"""Why do two on-policy losses end on the same score at lr 1e-3? The collapse probe's reading.

    python benchmarks/distill_bench.py --config benchmarks/distill/probe_v4_collapse.yaml --phase grid --update-committed
    python benchmarks/distill_collapse_probe.py        # reads its cells, writes the record

Reads the grid cells of ``benchmarks/distill/probe_v4_collapse.yaml`` (version 4's grid
setting at lr 1e-3: docs/distillbench.md, "The shared collapse at lr 1e-3") and writes
``benchmarks/results/distill_v4_probe.json``: per cell and per update, the loss, the
gradient norm before the clip and after it (``min(norm, clip)``: ``clip_grad_norm_``
rescales a gradient above the clip to it), whether the clip bound, the success of the
update's own training episodes and the student's entropy on them (the mean ``-log q`` of
its sampled tokens at T=1: an unbiased estimate of the entropy of the policy that drew
them); whether the run restored any state (a ``resumed`` event: none, each cell builds a
fresh AdamW); and its final T=1 evaluation's episodes: success, stop reasons, tool
calls, and how alike they are (the share of episodes whose first model turn is the most
common first turn, and, between every two cells, the share of episodes with the same
tokens and the share with the same success). Two cells whose final episodes are the same
tokens are one policy; two with different episodes and the same count of successes are
two policies that score alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this file

from distill_bench import fail, run_clip  # noqa: E402
from real_model_learning import run_path  # noqa: E402

from miniverl.common.rundir import RunDir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "benchmarks" / "results" / "distill_v4_probe"
RECORD = ROOT / "benchmarks" / "results" / "distill_v4_probe.json"
MODEL_SPANS = ("assistant_text", "assistant_tool_call", "assistant_final")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def entropy_estimate(episodes: list[dict[str, Any]]) -> float | None:
    """The mean ``-log q(y)`` over the sampled tokens of ``episodes`` (their
    ``sampling_logprobs``); None when none recorded them."""
    values = [-v for e in episodes for v in (e.get("sampling_logprobs") or [])]
    return float(np.mean(values)) if values else None


def first_turn(episode: dict[str, Any]) -> tuple[int, ...]:
    """The tokens of an episode's first model span."""
    span = next((s for s in episode["spans"] if s["type"] in MODEL_SPANS), None)
    return tuple(episode["tokens"][span["start"]:span["end"]]) if span else ()


def per_update(rows: list[dict[str, Any]], episodes: list[dict[str, Any]],
               clip: float | None) -> list[dict[str, Any]]:
    """One row per training update: its metrics and its own episodes' success and entropy
    (the episodes a version ``v`` sampled train update ``v + 1``)."""
    by_version: dict[int, list[dict[str, Any]]] = {}
    for e in episodes:
        if e.get("source", "rollout") == "rollout":
            by_version.setdefault(int(e["policy_version"]), []).append(e)
    out = []
    for r in rows:
        if r.get("phase", "train") != "train" or r.get("grad_norm") is None:
            continue
        step = int(r["step"])
        mine = by_version.get(step - 1, [])
        norm = float(r["grad_norm"])
        out.append({
            "update": step, "loss": r.get("loss"), "grad_norm_before": norm,
            "grad_norm_after": min(norm, clip) if clip is not None else norm,
            "clipped": clip is not None and norm > clip,
            "train_success": r.get("train_success"),
            "episodes": len(mine),
            "entropy": entropy_estimate(mine),
        })
    return out


def final_episodes(run_dir: Path, split: str, update: int) -> list[dict[str, Any]]:
    return read_jsonl(RunDir(run_dir).eval_dir / f"{split}-v{update}.sampled.trajectories.jsonl")


def describe_final(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The final T=1 evaluation's episodes: how many succeeded, how they stopped, their
    tool calls and how alike their first turns are."""
    if not episodes:
        return {"episodes": 0}
    firsts = Counter(first_turn(e) for e in episodes)
    calls = [int((e.get("tool_calls") or {}).get("total", 0) or 0) for e in episodes]
    return {
        "episodes": len(episodes),
        "successes": sum(bool((e.get("verifier") or {}).get("success")) for e in episodes),
        "success": float(np.mean([bool((e.get("verifier") or {}).get("success"))
                                  for e in episodes])),
        "stop_reasons": dict(Counter(e.get("stop_reason", "final_answer") for e in episodes)),
        "mean_tool_calls": float(np.mean(calls)),
        "distinct_first_turns": len(firsts),
        "most_common_first_turn_share": firsts.most_common(1)[0][1] / len(episodes),
        "entropy": entropy_estimate(episodes),
    }


def alike(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """Two cells' final episodes, matched by task and seed: the share with the same
    tokens and the share with the same success."""
    key = lambda e: (e["task_id"], e.get("seed"))  # noqa: E731
    theirs = {key(e): e for e in b}
    pairs = [(e, theirs[key(e)]) for e in a if key(e) in theirs]
    if not pairs:
        return {"pairs": 0}
    return {"pairs": len(pairs),
            "same_tokens": sum(x["tokens"] == y["tokens"] for x, y in pairs) / len(pairs),
            "same_success": sum(bool((x.get("verifier") or {}).get("success"))
                                == bool((y.get("verifier") or {}).get("success"))
                                for x, y in pairs) / len(pairs)}


def read_cell(cell: dict[str, Any], folder: Path) -> dict[str, Any]:
    result = cell["result"]
    out: dict[str, Any] = {"arm": cell["arm"], "seed": cell["seed"], "status": result["status"]}
    if result["status"] != "ok" or not result.get("run_dir"):
        return out
    run_dir = run_path(folder, result["run_dir"])
    run = RunDir(run_dir)
    events = run.read_jsonl("events.jsonl")
    clip = run_clip(run_dir)
    updates = per_update(run.read_jsonl("metrics.jsonl"),
                         read_jsonl(run.path / "trajectories.jsonl"), clip)
    evals = [e for e in events if e.get("event") == "eval"]
    last = evals[-1] if evals else None
    finals = final_episodes(run_dir, last["split"], int(last["version"])) if last else []
    clipped = [u["clipped"] for u in updates]
    out.update({
        "clip": clip,
        "restored_state": any(e.get("event") == "resumed" for e in events),
        "final_t1": ((last or {}).get("sampled") or {}).get("success"),
        "final_greedy": (last or {}).get("success"),
        "clip_binding_share": float(np.mean(clipped)) if clipped else None,
        "updates": updates,
        "final": describe_final(finals),
    })
    out["_finals"] = finals
    return out


def probe(folder: Path) -> dict[str, Any]:
    results = folder / "grid" / "results.json"
    if not results.is_file():
        raise fail(f"{results} does not exist; run the probe's cells first: python "
                   "benchmarks/distill_bench.py --config benchmarks/distill/probe_v4_collapse.yaml "
                   "--phase grid --update-committed")
    data = json.loads(results.read_text(encoding="utf-8"))
    cells = [read_cell(c, results.parent) for c in data["cells"]]
    pairs = {}
    for i, a in enumerate(cells):
        for b in cells[i + 1:]:
            if a.get("_finals") and b.get("_finals"):
                pairs[f"{a['arm']} ~ {b['arm']}"] = alike(a["_finals"], b["_finals"])
    for c in cells:
        c.pop("_finals", None)
    return {"source": str(results.relative_to(ROOT)) if results.is_relative_to(ROOT)
            else str(results), "cells": cells, "final_episodes_alike": pairs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, default=FOLDER,
                    help="the probe benchmark's output folder (holding grid/)")
    ap.add_argument("--record", type=Path, default=RECORD, help="where to write the reading")
    args = ap.parse_args(argv)
    summary = probe(args.folder)
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    for c in summary["cells"]:
        if "updates" in c:
            ups = c["updates"]
            print(f"{c['arm']}: T=1 {c['final_t1']}, clip bound {c['clip_binding_share']:.2f}, "
                  f"entropy {ups[0]['entropy']} -> {ups[-1]['entropy']}, first turns "
                  f"{c['final']['distinct_first_turns']} distinct")
    for pair, v in summary["final_episodes_alike"].items():
        print(f"{pair}: {v}")
    print(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
