"""The pilot of version 3 of the distillation benchmark: the plateau and the teacher's margin per N.

    python benchmarks/distill_pilot_v3.py                      # every N of the config
    python benchmarks/distill_pilot_v3.py --only 512           # one N (runs in parallel: --jobs)
    python benchmarks/distill_pilot_v3.py --update-committed   # write benchmarks/results/
    python benchmarks/distill_pilot_v3.py --report             # the record's table (docs)

Runs ``benchmarks/distill/pilot_v3.yaml`` (docs/distillbench-history.md, "Version 3"). For each
N of ``data_prompts`` the student of ``student_recipe`` trains on the user's data, the
teacher's own T=1 episodes of the first N training prompts, unfiltered (an ``sft`` run
with ``train.fixed_set: teacher`` on a pool of N prompts), with a decaying rate, and is
evaluated on the validation split every ``eval_every`` updates. The teacher is
``teacher_prepare``'s preparation (cached; trained first when it is not). Each N is
judged by the two gates version 3 checks before its first cell
(``student/benchmark/gates.py``): the plateau rule on the last two evaluations and the
teacher's T=1 margin over the plateau; the record also keeps the teacher episodes'
own success (how good the user's data is), each run's wall clock and the machine it
ran on (``machine.py``: one recipe can train another student on another machine). The
choice: the largest N where both gates hold and the plateau is at least
``warm_floor``; none is a result too, written as such.

Writes ``distill_pilot_v3.json`` in ``--output-dir`` (default
``runs/benchmarks/distill-pilot-v3``, git-ignored; the runs beside it), or in
``benchmarks/results/`` with ``--update-committed``. A second call adds the Ns it runs
to the record it finds there, so Ns can be run in parts. It trains students only; no
benchmark arm runs here.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this file
from machine import machine_record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmarks" / "distill" / "pilot_v3.yaml"
RECORD = "distill_pilot_v3.json"
# The configs whose record is RECORD (the first pilot and its smoke form).
PILOT_NAMES = ("distill-pilot-v3", "distill-pilot-v3-smoke")


class PilotTrain(BaseModel):
    """The student's training on the user's data."""

    model_config = ConfigDict(extra="forbid")
    cycles: int = Field(ge=2)
    rollouts_per_cycle: int = Field(ge=1)
    lr: float = Field(gt=0.0)
    schedule: str = Field(pattern="^(constant|cosine|linear)$")
    warmup_steps: int = Field(ge=0)
    eval_every: int = Field(ge=1)


class PilotGates(BaseModel):
    """The preregistered gates and the choice's floor."""

    model_config = ConfigDict(extra="forbid")
    plateau_tolerance: float = Field(gt=0.0, le=1.0)
    teacher_margin: float = Field(gt=0.0, le=1.0)
    warm_floor: float = Field(ge=0.0, le=1.0)


class PilotConfig(BaseModel):
    """``benchmarks/distill/pilot_v3.yaml``."""

    model_config = ConfigDict(extra="forbid")
    name: str
    student_recipe: str
    teacher_prepare: str
    teacher_model: dict[str, Any]
    teacher_min_success: float | None = Field(ge=0.0, le=1.0)
    data_prompts: list[int] = Field(min_length=1)
    train: PilotTrain
    gates: PilotGates


def fail(message: str) -> SystemExit:
    """A script error: one line, exit 1, no traceback."""
    return SystemExit(f"error: {message}")


def load_config(path: Path) -> PilotConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        config = PilotConfig.model_validate(raw)
    except (OSError, yaml.YAMLError) as exc:
        raise fail(f"{path} cannot be read as YAML ({type(exc).__name__}); pass the pilot's "
                   "config (benchmarks/distill/pilot_v3.yaml)") from None
    except ValidationError as exc:
        issues = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                           for e in exc.errors())
        raise fail(f"{path}: {issues}") from None
    if config.train.cycles % config.train.eval_every:
        raise fail(f"{path}: train.eval_every {config.train.eval_every} does not divide "
                   f"train.cycles {config.train.cycles}; the plateau rule reads the last two "
                   "evaluations, the last at the end of training: make it a divisor")
    if any(n < 1 for n in config.data_prompts):
        raise fail(f"{path}: data_prompts {config.data_prompts} must be positive counts")
    return config


def student_recipe(config: PilotConfig, config_dir: Path, n: int, teacher_dir: str,
                   runs: Path) -> dict[str, Any]:
    """The sft recipe of one N: the student recipe on a pool of the first N prompts,
    trained on the teacher's own episodes of them (SeqKD's fixed set), rate decaying."""
    data = yaml.safe_load((config_dir / config.student_recipe).read_text(encoding="utf-8"))
    data = copy.deepcopy(data)
    data["run"] = {**data["run"], "name": f"{config.name}-n{n}", "output_dir": str(runs)}
    data["environment"] = {**data["environment"], "train_tasks": n}
    train = {k: v for k, v in data["train"].items() if k != "oracle_tasks"}
    data["train"] = {**train, **config.train.model_dump(), "fixed_set": "teacher",
                     "save_every": 0}
    data["teacher"] = {"model": {"path": teacher_dir}, "dtype": "float32", "device": "cpu",
                       "min_success": config.teacher_min_success}
    data["eval"] = {**data["eval"], "before": False}
    return data


def run_one(config_path: str, n: int, teacher_dir: str, runs: str) -> dict[str, Any]:
    """Train the student of one N and read its figures (in its own process)."""
    from miniverl.common.recipe import Recipe
    from miniverl.common.rundir import RunDir
    from miniverl.student.benchmark.gates import validation_curve
    from miniverl.student.train.trainer import Trainer

    config = load_config(Path(config_path))
    recipe = Recipe.model_validate(student_recipe(config, Path(config_path).parent, n,
                                                  teacher_dir, Path(runs)))
    t0 = time.perf_counter()
    with Trainer(recipe, show_progress=False, write_report=False, checkpoints=False) as trainer:
        result = trainer.train()
    wall = time.perf_counter() - t0
    events = RunDir(result.run_dir).read_jsonl("events.jsonl")
    played = [e for e in events if e.get("event") == "teacher_set_played"]
    return {"n": n, "status": result.status, "steps": result.steps, "wall_s": round(wall, 1),
            "run_dir": Path(result.run_dir).name,
            "teacher_set": {"episodes": sum(int(e.get("episodes") or 0) for e in played),
                            "success": played[-1].get("success") if played else None,
                            "play_s": round(sum(float(e.get("time_play_s") or 0.0)
                                                for e in played), 1)},
            "evals": validation_curve(events)}


def judge(entry: dict[str, Any], teacher_t1: float, gates: PilotGates) -> dict[str, Any]:
    """Both gates on one N's figures: each one's figure, whether it holds and why not."""
    from miniverl.common.errors import ConfigError
    from miniverl.student.benchmark.gates import margin_gate, plateau_gate

    scored = [p for p in entry["evals"] if p.get("t1") is not None]
    last = scored[-1]["t1"] if scored else None
    out: dict[str, Any] = {"plateau": last,
                           "last_step": (abs(scored[-1]["t1"] - scored[-2]["t1"])
                                         if len(scored) >= 2 else None),
                           "margin": teacher_t1 - last if last is not None else None}
    for gate, check in (("plateau_holds", lambda: plateau_gate(
            scored, gates.plateau_tolerance, f"N={entry['n']}")),
            ("margin_holds", lambda: margin_gate(teacher_t1, last, gates.teacher_margin,
                                                 "the teacher"))):
        try:
            check()
            out[gate], out[f"{gate}_why"] = True, None
        except (ConfigError, TypeError) as exc:
            out[gate], out[f"{gate}_why"] = False, str(exc)
    out["warm"] = last is not None and last >= gates.warm_floor
    return out


def choose(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest N whose plateau and margin hold and whose plateau is warm, or None."""
    good = [e["n"] for e in entries
            if e["gates"]["plateau_holds"] and e["gates"]["margin_holds"] and e["gates"]["warm"]]
    return {"n": max(good) if good else None, "passing": sorted(good),
            "rule": "the largest N where the plateau and the margin hold and the plateau is "
                    "at least warm_floor"}


def prepare_teacher(config: PilotConfig, config_dir: Path) -> dict[str, Any]:
    from miniverl.common.recipe_models import ModelSource
    from miniverl.student.teacher_prep import prepare_model

    prepared = prepare_model(config_dir / config.teacher_prepare,
                             ModelSource.model_validate(config.teacher_model),
                             what="teacher_prepare", model_field="teacher_model",
                             show_progress=False)
    evaluation = prepared.record.get("eval") or {}
    return {"model_dir": str(prepared.model_dir), "split": evaluation.get("split"),
            "n": evaluation.get("n"), "greedy": evaluation.get("success"),
            "t1": (evaluation.get("sampled") or {}).get("success"),
            "prep_wall_s": prepared.record.get("wall_s")}


def commit_of(path: Path) -> str | None:
    """The last commit that touched ``path`` (the pilot's config as run)."""
    out = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h", "--",
                          str(path)], capture_output=True, text=True)
    return out.stdout.strip() or None


def markdown_table(record: dict[str, Any]) -> str:
    """The pilot's figures per N as docs/distillbench-history.md prints them."""
    gates = record["gates"]
    header = ["N (prompts)", "teacher episodes (their success)",
              "T=1 validation by update", "greedy at the end", "plateau (last T=1)",
              f"last step (rule: within {gates['plateau_tolerance']:g})",
              f"teacher margin (rule: at least {gates['teacher_margin']:g})", "both hold",
              "wall s"]
    rows = []
    for run in record["runs"]:
        g = run["gates"]
        curve = ", ".join(f"{p['update']}: {p['t1']:.3f}" for p in run["evals"]
                          if p.get("t1") is not None)
        last = run["evals"][-1] if run["evals"] else {}
        rows.append([str(run["n"]),
                     f"{run['teacher_set']['episodes']} ({run['teacher_set']['success']:.3f})"
                     if run["teacher_set"]["success"] is not None else "-",
                     curve or "-",
                     "-" if last.get("greedy") is None else f"{last['greedy']:.3f}",
                     "-" if g["plateau"] is None else f"{g['plateau']:.3f}",
                     "-" if g["last_step"] is None else f"{g['last_step']:.3f}",
                     "-" if g["margin"] is None else f"{g['margin']:+.3f}",
                     "yes" if g["plateau_holds"] and g["margin_holds"] else "no",
                     f"{run['wall_s']:.0f}"])
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def report(record_arg: str, commit: str | None) -> int:
    """``--report``: print the record's table (and its table annotation with a commit)."""
    path = Path(record_arg) if Path(record_arg).is_absolute() else ROOT / record_arg
    if not path.is_file():
        raise fail(f"{record_arg} does not exist; run the pilot first "
                   "(python benchmarks/distill_pilot_v3.py)")
    out = markdown_table(json.loads(path.read_text(encoding="utf-8")))
    if commit:
        out += (f"\n<!-- table: {record_arg} @ {commit} by python benchmarks/distill_pilot_v3.py "
                f"--report --record {record_arg} -->\n")
    print(out, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", action="store_true",
                    help="print the table of --record (runs nothing)")
    ap.add_argument("--record", default=f"benchmarks/results/{RECORD}",
                    help="--report: the pilot's record, relative to the repository")
    ap.add_argument("--commit", default=None,
                    help="--report: the commit holding the record (adds the table annotation)")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--only", type=int, action="append", default=None,
                    help="run this N only (repeatable); the record keeps the others it holds")
    ap.add_argument("--jobs", type=int, default=1, help="Ns trained side by side (1 thread each)")
    ap.add_argument("--output-dir", type=Path, default=None)
    ap.add_argument("--update-committed", action="store_true",
                    help="write benchmarks/results/distill_pilot_v3.json")
    args = ap.parse_args(argv)
    if args.report:
        return report(args.record, args.commit)
    config = load_config(args.config)
    wanted = args.only or config.data_prompts
    unknown = [n for n in wanted if n not in config.data_prompts]
    if unknown:
        raise fail(f"--only {unknown} is not in the config's data_prompts "
                   f"{config.data_prompts}; name one of them (or commit a new config first)")
    if args.jobs < 1:
        raise fail(f"--jobs {args.jobs} must be at least 1")
    out_dir = (ROOT / "benchmarks" / "results" if args.update_committed
               else args.output_dir or ROOT / "runs" / "benchmarks" / config.name)
    # A later config (a longer pilot) keeps its own record beside this one's.
    record_path = out_dir / (RECORD if config.name in PILOT_NAMES else
                             f"{config.name.replace('-', '_')}.json")
    runs = (args.output_dir or ROOT / "runs" / "benchmarks" / config.name) / "runs"
    config_dir = args.config.resolve().parent
    teacher = prepare_teacher(config, config_dir)
    if teacher["t1"] is None:
        raise fail(f"{config.teacher_prepare}'s preparation has no T=1 eval; give its eval "
                   "section samples: N")
    print(f"teacher: T=1 {teacher['t1']:.3f} on {teacher['split']} (n={teacher['n']})",
          flush=True)
    record = (json.loads(record_path.read_text(encoding="utf-8"))
              if record_path.is_file() else {})
    entries = {e["n"]: e for e in record.get("runs", [])}
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    machine = machine_record()
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_one, str(args.config.resolve()), n, teacher["model_dir"],
                               str(runs.resolve())) for n in wanted]
        for future in futures:
            entry = future.result()
            entry["machine"] = machine  # Ns run in parts may run on other machines
            entry["gates"] = judge(entry, teacher["t1"], config.gates)
            entries[entry["n"]] = entry
            g = entry["gates"]
            print(f"N={entry['n']}: plateau {g['plateau']}, last step {g['last_step']}, "
                  f"margin {g['margin']}; plateau holds {g['plateau_holds']}, margin holds "
                  f"{g['margin_holds']} ({entry['wall_s']:.0f} s)", flush=True)
            ordered = [entries[n] for n in sorted(entries)]
            record = {"what": "the pilot of docs/distillbench.md version 3: per N, the "
                              "student's plateau on the teacher's own T=1 episodes of the "
                              "first N training prompts and the teacher's T=1 margin over it "
                              "(validation split); not a benchmark arm",
                      "config": args.config.resolve().relative_to(ROOT).as_posix()
                      if args.config.resolve().is_relative_to(ROOT) else str(args.config),
                      "config_commit": commit_of(args.config.resolve()),
                      "teacher": {k: v for k, v in teacher.items() if k != "model_dir"},
                      "gates": config.gates.model_dump(), "runs": ordered,
                      "choice": choose(ordered)}
            out_dir.mkdir(parents=True, exist_ok=True)
            record_path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    choice = record["choice"]
    print(f"choice: N={choice['n']} (passing: {choice['passing']}); wrote {record_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
