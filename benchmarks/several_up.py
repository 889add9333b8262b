"""Two tool domains under ``miniverl up``: two teacher processes, and one serving two adapters.

    python benchmarks/several_up.py [--update-committed | --output-dir DIR]

Runs one student of calculator and jsonnav under ``miniverl up`` twice
(docs/several-teachers.md, "Under up"), each from the several-teachers benchmark's
student (``benchmarks/several/student.yaml``: half way to learning both domains,
prepared now or found cached) with no warm-up, for 64 strict OPD updates at the rate
that benchmark's grid chose (1e-3):

- ``two_processes``: ``examples/several_teachers/two_teachers.yaml``'s two specialists
  (``calc``, ``nav``), each its own teacher process;
- ``one_process_two_adapters``: one teacher process serving the benchmark's base and
  its ``calc`` and ``nav`` adapters by name (``benchmarks/several/config.yaml``'s
  preparations, made now or found cached), each environment routed to its adapter.

For each run it reads what the run recorded: each domain's greedy success before
training (``eval.before``) and after, every route's counters from the last metrics row
(episodes, positions scored, stale replies dropped, episodes held back, seconds waited),
the run's stale replies, the teacher instances behind the routes (``manifest.json``:
one per process) and the wall clock of ``up``. Prints a table and writes
``runs/benchmarks/several_up.json`` (``--update-committed``:
``benchmarks/results/several_up.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "several_teachers" / "two_teachers.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "several_up.json"
ROUTE_COUNTERS = ("episodes", "positions_scored", "stale_dropped", "held_back", "wait_s")


UPDATES, LR = 64, 1.0e-3  # the several-teachers benchmark's budget and its grid's choice


def recipes(out_dir: Path) -> dict[str, Path]:
    """The two forms' recipes, written to ``out_dir``: the example's, from the
    benchmark's student without a warm-up, and the same with one process serving two
    adapters."""
    from several_bench import CONFIG, load_config, prepare_all

    _, settings = load_config(CONFIG)
    settings = settings.model_copy(update={"adapters": {k: v for k, v in settings.adapters.items()
                                                        if k in ("calc", "nav")}})
    prepared = prepare_all(settings, CONFIG.parent, out_dir)
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    data["student"]["model"] = {"path": prepared["student"]["model_dir"]}
    for section in data["teachers"].values():  # relative to the example's folder
        section["prepare"] = str((EXAMPLE.parent / section["prepare"]).resolve())
    train = data["train"]
    for key in ("sft_warmup_steps", "sft_warmup_until_loss", "sft_warmup_lr"):
        train.pop(key, None)
    train.update(cycles=UPDATES, lr=LR)
    adapters = yaml.safe_load(yaml.safe_dump(data))
    del adapters["teachers"]
    adapters["run"]["name"] = "two-adapters"
    adapters["teacher"] = {"model": {"path": prepared["base"]["model_dir"]},
                           "adapters": {n: prepared[f"adapter:{n}"]["model_dir"]
                                        for n in ("calc", "nav")},
                           "dtype": "float32", "device": "cpu", "memory": "resident"}
    for member in adapters["environments"]:
        member["adapter"] = member.pop("teacher")
    out = {}
    for name, recipe, what in (("two_processes", data, "two teacher processes"),
                               ("one_process_two_adapters", adapters,
                                "one teacher process serving two adapters")):
        path = out_dir / f"{name}.yaml"
        path.write_text(f"# examples/several_teachers/two_teachers.yaml from the several-teachers "
                        f"benchmark's student, {what}; written by benchmarks/several_up.py\n"
                        + yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
        out[name] = path
    return out


def run_up(recipe: Path, runs: Path, run_id: str) -> tuple[Path, float, int]:
    """``miniverl up RECIPE`` to its end; the run folder, its wall seconds, its exit code."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "miniverl.cli.app", "up", str(recipe),
                           "--output-dir", str(runs), "--run-id", run_id, "--quiet"],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-2000:])
    return runs / run_id, wall, proc.returncode


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n")
            if line.strip()]


def _point(evaluation: dict[str, Any]) -> dict[str, Any]:
    """One evaluation's version, greedy success and each domain's."""
    return {"version": evaluation["version"], "greedy": evaluation.get("success"),
            "domains": {k: v["success"]
                        for k, v in (evaluation.get("by_environment") or {}).items()}}


def read_run(run_dir: Path) -> dict[str, Any]:
    """What one run recorded: each domain before and after, each route's counters."""
    events = _jsonl(run_dir / "events.jsonl")
    rows = _jsonl(run_dir / "metrics.jsonl")
    evals = [e for e in events if e.get("event") == "eval"]
    first, last = evals[0], evals[-1]
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    teachers = manifest.get("teachers") or []
    instances = {t["route"]: t["instance"] for t in teachers}
    final = [r for r in rows if r.get("phase") != "sft_warmup"]  # the OPD updates
    by_teacher = final[-1].get("by_teacher") or {} if final else {}
    return {
        "run_dir": os.path.relpath(run_dir, ROOT),
        "status": json.loads((run_dir / "status.json").read_text(encoding="utf-8")).get("status"),
        "warmup_steps": len(rows) - len(final),
        "updates": len(final),
        "before": _point(first),
        "after": _point(last),
        "routes": {name: {k: c.get(k) for k in ROUTE_COUNTERS} for name, c in by_teacher.items()},
        "stale_dropped": final[-1].get("stale_dropped") if final else None,
        "teacher_instances": len(set(instances.values())),
        "route_instances": instances,
    }


FORMS = ("two_processes", "one_process_two_adapters")


def reread(output: Path, out_dir: Path) -> int:
    """The record with each run read again from its folder (its exit code and wall
    clock kept); exit 1 with one line when a run folder is missing."""
    if not output.is_file():
        raise SystemExit(f"error: --reread needs a record, and {output} does not exist; run "
                         "benchmarks/several_up.py first")
    record = json.loads(output.read_text(encoding="utf-8"))
    for name in FORMS:
        entry = record["runs"].get(name) or {}
        if entry.get("exit_code") != 0:
            continue
        found = ([ROOT / entry["run_dir"]] if entry.get("run_dir")
                 else sorted((out_dir / "runs").glob(f"{name}-*")))
        if not found or not found[-1].is_dir():
            raise SystemExit(f"error: --reread reads the kept runs, and {name}'s is not in "
                             f"{out_dir / 'runs'}; run benchmarks/several_up.py again")
        entry.update(read_run(found[-1]))
    output.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-dir", type=Path, default=None,
                    help="where runs and the record go (default runs/benchmarks/several_up)")
    ap.add_argument("--update-committed", action="store_true",
                    help="write benchmarks/results/several_up.json")
    ap.add_argument("--reread", action="store_true",
                    help="re-read the runs the record names (or the newest of each form in "
                         "the output folder's runs/); nothing is run")
    args = ap.parse_args(argv)
    out_dir = (args.output_dir or ROOT / "runs" / "benchmarks" / "several_up").resolve()
    output = RESULTS if args.update_committed else out_dir / RESULTS.name
    if args.reread:
        return reread(output, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    record: dict[str, Any] = {
        "benchmark": "several_up",
        "command": ("python benchmarks/several_up.py"
                    + (" --update-committed" if args.update_committed else "")),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": {},
    }
    forms = recipes(out_dir)
    code = 0
    for name, recipe in forms.items():
        print(f"{name}: miniverl up {os.path.relpath(recipe, ROOT)}", flush=True)
        run_dir, wall, rc = run_up(recipe, out_dir / "runs", f"{name}-{stamp}")
        entry: dict[str, Any] = {"recipe": os.path.relpath(recipe, ROOT), "exit_code": rc,
                                 "wall_s": round(wall, 1)}
        if rc == 0:
            entry.update(read_run(run_dir))
        else:
            code = 1
        record["runs"][name] = entry
        print(json.dumps(entry, indent=1), flush=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {output}")
    return code


if __name__ == "__main__":
    sys.exit(main())
