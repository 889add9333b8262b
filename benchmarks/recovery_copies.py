"""How close each arm's repeated call comes to the call it must repeat (recovery benchmark).

    python benchmarks/recovery_copies.py runs/benchmarks/recovery-256/results.json

Writes ``recovery_copies.json`` (``recovery_copies_256.json`` for ``recovery-256``, the
suffix the benchmark's name adds to ``recovery``) in ``--output-dir`` (default
``runs/benchmarks/recovery_copies``), or with ``--update-committed`` the committed one in
``benchmarks/results/``. A results file whose run directories are missing (they are
git-ignored: a fresh clone has none) is refused, naming them.

A descriptive look at the kept runs, added after the results and not preregistered.
The recovery metric is all or nothing: the call after the error must repeat the failed
call exactly. This reads every cell's last greedy eval and, for each faulted task whose
episode saw the error and called again, compares the repeated call's ``expression``
with the failed call's, character by character:

- ``exact``: the share of repeated calls that are exact copies (the recoveries);
- ``char_accuracy``: the mean share of the failed expression's characters the repeated
  one has at the same place (a made-up expression scores low, ``94 * 18`` for
  ``94 * 10`` scores 6 of 7);
- ``prefix``: the mean number of leading characters copied right before the first slip.

Per arm, the mean over seeds. Nothing is trained or run; it reads JSON files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this file

from real_model_learning import ROOT, cell_outcome, missing_runs, record_path  # noqa: E402

from miniverl.student.benchmark.outputs import add_output_options, script_output_file  # noqa: E402


def _expression(message: dict) -> str | None:
    calls = message.get("tool_calls") or []
    if not calls:
        return None
    args = (calls[0].get("function") or {}).get("arguments")
    if isinstance(args, str):  # a malformed call keeps its raw text
        return None
    value = (args or {}).get("expression")
    return value if isinstance(value, str) else None


def repeated_calls(eval_file: Path) -> list[tuple[str, str | None]]:
    """(the failed call's expression, the next call's) for every episode whose first
    tool call got an error and that tried another call after it (None: malformed)."""
    pairs = []
    for line in eval_file.read_text(encoding="utf-8").splitlines():
        traj = json.loads(line)
        messages = traj.get("messages") or []
        for i, msg in enumerate(messages):
            if msg.get("role") != "tool" or not str(msg.get("content", "")).startswith("error"):
                continue
            failed = next((_expression(m) for m in reversed(messages[:i])
                           if m.get("role") == "assistant" and m.get("tool_calls")), None)
            after = next((m for m in messages[i + 1:] if m.get("role") == "assistant"), None)
            if failed is not None and after is not None:
                if after.get("tool_calls"):
                    pairs.append((failed, _expression(after)))
                elif "<tool_call>" in str(after.get("content", "")):
                    pairs.append((failed, None))  # a malformed call: nothing copied
            break  # the first error only, as the recovery metric
    return pairs


def copy_scores(pairs: list[tuple[str, str | None]]) -> dict:
    if not pairs:
        return {"n": 0, "exact": None, "char_accuracy": None, "prefix": None}
    exact, acc, prefix = [], [], []
    for want, got in pairs:
        got = got or ""
        exact.append(got == want)
        acc.append(sum(a == b for a, b in zip(want, got, strict=False)) / len(want))  # got may be shorter
        k = 0
        while k < min(len(want), len(got)) and want[k] == got[k]:
            k += 1
        prefix.append(k)
    return {"n": len(pairs), "exact": float(np.mean(exact)),
            "char_accuracy": float(np.mean(acc)), "prefix": float(np.mean(prefix)),
            "expression_chars": float(np.mean([len(w) for w, _ in pairs]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a recovery benchmark's results.json")
    add_output_options(parser, ROOT / "benchmarks" / "results" / "recovery_copies.json")
    args = parser.parse_args(argv)
    if not args.results.is_file():
        raise SystemExit(f"error: {args.results} does not exist; pass a recovery benchmark's "
                         "results.json (runs/benchmarks/<name>/results.json after a run)")
    missing = missing_runs(args.results)
    if missing:
        raise SystemExit(f"error: {len(missing)} run directories of {args.results} are missing "
                         f"({'; '.join(missing[:3])}{'; ...' if len(missing) > 3 else ''}); "
                         "they are git-ignored: run the benchmark first")
    data = json.loads(args.results.read_text(encoding="utf-8"))
    suffix = str(data["name"]).removeprefix("recovery").replace("-", "_")
    output = script_output_file(
        args, ROOT / "benchmarks" / "results" / f"recovery_copies{suffix}.json", ROOT)
    cells = []
    for cell in data["cells"]:
        out, evals = cell_outcome(cell, args.results.parent)
        if evals is None:
            cells.append({"arm": out["arm"], "seed": out["seed"], "error": out.get("error")})
            continue
        cells.append({"arm": out["arm"], "seed": out["seed"],
                      "before": copy_scores(repeated_calls(evals[0])),
                      "after": copy_scores(repeated_calls(evals[1]))})
    arms: dict[str, dict] = {}
    for name in dict.fromkeys(c["arm"] for c in cells):
        done = [c["after"] for c in cells if c["arm"] == name and "after" in c and c["after"]["n"]]
        arms[name] = {"cells": len(done), **{
            key: float(np.mean([d[key] for d in done])) if done else None
            for key in ("n", "exact", "char_accuracy", "prefix", "expression_chars")}}
    summary = {"source": record_path(args.results, output.parent), "arms": arms, "cells": cells}
    print(f"{'arm':<10} {'cells':>5} {'calls':>6} {'exact':>7} {'chars right':>12} {'prefix':>7}")
    for name, a in arms.items():
        if a["exact"] is None:
            print(f"{name:<10} {a['cells']:>5}      -")
            continue
        print(f"{name:<10} {a['cells']:>5} {a['n']:>6.1f} {a['exact']:>7.1%} "
              f"{a['char_accuracy']:>12.1%} {a['prefix']:>7.2f}")
    output.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
