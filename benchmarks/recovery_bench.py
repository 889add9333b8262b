"""Do fresh on-policy states pay for their cost? The preregistered recovery benchmark.

    python benchmarks/recovery_bench.py                 # the preregistered config
    python benchmarks/recovery_bench.py --resume        # continue an interrupted one
    python benchmarks/recovery_bench.py --analyze-only  # re-read the kept runs

Runs ``miniverl benchmark`` on ``benchmarks/recovery/config.yaml`` (committed before
any result of it): five arms (continued oracle SFT, oracle-state offline KD,
frozen-student-state KD, strict pipelined OPD, labelled replay with lag 2) each take the
same number of optimizer updates from the same cold student, on every seed. Then, for
every cell, it reads the run's greedy held-out evals before and after, regenerates the
eval tasks to know which carry a fault, and reports:

- recovery after a tool error (the preregistered metric: episodes that made the call
  that got their first error again, unchanged, and got a result, over episodes that saw
  an error; ``miniverl.student.environments.faults``), the weaker
  retry rate (a tool call attempted after the error, well-formed or not, over the same),
  strict success on the faulted tasks, success on the fault-free tasks, and overall
  success, before and after;
- per arm, the mean over seeds with a 95% bootstrap interval over seeds, and the paired
  difference to the baseline arm (frozen-state KD) per seed with a bootstrap interval
  over seeds; for recovery (the share of faulted tasks recovered) and the two success
  rates also a task-paired interval (tasks resampled within each seed, the same
  resample for both arms);
- the wall time of every cell split into rollout (sampling, or making oracle traces),
  teacher wait, update and the rest (evals, start-up), including the fixed set's
  sampling and scoring (the ``offline_targets_scored`` event); positions scored and
  bytes on the wire; the wall-time ratio of the OPD cell to the frozen-state KD cell
  per seed, whole cell and training only.

Writes, in ``--output-dir`` (default ``runs/benchmarks/<config name>``, git-ignored),
beside the benchmark's own ``results.json``, ``report.html`` and ``runs/``:
``recovery_bench.json`` (every cell, failed ones included), the report's charts
(``figure-N.svg``), this analysis's charts (``recovery-N.svg``) and
``recovery_report.html``. ``--update-committed`` writes the committed ones instead (the
config's ``output_dir`` and ``benchmarks/results/recovery_bench.json``; for another
config ``recovery_bench_<suffix>.json``, the suffix its name adds to ``recovery``).
``--analyze-only`` without the kept runs (git-ignored) says which are missing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this file

from real_model_learning import (  # noqa: E402
    benchmark_arguments,
    benchmark_outputs,
    cell_outcome,
    provenance,
    run_path,
)
from recovery_report import extract_figures, record_path, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmarks" / "recovery" / "config.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "recovery_bench.json"
METRICS = ("recovery", "retry", "faulted_success", "fault_free_success", "success")
SAMPLES = 10_000


_TASKS: dict[str, set[str]] = {}


def faulted_ids(recipe: dict) -> set[str]:
    """Ids of the eval tasks that carry a fault (tasks regenerated from the recipe)."""
    from miniverl.student.environments import make_tasks

    env = recipe["environment"]
    n = env["eval_tasks"]
    if (recipe.get("eval") or {}).get("max_tasks"):
        n = min(n, recipe["eval"]["max_tasks"])
    key = json.dumps([env, n], sort_keys=True)
    if key not in _TASKS:
        tasks = make_tasks(env["name"], "eval", n, env["difficulty"], env["split_seed"],
                           params=env.get("params") or {})
        _TASKS[key] = {t.id for t in tasks if t.data.get("fault")}
    return _TASKS[key]


def read_eval(path: Path, faulted: set[str]) -> dict[str, np.ndarray]:
    """Per task (sorted ids): success, faulted, saw an error, recovered, retried."""
    from miniverl.student.environments.faults import episode_recovery, episode_retried

    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rows[row["task_id"]] = row
    ids = sorted(rows)
    success = np.array([bool(rows[t]["verifier"]["success"]) for t in ids])
    pairs = [episode_recovery(rows[t].get("messages", [])) for t in ids]
    return {
        "ids": np.array(ids),
        "success": success,
        "faulted": np.array([t in faulted for t in ids]),
        "saw_error": np.array([p[0] for p in pairs]),
        "recovered": np.array([p[1] for p in pairs]),
        "retried": np.array([p[0] and episode_retried(rows[t].get("messages", []))
                             for t, p in zip(ids, pairs, strict=True)]),
    }


def rates(ev: dict[str, np.ndarray]) -> dict[str, float | int | None]:
    def mean(mask: np.ndarray) -> float | None:
        return float(ev["success"][mask].mean()) if mask.any() else None

    errors = int(ev["saw_error"].sum())
    return {
        "faulted_success": mean(ev["faulted"]),
        "fault_free_success": mean(~ev["faulted"]),
        "success": float(ev["success"].mean()),
        "recovery": float(ev["recovered"].sum() / errors) if errors else None,
        "retry": float(ev["retried"].sum() / errors) if errors else None,
        "n_faulted": int(ev["faulted"].sum()),
        "n_fault_free": int((~ev["faulted"]).sum()),
        "n_error_episodes": errors,
    }


def cost(run_dir: Path, wall_s: float | None) -> dict:
    """Wall time split, positions scored and bytes on the wire of one run."""
    split = {"rollout_s": 0.0, "teacher_wait_s": 0.0, "update_s": 0.0}
    positions, sent, received = 0, 0, 0
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        split["rollout_s"] += float(row.get("time_rollout_s") or 0.0)
        split["teacher_wait_s"] += float(row.get("time_teacher_wait_s") or 0.0)
        split["update_s"] += float(row.get("time_update_s") or 0.0)
        positions += int(row.get("positions_scored") or 0)
        sent = max(sent, int(row.get("bytes_sent") or 0))
        received = max(received, int(row.get("bytes_received") or 0))
    for line in (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event.get("event") == "offline_targets_scored":
            # The fixed set is sampled (or built) and scored inside the cell: its cost.
            split["rollout_s"] += float(event.get("time_sample_s") or 0.0)
            split["teacher_wait_s"] += float(event.get("time_teacher_wait_s") or 0.0)
            positions += int(event.get("positions") or 0)
            sent = max(sent, int(event.get("bytes_sent") or 0))
            received = max(received, int(event.get("bytes_received") or 0))
    training = sum(split.values())
    out = {k: round(v, 2) for k, v in split.items()}
    out["training_s"] = round(training, 2)
    out["other_s"] = round(wall_s - training, 2) if wall_s is not None else None
    return {"time_split": out, "positions_scored": positions, "bytes_sent": sent,
            "bytes_received": received}


def analyze_cell(cell: dict, results_dir: Path) -> dict:
    out, evals = cell_outcome(cell, results_dir)
    out["budget_matched"] = cell.get("budget_matched")
    if evals is None:
        return out
    run_dir = run_path(results_dir, out["run_dir"])
    recipe = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text(encoding="utf-8"))
    faulted = faulted_ids(recipe)
    before, after = read_eval(evals[0], faulted), read_eval(evals[1], faulted)
    if list(before["ids"]) != list(after["ids"]):
        out["error"] = "the evals before and after played different tasks"
        return out
    out["before"], out["after"] = rates(before), rates(after)
    out["per_task"] = {"ids": after["ids"].tolist(),
                       **{k: after[k].astype(int).tolist()
                          for k in ("faulted", "success", "recovered")}}
    out.update(cost(run_dir, out["wall_s"]))
    return out


def seed_interval(values: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    """Mean and a 95% percentile bootstrap interval over seeds."""
    arr = np.asarray(values, dtype=float)
    if len(arr) < 2:
        return float(arr.mean()), float(arr.mean()), float(arr.mean())
    means = arr[rng.integers(0, len(arr), size=(SAMPLES, len(arr)))].mean(axis=1)
    return float(arr.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def task_paired(pairs: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator):
    """Mean difference (arm - baseline, 0/1 per task) over seeds; tasks resampled within
    each seed, the same resample for both arms, seeds kept."""
    stats = np.zeros(SAMPLES)
    for arm, base in pairs:
        diff = arm.astype(float) - base.astype(float)
        stats += diff[rng.integers(0, len(diff), size=(SAMPLES, len(diff)))].mean(axis=1)
    stats /= len(pairs)
    mean = float(np.mean([(a.astype(float) - b.astype(float)).mean() for a, b in pairs]))
    return mean, float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))


def summarize_arms(cells: list[dict], baseline: str, rng: np.random.Generator) -> dict:
    ok = [c for c in cells if "after" in c]
    base = {c["seed"]: c for c in ok if c["arm"] == baseline}
    arms: dict[str, dict] = {}
    for arm in dict.fromkeys(c["arm"] for c in cells):
        mine = [c for c in cells if c["arm"] == arm]
        done = [c for c in mine if "after" in c]
        entry: dict = {"cells": len(mine), "ok": len(done), "failed": len(mine) - len(done)}
        for metric in METRICS:
            values = [c["after"][metric] for c in done if c["after"][metric] is not None]
            if values:
                entry[metric] = dict(zip(("mean", "low", "high"), seed_interval(values, rng),
                                         strict=True))
            diffs = [c["after"][metric] - base[c["seed"]]["after"][metric] for c in done
                     if c["seed"] in base and c["after"][metric] is not None
                     and base[c["seed"]]["after"][metric] is not None]
            if diffs and arm != baseline:
                entry[f"{metric}_vs_{baseline}"] = dict(
                    zip(("mean", "low", "high"), seed_interval(diffs, rng), strict=True),
                    n_pairs=len(diffs))
        for metric, key, subset in (("recovery", "recovered", 1), ("faulted_success", "success", 1),
                                    ("fault_free_success", "success", 0)):
            pairs = []
            for c in done:
                b = base.get(c["seed"])
                if arm == baseline or b is None or b["per_task"]["ids"] != c["per_task"]["ids"]:
                    continue
                mask = np.array(c["per_task"]["faulted"]) == subset
                pairs.append((np.array(c["per_task"][key])[mask],
                              np.array(b["per_task"][key])[mask]))
            if pairs:
                entry[f"{metric}_vs_{baseline}_task_paired"] = dict(
                    zip(("mean", "low", "high"), task_paired(pairs, rng), strict=True))
        if done:
            entry["before"] = {m: done[0]["before"][m] for m in METRICS}
            entry["mean_wall_s"] = float(np.mean([c["wall_s"] for c in done]))
            entry["mean_time_split"] = {
                k: float(np.mean([c["time_split"][k] for c in done]))
                for k in ("rollout_s", "teacher_wait_s", "update_s", "training_s", "other_s")
                if all(c["time_split"][k] is not None for c in done)}
            entry["mean_positions_scored"] = float(np.mean([c["positions_scored"] for c in done]))
            entry["mean_bytes"] = float(np.mean([c["bytes_sent"] + c["bytes_received"]
                                                 for c in done]))
            entry["mean_updates"] = float(np.mean([c["updates"] for c in done]))
        arms[arm] = entry
    return arms


def cost_ratio(cells: list[dict], fresh: str, frozen: str) -> dict:
    """Wall time of the fresh-state cell over the frozen-state cell, per seed."""
    by = {(c["arm"], c["seed"]): c for c in cells if "after" in c}
    per_seed = {}
    for (arm, seed), c in sorted(by.items()):
        other = by.get((frozen, seed))
        if arm == fresh and other is not None:
            per_seed[str(seed)] = {
                "cell": c["wall_s"] / other["wall_s"],
                "training": c["time_split"]["training_s"] / other["time_split"]["training_s"],
            }
    if not per_seed:
        return {"per_seed": {}}
    return {"per_seed": per_seed,
            "mean_cell": float(np.mean([v["cell"] for v in per_seed.values()])),
            "max_cell": float(max(v["cell"] for v in per_seed.values())),
            "mean_training": float(np.mean([v["training"] for v in per_seed.values()]))}


def analyze(results_path: Path, output: Path) -> dict:
    data = json.loads(results_path.read_text(encoding="utf-8"))
    rng = np.random.default_rng(0)
    cells = [analyze_cell(c, results_path.parent) for c in data["cells"]]
    baseline = data["baseline"]
    modes = {a["name"]: (a["mode"], (a.get("overrides") or {}).get("train", {}))
             for a in data["config"]["arms"]}
    fresh = next((n for n, (mode, _) in modes.items() if mode == "opd"), None)
    return {
        **provenance(results_path, data, output),
        "baseline": baseline,
        "metric": data["metric"],
        "budget": data["config"]["budget"],
        "seeds": data["config"]["seeds"],
        "environment": data.get("environment", {}),
        "arms": summarize_arms(cells, baseline, rng),
        "cost_ratio_opd_vs_frozen": cost_ratio(cells, fresh, baseline) if fresh else None,
        "cells": [{k: v for k, v in c.items() if k != "per_task"} for c in cells],
    }


def print_table(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    def iv(entry: dict | None) -> str:
        if not entry:
            return "-"
        return f"{entry['mean']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}]"

    base = summary["baseline"]
    table = Table(title=f"held-out greedy eval after {summary['budget'].get('updates')} updates, "
                        f"mean over seeds [95% bootstrap]")
    for col in ("arm", "ok", "recovery", f"Δ vs {base}", "retry", "faulted success",
                f"Δ vs {base}", "fault-free success", "wall s"):
        table.add_column(col)
    for arm, e in summary["arms"].items():
        table.add_row(arm, f"{e['ok']}/{e['cells']}", iv(e.get("recovery")),
                      iv(e.get(f"recovery_vs_{base}")), iv(e.get("retry")),
                      iv(e.get("faulted_success")), iv(e.get(f"faulted_success_vs_{base}")),
                      iv(e.get("fault_free_success")),
                      f"{e['mean_wall_s']:.1f}" if "mean_wall_s" in e else "-")
    Console().print(table)
    ratio = summary.get("cost_ratio_opd_vs_frozen") or {}
    if ratio.get("per_seed"):
        print(f"OPD / frozen-state KD wall time: mean {ratio['mean_cell']:.2f}x per cell "
              f"(max {ratio['max_cell']:.2f}x), {ratio['mean_training']:.2f}x training only")


def committed_analysis(config_path: Path) -> Path:
    """The committed analysis file of a recovery config: ``recovery_bench.json`` for
    ``recovery``, ``recovery_bench_256.json`` for ``recovery-256``."""
    name = yaml.safe_load(Path(config_path).read_text(encoding="utf-8"))["name"]
    suffix = str(name).removeprefix("recovery").replace("-", "_")
    return RESULTS.with_name(f"recovery_bench{suffix}.json")


def main(argv: list[str] | None = None) -> int:
    args = benchmark_arguments(__doc__, CONFIG).parse_args(argv)
    out_dir, output = benchmark_outputs(args, committed_analysis(args.config))
    if not args.analyze_only:
        from miniverl.student.benchmark.run import run_benchmark

        def on_cell(record) -> None:
            r = record.result
            print(f"cell {record.arm} seed {record.seed}: {r.status}, faulted success "
                  f"{r.faulted_success_before} -> {r.faulted_success_after}, recovery "
                  f"{r.recovery_before} -> {r.recovery_after}, {r.wall_s or 0:.0f} s"
                  + (f", {r.error}" if r.error else ""), flush=True)

        run_benchmark(args.config, resume=args.resume, output_dir=out_dir,
                      update_committed=args.update_committed, on_cell=on_cell)
    summary = analyze(out_dir / "results.json", output)
    summary["report_html"] = record_path(out_dir / "report.html", output.parent)
    summary["figures"] = (extract_figures(out_dir, output.parent)
                          + write_report(out_dir, summary, output.parent))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print_table(summary)
    print(f"wrote {output} and {out_dir / 'recovery_report.html'}")
    return 0 if summary["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
