"""Does on-policy distillation pay where the literature says it should? The distillation benchmark.

    python benchmarks/distill_bench.py                 # both phases: the lr grid, then the report
    python benchmarks/distill_bench.py --phase grid    # the learning-rate grid alone
    python benchmarks/distill_bench.py --phase main    # the report's cells (after the grid)
    python benchmarks/distill_bench.py --resume        # continue an interrupted one
    python benchmarks/distill_bench.py --analyze-only  # re-read the kept runs

Runs ``benchmarks/distill/config.yaml`` (docs/distillbench.md) in two phases of
``miniverl benchmark`` cells, all from one warm student and one gated teacher:

- **before any cell**, the two preparations (cached): the warm student
  (``student_prepare``) and the teacher (``teacher.prepare``). The warm student's own
  final eval (greedy and ``eval.samples`` episodes per task at T=1 on the validation
  split) is the warm start's record; outside ``distill.warm_start`` no arm runs and the
  script exits 1 naming the figure and the fix. So do the plateau gate
  (``distill.plateau_tolerance``: the warm student's last two T=1 validation evaluations
  within it) and the margin gate (``distill.teacher_margin``: the teacher's T=1
  validation success at least that much above the warm student's last evaluation). The teacher's eval on the same split
  gives its success and its margin over the warm student (greedy and T=1).
- **grid** (``--phase grid``): every arm at each learning rate of ``distill.lr_grid``
  (arm ``<arm>-lr<i>``) on ``distill.grid_seed``, evaluated on the validation split
  (``distill.grid_split``); each arm's choice is the rate of its highest T=1 success
  after the budget (ties: the higher greedy success, then the lower rate).
- **main** (``--phase main``): every arm at the rate it chose, on every seed of the
  config, evaluated on the test split (``distill.main_split``).

Each cell is evaluated at every ``train.eval_every`` updates (greedy and T=1), and its
training wall clock at each evaluation is read from the run: the metrics rows' rollout,
teacher-wait and update seconds up to that update plus the fixed set's preparation
(``offline_targets_scored``, or SeqKD's ``teacher_set_played``), with the recorded cost
of any teacher episodes the cell read from its arm's shared cache instead of playing
them (one cell of an arm plays an episode, every cell that trains on it pays for it);
evaluation time is in none of them. The equal-update budget reads every arm at the same update counts; the
equal-wall-clock budget reads the same runs at ``distill.wall_clock_s`` (each arm's last
evaluation reached within that many training seconds). Per arm and reading: the mean
over seeds with a 95% bootstrap interval, the paired difference to the baseline (and to
each arm of ``distill.also_against`` or ``--also-against``) per seed with its interval
and the count of seeds above and below, the state coverage of the T=1 evaluation
episodes at every point (the share of their turn-start states no episode of the arm's
fixed-set source holds; an arm without one, OPD, against the oracle traces its warm
student learnt from; greedy's beside it), each cell's time split (rollout, teacher-wait,
update and preparation seconds) and every cell. ``--reread-record`` adds the pairs to a
committed analysis from the curves its cells hold, changing no figure it had.

Writes, in ``--output-dir`` (default ``runs/benchmarks/<config name>``, git-ignored):
``grid/`` and ``main/`` (each a benchmark folder: its derived ``config.yaml``,
``results.json``, ``report.html``, ``runs/``), ``targets/`` (the offline arms' targets
caches, shared by their seeds, rates and phases) and ``distill_bench.json`` (this
analysis). ``--update-committed`` writes the config's ``output_dir`` and
``benchmarks/results/distill_bench.json`` instead (another config:
``distill_bench_<suffix>.json``). ``--analyze-only`` without the kept runs (git-ignored)
says which are missing.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this file

from machine import machine_record  # noqa: E402
from real_model_learning import (  # noqa: E402
    benchmark_arguments,
    missing_runs,
    provenance,
    run_path,
)
from recovery_bench import seed_interval  # noqa: E402

from miniverl.common.rundir import RunDir  # noqa: E402
from miniverl.student.benchmark.config import merge_overrides  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmarks" / "distill" / "config.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "distill_bench.json"
PHASES = ("grid", "main")
START_EVALS = "start_evals.json"  # the prepared models' evals on each split (start_evals)
READINGS = ("greedy", "t1")  # greedy success; mean success at T=1 over eval.samples episodes


class GridSettings(BaseModel):
    """A learning-rate grid on one seed and split, then the report on another split: the
    fields every script benchmark here shares (this one's, several_bench.py's)."""

    model_config = ConfigDict(extra="forbid")

    lr_grid: list[float] = Field(min_length=1, max_length=10)
    grid_seed: int = Field(ge=0)
    grid_split: str = Field(pattern="^(eval|test)$")
    main_split: str = Field(pattern="^(eval|test)$")

    @model_validator(mode="after")
    def _grid(self) -> GridSettings:
        if self.grid_split == self.main_split:
            raise ValueError(f"grid_split and main_split are both {self.grid_split!r}: the "
                             "grid must be scored on a split the report does not use")
        if any(lr <= 0 for lr in self.lr_grid) or len(set(self.lr_grid)) != len(self.lr_grid):
            raise ValueError(f"lr_grid {self.lr_grid} must hold distinct positive rates")
        return self


class StartModel(BaseModel):
    """One model of a committed start (``distill.start``): its folder, relative to the
    config's, and the digest it was committed with (``model_dir_digest``)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)
    digest: str = Field(pattern="^sha256:[0-9a-f]{64}$")


class DistillSettings(GridSettings):
    """The ``distill:`` section of a distillation benchmark config."""

    warm_start: tuple[float, float]
    wall_clock_s: list[float] = Field(min_length=1)
    plateau_tolerance: float | None = Field(
        None, gt=0.0, le=1.0,
        description="the plateau gate: the warm student's last two T=1 validation "
                    "evaluations (its preparation's periodic evals) within this; null: off")
    teacher_margin: float | None = Field(
        None, gt=0.0, le=1.0,
        description="the margin gate: the teacher's T=1 validation success at least this "
                    "above the warm student's last evaluation; null: off")
    reach_arm: str | None = Field(
        None,
        description="an arm whose final T=1 success per seed every other arm is timed to "
                    "reach (training seconds plus what its data cost; version 3: rl); null: "
                    "not read")
    also_against: list[str] = Field(
        default_factory=list,
        description="arms the report also pairs every arm with, beside the baseline "
                    "(per seed, with intervals and the count of seeds above)")
    grid_extension_factor: float | None = Field(
        None, gt=1.0, le=100.0,
        description="the grid's extension rule (version 5): after the grid, each arm whose "
                    "choice is the lowest or highest rate it tried runs the next rate beyond "
                    "it (divided or multiplied by this), in folder grid_ext<k>, until every "
                    "choice is inside its grid; null: no extension")
    grid_extension_rounds: int = Field(
        4, ge=1, le=10, description="at most this many extensions (each choice still at "
                                    "an edge after them is reported at_edge)")
    lr_bounds: tuple[float, float] = Field(
        (1e-6, 1e-1), description="no extension goes below the first or above the second")
    charge_set: str = Field(
        "up_front", pattern="^(up_front|as_used)$",
        description="how a fixed set's preparation (the teacher's playing) is charged to "
                    "the training seconds: up_front, all of it from the first update on "
                    "(versions 1-4); as_used, at each update the share of its episodes "
                    "trained on by then (version 5: readings at equal seconds)")
    budget_s: float | None = Field(
        None, gt=0.0,
        description="the training seconds every arm must reach (the teacher's work "
                    "included: read_curve); each cell records whether it did, each arm "
                    "how many fell short, and the report reads every arm there; null: "
                    "the budget is updates only")

    start: dict[str, StartModel] | None = Field(
        None,
        description="a start committed as weights (version 5): 'warm' (the student at its "
                    "plateau) and 'teacher', each a prepared folder with its preparation "
                    "record, used as they are instead of preparing student_prepare and "
                    "teacher.prepare on this machine (one recipe prepares other models on "
                    "another machine); null: prepared here, cached")

    @model_validator(mode="after")
    def _consistent(self) -> DistillSettings:
        if self.start is not None and set(self.start) != {"warm", "teacher"}:
            raise ValueError(f"start names {sorted(self.start)}; give exactly 'warm' and "
                             "'teacher', each with its path and digest")
        low, high = self.warm_start
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"warm_start {list(self.warm_start)} must be [low, high] within "
                             "[0, 1]; give two shares, the lower first")
        return self


def fail(message: str) -> SystemExit:
    """A script error: one line, exit 1, no traceback."""
    return SystemExit(f"error: {message}")


def load_section_config(path: Path, section: str, model: type[BaseModel], what: str,
                        example: str) -> tuple[dict[str, Any], Any]:
    """A script's benchmark config: its own fields and its validated ``section:`` (one
    line and exit 1 for unreadable YAML, a missing section or a bad field; ``what`` and
    ``example`` name the benchmark and its committed config in those lines)."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise fail(f"{path} cannot be read as YAML ({type(exc).__name__}); pass the "
                   f"{what}'s config") from None
    if not isinstance(raw, dict) or section not in raw:
        raise fail(f"{path} has no {section}: section; pass a {what} config ({example})")
    raw = dict(raw)
    try:
        settings = model.model_validate(raw.pop(section))
    except ValidationError as exc:
        issues = "; ".join(f"{section}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                           for e in exc.errors())
        raise fail(f"{path}: {issues}") from None
    return raw, settings


def load_config(path: Path) -> tuple[dict[str, Any], DistillSettings]:
    """The benchmark config's own fields and its validated ``distill:`` section."""
    return load_section_config(path, "distill", DistillSettings, "distillation benchmark",
                               "benchmarks/distill/config.yaml")


def own_teacher_arms(raw: dict[str, Any], warm_dir: str) -> dict[str, Any]:
    """``raw`` with each arm that says ``teacher_from: warm`` given the warm student itself
    as its teacher (the field's control, version 5): its teacher section is the base
    recipe's with ``model.path`` at the warm student's prepared directory, no
    ``prepare`` and no ``min_success`` (the gate is for the teacher of the question). A
    SeqKD arm so made (``sft`` with ``train.fixed_set: teacher``) is continued SFT on the
    student's own samples of the drawn prompts; an OPD arm so made distils the student
    into its own start. The key is distill_bench's: the derived configs never hold it."""
    out = copy.deepcopy(raw)
    for arm in out["arms"]:
        source = arm.pop("teacher_from", None)
        if source is None:
            continue
        if source != "warm":
            raise fail(f"arm {arm['name']} has teacher_from {source!r}; the only source is "
                       "'warm' (the warm student as its own teacher), or leave it out")
        arm["overrides"] = merge_overrides(arm.get("overrides") or {}, {"teacher": {
            "model": {"path": str(warm_dir), "toy": None}, "prepare": None,
            "min_success": None}})
    return out


def _arm_overrides(arm: dict[str, Any], lr: float, split: str,
                   eval_every: int | None = None) -> dict[str, Any]:
    over: dict[str, Any] = {"train": {"lr": lr}, "eval": {"split": split}}
    if eval_every is not None:  # the grid reads the last evaluation only
        over["train"]["eval_every"] = eval_every
    seqkd = ((arm.get("overrides") or {}).get("train") or {}).get("fixed_set") == "teacher"
    if arm["mode"] == "offline_kd" or seqkd:
        # One cache per arm for every seed, rate and phase (a relative cache.dir is under
        # the phase folder): targets one cell scored, and teacher episodes one cell
        # played (charged to every cell that trains on them: preparation_s), are free
        # for the others.
        over["cache"] = {"dir": f"../targets/{arm['name']}"}
    return merge_overrides(arm.get("overrides") or {}, over)


def phase_config(raw: dict[str, Any], settings: DistillSettings, phase: str,
                 config_dir: Path, phase_dir: Path,
                 chosen: dict[str, float] | None = None) -> dict[str, Any]:
    """The ``miniverl benchmark`` config of one phase, its paths relative to
    ``phase_dir`` (where it is written)."""
    out = copy.deepcopy(raw)
    rel = Path(os.path.relpath(config_dir.resolve(), phase_dir.resolve()))
    out["recipe"] = (rel / raw["recipe"]).as_posix()
    if settings.start is not None:  # the cells read the committed start: none prepares
        out.pop("student_prepare", None)
    elif raw.get("student_prepare"):
        prep = student_prepare_path(raw, config_dir)
        out["student_prepare"] = (Path(os.path.relpath(prep.resolve(), phase_dir.resolve()))
                                  .as_posix())
    out["name"] = f"{raw['name']}-{phase}"[:24]
    out["output_dir"] = f"{raw.get('output_dir') or 'benchmarks/results/' + raw['name']}/{phase}"
    if phase == "grid":
        out["seeds"] = [settings.grid_seed]
        last = raw["budget"].get("updates")  # one evaluation, after the budget
        out["arms"] = [{**arm, "name": f"{arm['name']}-lr{i}",
                        "overrides": _arm_overrides(arm, lr, settings.grid_split, last)}
                       for arm in raw["arms"] for i, lr in enumerate(settings.lr_grid)]
        out["baseline"] = f"{raw['baseline']}-lr0"
    else:
        assert chosen is not None
        out["arms"] = [{**arm, "overrides": _arm_overrides(arm, chosen[arm["name"]],
                                                           settings.main_split)}
                       for arm in raw["arms"]]
    return out


# -- reading one cell -------------------------------------------------------------------


def preparation_s(events: list[dict[str, Any]]) -> float:
    """The fixed set's preparation inside the run: building (or playing) and up-front
    scoring (``offline_targets_scored``; its sampling time already holds the teacher's
    playing time), else SeqKD's playing (``teacher_set_played``); 0 when neither. Plus
    the recorded cost of the teacher episodes the run read from the arm's shared cache
    (``time_charged_s``): each arm pays for the generation it trains on, whichever cell
    played it first."""
    played = [e for e in events if e.get("event") == "teacher_set_played"]
    charged = sum(float(e.get("time_charged_s") or 0.0) for e in played)
    scored = [e for e in events if e.get("event") == "offline_targets_scored"]
    if scored:
        return charged + sum(float(e.get("time_sample_s") or 0.0)
                             + float(e.get("time_teacher_wait_s") or 0.0) for e in scored)
    return charged + sum(float(e.get("time_load_s") or 0.0) + float(e.get("time_play_s") or 0.0)
                         for e in played)


TIMES = ("rollout_s", "teacher_wait_s", "update_s")  # the metrics rows' time_<name> fields


def time_split(rows: list[dict[str, Any]], up_to: int | None = None) -> dict[str, float]:
    """Rollout, teacher-wait and update seconds summed over the metrics rows (those up to
    update ``up_to`` when given): where a cell's training seconds went."""
    kept = [r for r in rows if up_to is None or int(r.get("step") or 0) <= up_to]
    return {name: round(sum(float(r.get(f"time_{name}") or 0.0) for r in kept), 3)
            for name in TIMES}


def oracle_coverage(run_dir: Path, update: int, split: str | None) -> float | None:
    """T=1 state coverage of a run whose mode has no fixed-set source (OPD): the share of
    the turn-start states of its kept T=1 evaluation episodes at ``update`` that no
    oracle trace of the evaluated tasks holds, the reference of the demonstrations its
    warm student was trained on (and of update 0's figure). None without those files."""
    from transformers import AutoTokenizer

    from miniverl.common.modeling import resolve_model_dir
    from miniverl.common.recipe import load_recipe
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.common.trajectory import read_trajectories
    from miniverl.student.coverage import state_coverage
    from miniverl.student.environments import make_tasks
    from miniverl.student.rollout.oracle import oracle_trajectories

    run = RunDir(run_dir)
    kept = run.eval_dir / f"{split}-v{update}.sampled.trajectories.jsonl"
    resolved = run.path / "recipe.resolved.yaml"
    if split is None or not kept.is_file() or not resolved.is_file():
        return None
    recipe = load_recipe(resolved)
    env = recipe.environment
    episodes = read_trajectories(kept)
    wanted = list(dict.fromkeys(t.task_id for t in episodes))
    n = env.eval_tasks if split == "eval" else env.test_tasks
    tasks = [t for t in make_tasks(env.name, split, n, env.difficulty, env.split_seed,
                                   params=env.params) if t.id in set(wanted)]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(recipe.student.model, offline=True),
                                              local_files_only=True)
    reference = oracle_trajectories(env.name, tasks, tokenizer, fingerprint_tokenizer(tokenizer),
                                    env.params)
    return state_coverage(episodes, reference)["unseen_share"]


def set_share_used(run_dir: Path, events: list[dict[str, Any]], update: int) -> float:
    """The share of a run's fixed set (the teacher's episodes, ``teacher_set_played``)
    its first ``update`` updates trained on: ``update`` x the fixed-set episodes of a
    batch (``train.rollouts_per_cycle``, less the fresh part of
    ``train.on_policy_fraction``) over the episodes played, at most 1; 1 for a run
    without a set or a resolved recipe."""
    played = sum(int(e.get("episodes") or 0) for e in events
                 if e.get("event") == "teacher_set_played")
    resolved = Path(run_dir) / "recipe.resolved.yaml"
    if played <= 0 or not resolved.is_file():
        return 1.0
    from miniverl.student.train.modes.offline_kd import split

    train = (yaml.safe_load(resolved.read_text(encoding="utf-8")) or {}).get("train") or {}
    n = int(train.get("rollouts_per_cycle") or 0)
    fraction = train.get("on_policy_fraction")
    per_update = split(n, float(fraction))[1] if fraction is not None else n
    return min(1.0, update * per_update / played)


def read_curve(run_dir: Path, start: dict[str, Any] | None = None,
               charge_set: str = "up_front") -> list[dict[str, Any]]:
    """Every evaluation of a run, by update: greedy and T=1 success, the unseen-state
    share of the T=1 episodes (``unseen_states``; greedy's beside it), the training
    seconds spent up to that update (the fixed set's preparation, then rollout + teacher
    wait + update of each metrics row; evaluation time in none) and their split. A
    version evaluated twice keeps its last. A run that did not evaluate its start
    (``eval.before: false``) starts from ``start``, the warm student's eval on the same
    split (:func:`start_evals`), at 0 s. An arm without a fixed-set source (OPD) has its
    T=1 coverage read against the oracle traces (:func:`oracle_coverage`).
    ``charge_set``: ``up_front`` (versions 1-4) charges the whole preparation from the
    first update on; ``as_used`` (version 5) charges, at each update, the share of the
    teacher's episodes trained on by then (:func:`set_share_used`): what a teacher that
    played each episode when it was needed would have cost by then."""
    run = RunDir(run_dir)
    events, rows = run.read_jsonl("events.jsonl"), run.read_jsonl("metrics.jsonl")
    prep = preparation_s(events)
    evals: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "eval":
            evals[int(e["version"])] = e
    curve = []
    if 0 not in evals and start is not None:
        curve.append({"update": 0, "train_s": 0.0, "greedy": start.get("greedy"),
                      "t1": start.get("t1"), "unseen_states": start.get("unseen_states"),
                      "unseen_states_greedy": start.get("unseen_states_greedy"),
                      "n": start.get("n"), "start": "warm student, measured once"})
    for update in sorted(evals):
        e = evals[update]
        split = time_split(rows, update)
        sampled = e.get("sampled") or {}
        unseen = (sampled.get("coverage") or {}).get("unseen_share")
        if unseen is None and sampled and e.get("coverage") is None:
            unseen = oracle_coverage(run_dir, update, e.get("split"))
        charged = prep if update > 0 else 0.0
        if charge_set == "as_used" and update > 0:
            charged = prep * set_share_used(run_dir, events, update)
        curve.append({
            "update": update,
            "train_s": round(charged + sum(split.values()), 3),
            "greedy": e.get("success"),
            "t1": sampled.get("success"),
            "unseen_states": unseen,
            "unseen_states_greedy": (e.get("coverage") or {}).get("unseen_share"),
            "time_split": {**split, "preparation_s": round(charged, 3)},
            "n": e.get("n"),
        })
    return curve


def at_update(curve: list[dict[str, Any]], update: int) -> dict[str, Any] | None:
    """The evaluation made at ``update`` (None if the run has none there)."""
    return next((p for p in curve if p["update"] == update), None)


def at_seconds(curve: list[dict[str, Any]], seconds: float) -> dict[str, Any] | None:
    """The last evaluation the run had reached within ``seconds`` of training."""
    reached = [p for p in curve if p["train_s"] <= seconds]
    return reached[-1] if reached else None


def analyze_cell(cell: dict[str, Any], results_dir: Path,
                 start: dict[str, Any] | None = None,
                 charge_set: str = "up_front",
                 kept: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """One cell's readings from its run folder; a folder that is gone (run folders are
    git-ignored: an earlier part on another clone) is read from ``kept``, the readings
    the committed analysis holds for that run (:func:`kept_cells`)."""
    result = cell["result"]
    out = {"arm": cell["arm"], "seed": cell["seed"], "status": result["status"],
           **{k: result.get(k) for k in ("error", "updates", "wall_s", "run_dir")}}
    if out["status"] != "ok" or not out["run_dir"]:
        return out
    run_dir = run_path(results_dir, out["run_dir"])
    if kept and not run_dir.is_dir() and out["run_dir"] in kept:
        return {**kept[out["run_dir"]], **out}
    out["curve"] = read_curve(run_dir, start, charge_set)
    out["preparation_s"] = round(preparation_s(RunDir(run_dir).read_jsonl("events.jsonl")), 3)
    out["training_s"] = out["curve"][-1]["train_s"] if out["curve"] else None
    out["time_split"] = {**time_split(RunDir(run_dir).read_jsonl("metrics.jsonl")),
                         "preparation_s": out["preparation_s"]}
    out["signal"] = training_signal(RunDir(run_dir).read_jsonl("metrics.jsonl"),
                                    run_clip(run_dir))
    return out


def run_clip(run_dir: Path) -> float | None:
    """The run's ``train.max_grad_norm``, from its resolved recipe (None without one)."""
    resolved = Path(run_dir) / "recipe.resolved.yaml"
    if not resolved.is_file():
        return None
    data = yaml.safe_load(resolved.read_text(encoding="utf-8")) or {}
    clip = (data.get("train") or {}).get("max_grad_norm")
    return float(clip) if clip is not None else None


def training_signal(rows: list[dict[str, Any]], clip: float | None = None) -> dict[str, Any]:
    """What the updates had to learn from, from a run's metrics rows: the share of its
    updates whose own training episodes all succeeded (``all_right_share``: RL's group
    advantages are then 0, and a student matching its teacher there gets ~0 from OPD;
    None for an arm that plays no episode of its own, SFT), the mean training success,
    and the median absolute loss and gradient norm (``grad_norm`` is the norm before the
    clip). With the run's ``clip`` (``train.max_grad_norm``): ``clip_binding_share``, the
    share of updates whose gradient norm before the clip exceeded it (the clip rescaled
    them), and the median norm after it (``grad_norm_after_median``)."""
    train = [r for r in rows if r.get("phase", "train") == "train"]
    played = [r["train_success"] for r in train if r.get("train_success") is not None]
    losses = [abs(r["loss"]) for r in train if r.get("loss") is not None]
    norms = [r["grad_norm"] for r in train if r.get("grad_norm") is not None]
    out = {
        "updates": len(train),
        "all_right_share": (sum(v == 1.0 for v in played) / len(played)) if played else None,
        "train_success": float(np.mean(played)) if played else None,
        "abs_loss_median": float(np.median(losses)) if losses else None,
        "grad_norm_median": float(np.median(norms)) if norms else None,
    }
    if clip is not None:
        out["clip"] = clip
        out["clip_binding_share"] = (sum(n > clip for n in norms) / len(norms)) if norms else None
        out["grad_norm_after_median"] = (float(np.median([min(n, clip) for n in norms]))
                                         if norms else None)
    return out


# -- the warm start and the teacher -----------------------------------------------------


def check_warm_start(record: dict[str, Any], band: tuple[float, float], prep: str) -> float:
    """The warm student's T=1 success from its preparation record; SystemExit (one line
    naming the figure and the fix) when it lies outside ``band``."""
    evaluation = record.get("eval") or {}
    t1 = (evaluation.get("sampled") or {}).get("success")
    if t1 is None:
        raise fail(f"{prep}'s record has no T=1 eval (eval.samples unset); give its eval "
                   "section samples: N so the warm start can be measured")
    low, high = band
    if not low <= t1 <= high:
        raise fail(
            f"the warm student's T=1 success is {t1:.3f} on {evaluation.get('split')} "
            f"(n={evaluation.get('n')}, {record.get('steps')} SFT steps of {prep}), outside "
            f"the preregistered [{low:g}, {high:g}]; change {prep}'s train.cycles in a new "
            "commit before any result (fewer steps if above, more if below)")
    return float(t1)


def check_gates(warm: dict[str, Any], teacher: dict[str, Any] | None,
                settings: DistillSettings, prep: str) -> dict[str, float]:
    """The plateau and margin gates (``student/benchmark/gates.py``) on the preparations'
    records, those the settings turn on; SystemExit (one line naming the figure, the rule
    and the fix) when one fails. Their figures, for the analysis's ``start``."""
    from miniverl.common.errors import ConfigError
    from miniverl.student.benchmark.gates import margin_gate, plateau_gate

    curve = warm.get("evals") or []
    out: dict[str, float] = {}
    try:
        if settings.plateau_tolerance is not None:
            out["plateau"] = plateau_gate(curve, settings.plateau_tolerance,
                                          f"the warm student ({prep})")
        if settings.teacher_margin is not None:
            scored = [p for p in curve if p.get("t1") is not None]
            level = out.get("plateau", scored[-1]["t1"] if scored else None)
            t1 = (((teacher or {}).get("eval") or {}).get("sampled") or {}).get("success")
            if level is None:
                raise ConfigError(f"the warm student ({prep}) has no T=1 validation "
                                  "evaluation; give its train.eval_every and eval.samples")
            out["margin"] = margin_gate(t1, level, settings.teacher_margin, "the teacher")
    except ConfigError as exc:
        raise fail(str(exc)) from None
    return out


def _prepare(prep: str, model: dict[str, Any], what: str, model_field: str) -> dict[str, Any]:
    """One preparation's record (trained now or found cached); run in its own process."""
    from miniverl.common.recipe_models import ModelSource
    from miniverl.student.teacher_prep import prepare_model

    prepared = prepare_model(prep, ModelSource.model_validate(model), what=what,
                             model_field=model_field, show_progress=False)
    return {**prepared.record, "model_dir": str(prepared.model_dir)}


def prepared_records(raw: dict[str, Any], config_dir: Path) -> tuple[dict, dict | None]:
    """The warm student's and the teacher's preparation records (each prepared, or
    found cached, now), as the cells will use them: the student of the base recipe,
    the teacher of the first arm that needs one (its overrides applied). The two
    preparations train side by side, one process (and one thread) each."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from miniverl.common.errors import ConfigError
    from miniverl.common.recipe import TEACHER_MODES

    recipe_path = config_dir / raw["recipe"]
    base = yaml.safe_load(recipe_path.read_text(encoding="utf-8"))
    warm_prep = student_prepare_path(raw, config_dir)
    jobs = {"warm": (str(warm_prep), base["student"]["model"],
                     "student_prepare", "the base recipe's model")}
    for arm in raw["arms"]:
        recipe = merge_overrides(base, arm.get("overrides") or {})
        section = recipe.get("teacher") or {}
        seqkd = (recipe.get("train") or {}).get("fixed_set") == "teacher"
        if (arm["mode"] in TEACHER_MODES or seqkd) and section.get("prepare"):
            jobs["teacher"] = (str(recipe_path.parent / section["prepare"]), section["model"],
                               "teacher.prepare", "teacher.model")
            break
    print(f"preparing (or finding cached): {', '.join(jobs)}", flush=True)
    seqkd_warm = on_teacher_samples(config_dir / raw["student_prepare"])
    with ProcessPoolExecutor(max_workers=len(jobs), mp_context=get_context("spawn")) as pool:
        try:
            if seqkd_warm is not None:
                # The user's data is the teacher's own episodes: the teacher first, then
                # the student on what it plays (student_prepare_path names its dir).
                if "teacher" not in jobs:
                    raise fail(f"{raw['student_prepare']} trains on a prepared teacher's "
                               "episodes, and no arm of the config names a teacher with "
                               "teacher.prepare; give the base recipe that teacher")
                teacher = pool.submit(_prepare, *jobs.pop("teacher")).result()
                resolve_student_prepare(raw, config_dir, teacher["model_dir"])
                records = {"teacher": teacher, "warm": pool.submit(_prepare, *jobs["warm"]).result()}
            else:
                futures = {name: pool.submit(_prepare, *job) for name, job in jobs.items()}
                records = {name: f.result() for name, f in futures.items()}
        except ConfigError as exc:
            raise fail(str(exc)) from None
    return records["warm"], records.get("teacher")


PREPARED_RECORD = "miniverl_prepared.json"  # student/teacher_prep.py's record in its folder


def committed_start(settings: DistillSettings, config_dir: Path) -> tuple[dict, dict]:
    """The warm student's and the teacher's preparation records from the folders
    ``distill.start`` commits, as :func:`prepared_records` gives them (``model_dir``
    absolute); SystemExit (one line naming the folder, the rule and the fix) when a folder
    is missing, holds no weights or record, or is not the digest the config committed."""
    from miniverl.common.qualification import model_dir_digest

    assert settings.start is not None
    records = {}
    for name in ("warm", "teacher"):
        entry = settings.start[name]
        folder = (config_dir / entry.path).resolve()
        record = folder / PREPARED_RECORD
        if not any(folder.glob("*.safetensors")) or not record.is_file():
            raise fail(f"distill.start.{name}.path {entry.path} ({folder}) holds no "
                       f".safetensors weights and {PREPARED_RECORD}; a committed start is a "
                       "prepared model's folder: check out the commit that holds it")
        digest = model_dir_digest(folder)
        if digest != entry.digest:
            raise fail(f"distill.start.{name}.path {entry.path} has digest {digest}, not the "
                       f"{entry.digest} the config committed; restore the folder from git "
                       "(git checkout -- it), or preregister a new start in a new commit")
        records[name] = {**json.loads(record.read_text(encoding="utf-8")),
                         "model_dir": str(folder)}
    return records["warm"], records["teacher"]


def start_ref(raw: dict[str, Any], settings: DistillSettings, config_dir: Path,
              name: str) -> str:
    """``distill.start``'s folder ``name`` relative to the base recipe's folder, as a
    cell's recipe names it (the same on every clone: the derived configs, their digest
    and a resumed run's check stay one)."""
    assert settings.start is not None
    recipe_dir = (config_dir / raw["recipe"]).resolve().parent
    folder = (config_dir / settings.start[name].path).resolve()
    return Path(os.path.relpath(folder, recipe_dir)).as_posix()


def start_arms(raw: dict[str, Any], settings: DistillSettings, config_dir: Path) -> dict[str, Any]:
    """``raw`` with every arm's student at the committed warm student and every arm's
    teacher at the committed teacher (``prepare`` dropped), paths relative to the base
    recipe's folder, from which the cells resolve them; an arm without a teacher
    (``teacher: null``) keeps none. Without ``distill.start``, ``raw`` unchanged."""
    if settings.start is None:
        return raw
    out = copy.deepcopy(raw)
    warm, teacher = (start_ref(raw, settings, config_dir, n) for n in ("warm", "teacher"))
    for arm in out["arms"]:
        over: dict[str, Any] = {"student": {"model": {"path": warm, "toy": None}}}
        if (arm.get("overrides") or {}).get("teacher", {}) is not None:
            over["teacher"] = {"model": {"path": teacher, "toy": None}, "prepare": None}
        arm["overrides"] = merge_overrides(arm.get("overrides") or {}, over)
    return out


def on_teacher_samples(prep: Path) -> dict[str, Any] | None:
    """The student preparation's teacher section when it trains on the teacher's own
    episodes (``train.fixed_set: teacher`` with a ``teacher.prepare``: version 3's user
    data), else None."""
    data = yaml.safe_load(prep.read_text(encoding="utf-8"))
    teacher = data.get("teacher") or {}
    if (data.get("train") or {}).get("fixed_set") == "teacher" and teacher.get("prepare"):
        return teacher
    return None


def student_prepare_path(raw: dict[str, Any], config_dir: Path) -> Path:
    """The recipe the student is prepared from: the config's ``student_prepare``, or, when
    that plays the prepared teacher's episodes, its copy naming the teacher's prepared
    directory (``resolve_student_prepare``; git-ignored, under runs/benchmarks/)."""
    prep = config_dir / raw["student_prepare"]
    if on_teacher_samples(prep) is None:
        return prep
    return ROOT / "runs" / "benchmarks" / raw["name"] / f"{prep.stem}.resolved.yaml"


def resolve_student_prepare(raw: dict[str, Any], config_dir: Path, teacher_dir: str) -> Path:
    """Write the student preparation with ``teacher.model.path`` at the prepared teacher
    (``teacher.prepare`` dropped: the student process plays that teacher's episodes
    itself, and refuses a teacher it would have to prepare)."""
    prep = config_dir / raw["student_prepare"]
    data = yaml.safe_load(prep.read_text(encoding="utf-8"))
    data["teacher"] = {**{k: v for k, v in data["teacher"].items() if k != "prepare"},
                       "model": {"path": str(teacher_dir)}}
    out = student_prepare_path(raw, config_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = (f"# {prep.name} with its teacher's prepared directory, written by "
            "benchmarks/distill_bench.py; do not edit\n" + yaml.safe_dump(data, sort_keys=False))
    if not out.is_file() or out.read_text(encoding="utf-8") != text:
        out.write_text(text, encoding="utf-8")
    return out


def eval_recipe(base: dict[str, Any], split: str, model_dir: str) -> Any:
    """A cell's recipe ``base`` as an evaluation of ``model_dir`` on ``split``: no teacher,
    no loss, no routes, and none of the data settings a trainer needs (a teacher's fixed
    set goes with the teacher; an on-policy arm's ``rollout.group_size`` and ``dpo``
    section with the training episodes they shape: an evaluation plays ``eval.samples``
    per task whatever arm it is derived from)."""
    from miniverl.common.recipe import Recipe

    data = copy.deepcopy(base)
    for section in ("teacher", "teachers", "loss", "dpo"):
        data.pop(section, None)
    data["run"] = {**data["run"], "mode": "sft", "seed": 0}
    data["rollout"] = {k: v for k, v in (data.get("rollout") or {}).items() if k != "group_size"}
    data["student"] = {**data["student"], "model": {"path": model_dir}}
    if data.get("environments"):
        data["environments"] = [{k: v for k, v in m.items() if k not in ("teacher", "adapter")}
                                for m in data["environments"]]
    data["eval"] = {**data["eval"], "split": split}
    data["train"] = {k: v for k, v in data["train"].items()
                     if k not in ("pipelining", "max_lag", "fixed_set", "score_fixed_set",
                                  "on_policy_fraction")}
    return Recipe.model_validate(data)


def evaluate_dir(recipe: Any, model_dir: str,
                 adapter: str | None = None) -> tuple[dict[str, Any], float]:
    """``recipe``'s evaluation of the model in ``model_dir`` (``adapter``: a PEFT adapter
    merged into it), on one thread; its summary and seconds."""
    import torch
    from transformers import AutoTokenizer

    from miniverl.common.modeling import load_causal_lm
    from miniverl.student.eval import evaluate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = load_causal_lm(model_dir, dtype="float32", device="cpu")
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        t0 = time.perf_counter()
        with torch.no_grad():
            summary = evaluate(model, tokenizer, recipe, policy_version=0).to_dict()
    finally:
        torch.set_num_threads(threads)
    return summary, time.perf_counter() - t0


def start_evals(raw: dict[str, Any], config_dir: Path, models: dict[str, str], split: str,
                cache: Path) -> dict[str, Any]:
    """Each prepared model's eval on ``split`` (greedy and ``eval.samples`` at T=1), made
    once with the base recipe's rollout and eval settings and kept in ``cache``: every
    cell starts from the warm student (``eval.before: false`` in the cells), so this is
    every cell's update 0, and the teacher's row is its margin on the same tasks."""
    known = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else {}
    # The baseline arm's recipe: its environment, rollout and eval are every cell's.
    arm = next(a for a in raw["arms"] if a["name"] == raw["baseline"])
    base = merge_overrides(yaml.safe_load((config_dir / raw["recipe"]).read_text(encoding="utf-8")),
                           arm.get("overrides") or {})
    for name, model_dir in models.items():
        key = f"{name}:{split}"
        if known.get(key, {}).get("model") == Path(model_dir).name:
            continue
        summary, seconds = evaluate_dir(eval_recipe(base, split, model_dir), model_dir)
        known[key] = {"model": Path(model_dir).name, "split": split, "eval_s": seconds,
                      "greedy": summary.get("success"), "n": summary.get("n"),
                      "t1": (summary.get("sampled") or {}).get("success"),
                      "unseen_states": ((summary.get("sampled") or {}).get("coverage")
                                        or {}).get("unseen_share"),
                      "unseen_states_greedy": (summary.get("coverage") or {}).get("unseen_share")}
        print(f"{name} on {split}: greedy {known[key]['greedy']}, T=1 {known[key]['t1']} "
              f"({known[key]['eval_s']:.0f} s)", flush=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known, indent=2) + "\n", encoding="utf-8")
    return {name: known[f"{name}:{split}"] for name in models}


def start_summary(warm: dict[str, Any], teacher: dict[str, Any] | None,
                  band: tuple[float, float]) -> dict[str, Any]:
    """The warm start and the teacher as measured by their preparations' evals."""
    def figures(record: dict[str, Any] | None) -> dict[str, Any] | None:
        if record is None:
            return None
        evaluation = record.get("eval") or {}
        return {"greedy": evaluation.get("success"),
                "t1": (evaluation.get("sampled") or {}).get("success"),
                "split": evaluation.get("split"), "n": evaluation.get("n"),
                "steps": record.get("steps"),
                "prep_recipe": (Path(os.path.relpath(Path(record["prep_recipe"]).resolve(), ROOT))
                                .as_posix() if record.get("prep_recipe") else None),
                "prep_wall_s": record.get("wall_s")}

    w, t = figures(warm), figures(teacher)
    margin = None
    if t is not None:
        margin = {k: (t[k] - w[k] if t[k] is not None and w[k] is not None else None)
                  for k in READINGS}
    inside = w["t1"] is not None and band[0] <= w["t1"] <= band[1]
    return {"warm_student": {**w, "band": list(band), "in_band": inside},
            "teacher": t, "teacher_margin": margin}


# -- the grid's choice and the comparison -----------------------------------------------


def choose_rates(cells: list[dict[str, Any]], arms: list[str],
                 grid: list[float] | dict[str, list[float]], seconds: float | None = None
                 ) -> tuple[dict[str, float], dict[str, Any]]:
    """Each arm's rate: the highest T=1 success after the budget, ties to the higher
    greedy success, then the lower rate; and the whole grid as read. ``grid`` is every
    arm's rates, or each arm's own (the config's grid and its extensions,
    :func:`grid_extension`): cell ``<arm>-lr<i>`` ran the arm's ``i``-th rate. Each
    arm's row says whether its choice is the lowest or highest rate it tried
    (``at_edge``: ``low``, ``high`` or None, inside; one rate: ``both``). With
    ``seconds`` (a seconds budget, ``distill.budget_s``) each cell is read at its last
    evaluation within that many training seconds instead of its last."""
    chosen, table = {}, {}
    for arm in arms:
        rates = grid[arm] if isinstance(grid, dict) else grid
        rows = []
        for i, lr in enumerate(rates):
            cell = next((c for c in cells if c["arm"] == f"{arm}-lr{i}"), None)
            last = ((at_seconds(cell["curve"], seconds) if seconds is not None
                     else cell["curve"][-1]) if cell and cell.get("curve") else None)
            rows.append({"lr": lr, "status": cell["status"] if cell else "missing",
                         "t1": last["t1"] if last else None,
                         "greedy": last["greedy"] if last else None,
                         "update": last["update"] if last else None,
                         # a mixture's curve (several_bench.py) reads each domain too
                         **({"domains": last["domains"]} if last and "domains" in last
                            else {})})
        scored = [r for r in rows if r["t1"] is not None]
        if len(scored) != len(rows):
            raise fail(f"the grid of arm {arm} is incomplete ({[r['status'] for r in rows]}); "
                       "run --phase grid --resume until every cell is ok")
        best = max(scored, key=lambda r: (r["t1"], r["greedy"] or 0.0, -r["lr"]))
        chosen[arm] = best["lr"]
        low, high = best["lr"] == min(rates), best["lr"] == max(rates)
        edge = "both" if low and high else "low" if low else "high" if high else None
        table[arm] = {"chosen_lr": best["lr"], "grid": rows, "at_edge": edge}
    return chosen, table


def extension_dirs(out_dir: Path) -> list[Path]:
    """The grid's extension folders (``grid_ext1``, ``grid_ext2``, ...) that hold
    results, in the order they ran."""
    found = [d for d in Path(out_dir).glob("grid_ext*") if d.name[8:].isdigit()
             and (d / "results.json").is_file()]
    return sorted(found, key=lambda d: int(d.name[8:]))


def arm_rates(out_dir: Path, names: list[str], lr_grid: list[float]) -> dict[str, list[float]]:
    """Each arm's rates in the order its grid cells ran: the config's ``lr_grid``, then
    each extension's (read from the folder's derived config: cell ``<arm>-lr<i>`` ran
    the arm's ``i``-th rate)."""
    rates = {name: list(lr_grid) for name in names}
    for folder in extension_dirs(out_dir):
        data = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
        for arm in data["arms"]:
            name, _, index = arm["name"].rpartition("-lr")
            if name in rates and int(index) == len(rates[name]):
                rates[name].append(float(arm["overrides"]["train"]["lr"]))
    return rates


def kept_cells(output: Path) -> dict[str, dict[str, Any]]:
    """The readings an analysis at ``output`` holds, by run folder: what a run in parts
    reads of an earlier part's cells whose git-ignored run folders this clone lacks."""
    previous = json.loads(output.read_text(encoding="utf-8")) if output.is_file() else {}
    return {c["run_dir"]: c for p in PHASES for c in (previous.get(p) or {}).get("cells", [])
            if c.get("run_dir") and c.get("curve") is not None}


def grid_cells(out_dir: Path, split: str, charge_set: str = "up_front",
               kept: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every grid cell: the grid folder's and its extensions', each curve starting from
    the warm student's evaluation on ``split`` (:func:`start_evals`; a cell read at a
    seconds budget before its first evaluation stands there; ``kept``: see
    :func:`analyze_cell`)."""
    starts = Path(out_dir) / START_EVALS
    known = json.loads(starts.read_text(encoding="utf-8")) if starts.is_file() else {}
    cells = []
    for folder in [Path(out_dir) / "grid", *extension_dirs(out_dir)]:
        data = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        cells += [analyze_cell(c, folder, known.get(f"warm:{split}"), charge_set, kept)
                  for c in data["cells"]]
    return cells


def extension_config(raw: dict[str, Any], settings: DistillSettings, config_dir: Path,
                     phase_dir: Path, new: dict[str, tuple[int, float]]) -> dict[str, Any]:
    """The grid phase's config for one extension: only the arms of ``new``
    (arm -> (its rate's index, the rate)), each at its new rate."""
    out = phase_config(raw, settings, "grid", config_dir, phase_dir)
    last = raw["budget"].get("updates")
    out["name"] = f"{raw['name']}-{phase_dir.name}"[:24]
    out["output_dir"] = out["output_dir"].rpartition("/")[0] + f"/{phase_dir.name}"
    out["arms"] = [{**arm, "name": f"{arm['name']}-lr{new[arm['name']][0]}",
                    "overrides": _arm_overrides(arm, new[arm["name"]][1], settings.grid_split,
                                                last)}
                   for arm in raw["arms"] if arm["name"] in new]
    out["baseline"] = out["arms"][0]["name"]
    return out


def grid_extension(table: dict[str, Any], factor: float,
                   bounds: tuple[float, float]) -> dict[str, float]:
    """The grid's extension rule: each arm whose choice is an edge of the rates it tried
    gets the next rate beyond that edge (the edge times ``factor`` above, divided by it
    below; one rate tried: both ways, the lower first), unless that rate leaves
    ``bounds`` (then the arm's choice stays at the edge, reported as such). Repeated
    after each extension's cells until no arm's choice is at an edge: each choice is then
    inside its grid, a rate on either side of it tried and worse."""
    out: dict[str, float] = {}
    for arm, row in table.items():
        edge, lr = row.get("at_edge"), row["chosen_lr"]
        tried = {r["lr"] for r in row["grid"]}
        for side in (("low",) if edge == "low" else ("high",) if edge == "high"
                     else ("low", "high") if edge == "both" else ()):
            new = lr / factor if side == "low" else lr * factor
            if bounds[0] <= new <= bounds[1] and not any(abs(new - t) <= 1e-12 * new
                                                         for t in tried):
                out[arm] = new
                break
    return out


def _interval(values: list[float], rng: np.random.Generator) -> dict[str, float] | None:
    if not values:
        return None
    mean, low, high = seed_interval(values, rng)
    return {"mean": mean, "low": low, "high": high, "n": len(values)}


def compare(cells: list[dict[str, Any]], baseline: str, updates: list[int],
            seconds: list[float], rng: np.random.Generator) -> dict[str, Any]:
    """Per arm, both budgets and both readings: the mean over seeds [95% bootstrap] and
    the paired difference to ``baseline`` per seed [95% bootstrap]; the final state
    coverage; the mean training seconds."""
    ok = [c for c in cells if c.get("curve")]
    readings = {**{f"updates={u}": (lambda curve, u=u: at_update(curve, u)) for u in updates},
                **{f"seconds={s:g}": (lambda curve, s=s: at_seconds(curve, s)) for s in seconds}}
    base = {c["seed"]: c for c in ok if c["arm"] == baseline}
    arms: dict[str, Any] = {}
    for arm in dict.fromkeys(c["arm"] for c in cells):
        mine = [c for c in ok if c["arm"] == arm]
        entry: dict[str, Any] = {"cells": sum(c["arm"] == arm for c in cells), "ok": len(mine)}
        for label, read in readings.items():
            block: dict[str, Any] = {}
            points = {c["seed"]: read(c["curve"]) for c in mine}
            block["updates_reached"] = {str(s): (p["update"] if p else None)
                                        for s, p in points.items()}
            for kind in READINGS:
                values = [p[kind] for p in points.values() if p and p[kind] is not None]
                block[kind] = _interval(values, rng)
                if arm == baseline:
                    continue
                diffs = []
                for seed, p in points.items():
                    other = read(base[seed]["curve"]) if seed in base else None
                    if p and other and p[kind] is not None and other[kind] is not None:
                        diffs.append(p[kind] - other[kind])
                block[f"{kind}_vs_{baseline}"] = _interval(diffs, rng)
            entry[label] = block
        finals = [c["curve"][-1] for c in mine]
        entry["unseen_states_final"] = _interval(
            [p["unseen_states"] for p in finals if p["unseen_states"] is not None], rng)
        greedy_cov = [p.get("unseen_states_greedy") for p in finals]
        if any(v is not None for v in greedy_cov):  # records before T=1 coverage hold none
            entry["unseen_states_greedy_final"] = _interval(
                [v for v in greedy_cov if v is not None], rng)
        splits = [c["time_split"] for c in mine if c.get("time_split")]
        if splits:
            entry["mean_time_split"] = {k: float(np.mean([t[k] for t in splits]))
                                        for k in splits[0]}
        signals = [c["signal"] for c in mine if c.get("signal")]
        if signals:  # records before the signal reading hold none
            entry["mean_signal"] = {
                k: (float(np.mean([g[k] for g in signals if g.get(k) is not None]))
                    if any(g.get(k) is not None for g in signals) else None)
                for k in ("all_right_share", "train_success", "abs_loss_median",
                          "grad_norm_median", "clip_binding_share", "grad_norm_after_median")
                if any(k in g for g in signals)}
        entry["mean_training_s"] = (float(np.mean([c["training_s"] for c in mine]))
                                    if mine else None)
        entry["mean_preparation_s"] = (float(np.mean([c["preparation_s"] for c in mine]))
                                       if mine else None)
        entry["mean_wall_s"] = (float(np.mean([c["wall_s"] for c in mine if c["wall_s"]]))
                                if mine else None)
        arms[arm] = entry
    return arms


def _reader(label: str):
    kind, _, value = label.partition("=")
    if kind == "updates":
        return lambda curve: at_update(curve, int(value))
    return lambda curve: at_seconds(curve, float(value))


def add_comparisons(block: dict[str, Any], baseline: str, against: list[str],
                    seed: int = 1) -> dict[str, Any]:
    """Pair every arm of a phase with each arm of ``against`` too, read from its cells'
    curves: per reading and evaluation ``<kind>_vs_<other>`` (the mean paired difference
    over seeds [95% bootstrap], each seed's difference, how many seeds are above and
    below). The baseline's existing pairs gain the per-seed figures and counts, their
    intervals untouched; the new intervals draw from their own generator (``seed``), so
    adding a comparison changes no figure a record already holds."""
    rng = np.random.default_rng(seed)
    cells = [c for c in block["cells"] if c.get("curve")]
    for other in [baseline, *against]:
        theirs = {c["seed"]: c for c in cells if c["arm"] == other}
        if not theirs:  # a part run that has not reached that arm yet
            continue
        for arm, entry in block["arms"].items():
            if arm == other:
                continue
            mine = {c["seed"]: c for c in cells if c["arm"] == arm}
            for label in [k for k in entry if k.startswith(("updates=", "seconds="))]:
                read = _reader(label)
                for kind in READINGS:
                    per_seed = {}
                    for s, cell in mine.items():
                        a = read(cell["curve"])
                        b = read(theirs[s]["curve"]) if s in theirs else None
                        if a and b and a[kind] is not None and b[kind] is not None:
                            per_seed[str(s)] = a[kind] - b[kind]
                    key = f"{kind}_vs_{other}"
                    pair = entry[label].get(key) if other == baseline else None
                    if pair is None:
                        pair = _interval(list(per_seed.values()), rng)
                    if pair is None:
                        continue
                    entry[label][key] = {**pair, "per_seed": per_seed,
                                         "above": sum(d > 0 for d in per_seed.values()),
                                         "below": sum(d < 0 for d in per_seed.values())}
    block["also_against"] = list(against)
    return block


def add_gap_closed(block: dict[str, Any], start: dict[str, Any] | None,
                   teacher: dict[str, Any] | None) -> None:
    """Per arm, reading and evaluation, ``<kind>_gap_closed``: the share of the gap from
    the student's start (its plateau) to the teacher, on the report's split, that the
    arm's mean closes: (arm - start) / (teacher - start); None without a gap."""
    if not start or not teacher:
        return
    for entry in block["arms"].values():
        for label in [k for k in entry if k.startswith(("updates=", "seconds="))]:
            for kind in READINGS:
                low, high = start.get(kind), teacher.get(kind)
                mean = (entry[label].get(kind) or {}).get("mean")
                gap = None if low is None or high is None else high - low
                entry[label][f"{kind}_gap_closed"] = (
                    (mean - low) / gap if mean is not None and gap else None)
    block["gap"] = {"start": {k: start.get(k) for k in READINGS},
                    "teacher": {k: teacher.get(k) for k in READINGS}}


def add_half_gap_seconds(block: dict[str, Any], start: dict[str, Any] | None,
                         teacher: dict[str, Any] | None) -> None:
    """Per arm, ``half_gap_s``: for each seed, the training seconds (the teacher's work
    included, :func:`read_curve`) at the cell's first evaluation whose T=1 success closes
    half the gap from the student's start to the teacher on the report's split
    (start + (teacher - start) / 2 or more); None where it never did; the count that did
    and the mean over those. Nothing without a gap."""
    if not start or not teacher or start.get("t1") is None or teacher.get("t1") is None:
        return
    goal = start["t1"] + (teacher["t1"] - start["t1"]) / 2.0
    if teacher["t1"] <= start["t1"]:
        return
    cells = [c for c in block["cells"] if c.get("curve")]
    for arm, entry in block["arms"].items():
        per_seed: dict[str, float | None] = {}
        for cell in (c for c in cells if c["arm"] == arm):
            hit = next((p for p in cell["curve"] if p.get("t1") is not None
                        and p["t1"] >= goal), None)
            per_seed[str(cell["seed"])] = None if hit is None else hit["train_s"]
        reached = [v for v in per_seed.values() if v is not None]
        entry["half_gap_s"] = {"goal_t1": goal, "per_seed": per_seed,
                               "reached": len(reached), "of": len(per_seed),
                               "mean_s": float(np.mean(reached)) if reached else None}


def add_time_to_reach(block: dict[str, Any], target_arm: str) -> None:
    """Per arm and seed, the seconds it took to reach ``target_arm``'s final T=1 success
    of the same seed: the training seconds at its first evaluation at or above it (which
    count what its data cost to make, :func:`read_curve`); None if it never did."""
    cells = [c for c in block["cells"] if c.get("curve")]
    target = {c["seed"]: c["curve"][-1]["t1"] for c in cells if c["arm"] == target_arm}
    for arm, entry in block["arms"].items():
        per_seed: dict[str, float | None] = {}
        for cell in (c for c in cells if c["arm"] == arm and c["seed"] in target):
            goal = target[cell["seed"]]
            hit = next((p for p in cell["curve"] if p["t1"] is not None and goal is not None
                        and p["t1"] >= goal), None)
            per_seed[str(cell["seed"])] = None if hit is None else hit["train_s"]
        reached = [v for v in per_seed.values() if v is not None]
        entry[f"seconds_to_{target_arm}_final"] = {
            "per_seed": per_seed, "reached": len(reached), "of": len(per_seed),
            "mean_s": float(np.mean(reached)) if reached else None}


def analyze(out_dir: Path, raw: dict[str, Any], settings: DistillSettings, output: Path,
            start: dict[str, Any] | None) -> dict[str, Any]:
    """The analysis of whatever phases ``out_dir`` holds."""
    rng = np.random.default_rng(0)
    summary: dict[str, Any] = {"config": raw["name"], "baseline": raw["baseline"],
                               "budget": raw["budget"], "seeds": raw["seeds"],
                               "distill": settings.model_dump(mode="json"),
                               "start": start, "complete": False,
                               # unseen_states: the T=1 episodes' (greedy's beside it);
                               # records without this key hold the greedy figure only.
                               "coverage_reading": "t1"}
    names = [a["name"] for a in raw["arms"]]
    kept = kept_cells(output)  # cells whose run folders are not here (an earlier part)
    starts = out_dir / START_EVALS
    known_starts = json.loads(starts.read_text(encoding="utf-8")) if starts.is_file() else {}
    summary["start_evals"] = known_starts
    for phase in PHASES:
        results = out_dir / phase / "results.json"
        if not results.is_file():
            continue
        data = json.loads(results.read_text(encoding="utf-8"))
        split = settings.grid_split if phase == "grid" else settings.main_split
        start0 = known_starts.get(f"warm:{split}")
        cells = [analyze_cell(c, results.parent, start0, settings.charge_set, kept)
                 for c in data["cells"]]
        extensions = extension_dirs(out_dir) if phase == "grid" else []
        for folder in extensions:  # the grid's extensions (grid_extension_factor)
            more = json.loads((folder / "results.json").read_text(encoding="utf-8"))
            cells += [analyze_cell(c, folder, start0, settings.charge_set, kept)
                      for c in more["cells"]]
        if settings.budget_s is not None:
            for c in cells:
                if c.get("training_s") is not None:
                    c["reached_budget_s"] = c["training_s"] >= settings.budget_s
        # The equal-update readings: every update count some cell was evaluated at.
        updates = sorted({p["update"] for c in cells for p in c.get("curve") or []})
        seconds = sorted({*settings.wall_clock_s,
                          *([settings.budget_s] if settings.budget_s is not None else [])})
        block: dict[str, Any] = {**provenance(results, data, output), "updates": updates,
                                 "seconds": seconds}
        if phase == "grid":
            block["extensions"] = [f.name for f in extensions]
            try:
                block["choice"] = choose_rates(cells, names,
                                               arm_rates(out_dir, names, settings.lr_grid),
                                               settings.budget_s)[1]
            except SystemExit as exc:
                block["choice"] = None
                block["choice_error"] = str(exc)
        block["arms"] = compare(cells, data["baseline"], updates, seconds, rng)
        if settings.budget_s is not None:
            for arm, entry in block["arms"].items():
                entry["short_of_budget_s"] = sum(c.get("reached_budget_s") is False
                                                 for c in cells if c["arm"] == arm)
        block["cells"] = cells
        if phase == "main":
            add_comparisons(block, data["baseline"], settings.also_against)
            add_gap_closed(block, known_starts.get(f"warm:{split}"),
                           known_starts.get(f"teacher:{split}"))
            add_half_gap_seconds(block, known_starts.get(f"warm:{split}"),
                                 known_starts.get(f"teacher:{split}"))
            if settings.reach_arm is not None:
                add_time_to_reach(block, settings.reach_arm)
        summary[phase] = block
    summary["complete"] = all((summary.get(p) or {}).get("complete") for p in PHASES)
    return summary


def print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    def iv(entry: dict | None) -> str:
        if not entry:
            return "-"
        return f"{entry['mean']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}]"

    console = Console()
    start = summary.get("start") or {}
    warm, teacher = start.get("warm_student"), start.get("teacher")
    if warm:
        console.print(f"warm student: T=1 {warm['t1']}, greedy {warm['greedy']} on {warm['split']} "
                      f"(band {warm['band']}); teacher: {teacher and teacher['t1']} T=1, "
                      f"{teacher and teacher['greedy']} greedy; margin {start.get('teacher_margin')}")
    grid = summary.get("grid") or {}
    for arm, row in (grid.get("choice") or {}).items():
        console.print(f"grid {arm}: " + ", ".join(
            f"lr {r['lr']:g}: T=1 {r['t1']}" for r in row["grid"]) + f" -> {row['chosen_lr']:g}")
    main = summary.get("main")
    if not main:
        return
    base = summary["baseline"]
    last = f"updates={main['updates'][-1]}"
    table = Table(title=f"test split after {main['updates'][-1]} updates and at "
                        f"{main['seconds'][-1]:g} training s, mean over seeds [95% bootstrap]")
    for col in ("arm", "ok", "T=1", f"Δ vs {base}", "greedy", f"Δ vs {base}",
                f"T=1 at {main['seconds'][-1]:g} s", "unseen states", "train s"):
        table.add_column(col)
    at_s = f"seconds={main['seconds'][-1]:g}"
    for arm, e in main["arms"].items():
        table.add_row(arm, f"{e['ok']}/{e['cells']}", iv(e[last]["t1"]),
                      iv(e[last].get(f"t1_vs_{base}")), iv(e[last]["greedy"]),
                      iv(e[last].get(f"greedy_vs_{base}")), iv(e[at_s]["t1"]),
                      iv(e["unseen_states_final"]),
                      f"{e['mean_training_s']:.1f}" if e["mean_training_s"] is not None else "-")
    console.print(table)
    for arm, e in main["arms"].items():  # version 3's readings, where the config asks them
        shares = [f"{kind} {e[last][f'{kind}_gap_closed']:+.2f}" for kind in READINGS
                  if e[last].get(f"{kind}_gap_closed") is not None]
        reach = next((v for k, v in e.items() if k.startswith("seconds_to_")), None)
        if shares or reach:
            console.print(f"{arm}: gap closed {', '.join(shares) or '-'}" + (
                f"; reached the reach arm's final T=1 in {reach['reached']}/{reach['of']} "
                f"seeds" + (f", mean {reach['mean_s']:.1f} training s" if reach["mean_s"]
                            is not None else "") if reach else ""))


# -- running ----------------------------------------------------------------------------


def committed_analysis(name: str) -> Path:
    """``distill_bench.json`` for the config ``distill``, ``distill_bench_<suffix>.json``
    for ``distill-<suffix>``."""
    suffix = str(name).removeprefix("distill").replace("-", "_")
    return RESULTS.with_name(f"distill_bench{suffix}.json")


def output_paths(args: argparse.Namespace, raw: dict[str, Any],
                 analysis: Path | None = None) -> tuple[Path, Path]:
    """The benchmark's output folder and its analysis file (``analysis``: the committed
    one, by default this benchmark's for the config's name); exits 1 with one line
    before a committed file would be rewritten unasked."""
    from miniverl.common.errors import ConfigError
    from miniverl.student.benchmark.outputs import choose_output_dir, refuse_committed

    committed = ROOT / (raw.get("output_dir") or f"benchmarks/results/{raw['name']}")
    try:
        out_dir = choose_output_dir(args.output_dir, update_committed=args.update_committed,
                                    committed=committed,
                                    fresh=ROOT / "runs" / "benchmarks" / raw["name"])
        analysis = analysis or committed_analysis(raw["name"])
        if not args.update_committed:
            analysis = out_dir / analysis.name
        refuse_committed([analysis, *(out_dir / p / "results.json" for p in PHASES)],
                         update_committed=args.update_committed)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    return out_dir, analysis


MACHINE_FILE = "machine.json"
START_FILE = "start_weights.json"
PARTS_FILE = "parts.json"


def log_part(out_dir: Path, resume: bool) -> dict[str, Any]:
    """Append this part (when it started, the host, its boot id, its machine record) to
    the run's parts log; a fresh start (no ``--resume``) begins a new log. Parts may run
    on two hosts whose machine records are equal (check_machine): the log says which."""
    import platform

    from miniverl.common.clock import utc_now

    path = out_dir / PARTS_FILE
    parts = json.loads(path.read_text(encoding="utf-8")) if resume and path.is_file() else []
    boot = Path("/proc/sys/kernel/random/boot_id")  # one per boot: the host name may repeat
    part = {"started_at": utc_now(), "host": platform.node(),
            "boot_id": boot.read_text(encoding="utf-8").strip() if boot.is_file() else None,
            "resume": resume, "machine": machine_record()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([*parts, part], indent=2) + "\n", encoding="utf-8")
    return part


def check_machine(out_dir: Path, resume: bool,
                  here: dict[str, Any] | None = None) -> dict[str, Any]:
    """This machine's record (``machine.py``), written beside the first part's cells; a
    resumed run must be on the machine that started it, since its cells spend a budget
    in seconds and train models whose numerics the torch build, the libraries and the
    CPU decide (exits 1 with one line naming what differs)."""
    return same_as_recorded(out_dir / MACHINE_FILE, machine_record() if here is None else here,
                            resume, "on another machine than the one that ran")


def check_start(out_dir: Path, resume: bool, prepared: dict[str, dict | None]) -> dict[str, str]:
    """The digest of each prepared model (``model_dir_digest``: its folder, miniverl's
    own notes aside), written beside the first part's cells; a resumed run must start
    from the same models. Two machines of one label can prepare different models from
    one recipe (benchmarks/results/distill_v5_attempts.json), and a cached preparation
    is trusted by its recipe alone (exits 1 with one line)."""
    from miniverl.common.qualification import model_dir_digest

    weights = {}
    for name, record in prepared.items():
        if record is None:
            continue
        folder = Path(record["model_dir"])
        if not any(folder.glob("*.safetensors")):
            raise fail(f"the {name} preparation {folder} holds no .safetensors "
                       "weights; remove that folder and run again to prepare it anew")
        weights[name] = model_dir_digest(folder)
    return same_as_recorded(out_dir / START_FILE, weights, resume,
                            "from other prepared weights than")


def same_as_recorded(path: Path, here: dict[str, Any], resume: bool,
                     what: str) -> dict[str, Any]:
    """``here`` written to ``path`` by a first part; on ``--resume``, the recorded one,
    or one line and exit 1 naming each field that differs."""
    if resume and path.is_file():
        there = json.loads(path.read_text(encoding="utf-8"))
        differ = [f"{k} {here.get(k)} here, {there.get(k)} there"
                  for k in sorted(set(here) | set(there)) if here.get(k) != there.get(k)]
        if differ:
            raise fail(f"--resume {what} {path.parent}'s first cells ({'; '.join(differ)}); "
                       "a benchmark budgeted in seconds compares the cells of one machine "
                       "and one start: resume there, or run it again without --resume into "
                       "another --output-dir")
        return there
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(here, indent=2) + "\n", encoding="utf-8")
    return here


def write_phase_config(raw: dict[str, Any], settings: DistillSettings, phase: str,
                       config_dir: Path, phase_dir: Path,
                       chosen: dict[str, float] | None = None) -> Path:
    phase_dir.mkdir(parents=True, exist_ok=True)
    data = phase_config(raw, settings, phase, config_dir, phase_dir, chosen)
    path = phase_dir / "config.yaml"
    header = (f"# derived by benchmarks/distill_bench.py from {raw['name']}'s config "
              f"(phase {phase}); do not edit\n")
    path.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


class PartEnded(Exception):
    """``--part-minutes`` ran out after a cell: the results hold every finished cell."""


def run_phase(path: Path, phase_dir: Path, args: argparse.Namespace,
              deadline: float | None = None) -> None:
    from miniverl.common.errors import ConfigError
    from miniverl.student.benchmark.run import run_benchmark

    def on_cell(record) -> None:
        r = record.result
        print(f"cell {record.arm} seed {record.seed}: {r.status}, T=1 "
              f"{r.sampled_success_before} -> {r.sampled_success_after}, greedy "
              f"{r.success_before} -> {r.success_after}, {r.wall_s or 0:.0f} s"
              + (f", {r.error}" if r.error else ""), flush=True)
        if deadline is not None and time.monotonic() >= deadline:
            raise PartEnded  # after the cell is written: --resume starts at the next

    try:
        run_benchmark(path, resume=args.resume, output_dir=phase_dir,
                      update_committed=args.update_committed, on_cell=on_cell)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def extend_grid(raw: dict[str, Any], settings: DistillSettings, config_dir: Path,
                out_dir: Path, output: Path, args: argparse.Namespace,
                deadline: float | None) -> None:
    """The grid's extension rule (:func:`grid_extension`), round after round: each round
    runs the arms whose choice is at an edge at their next rate, in ``grid_ext<k>``
    (a round already run is resumed, not repeated), until every choice is inside its
    grid or ``grid_extension_rounds`` have run."""
    names = [a["name"] for a in raw["arms"]]
    assert settings.grid_extension_factor is not None
    for k in range(1, settings.grid_extension_rounds + 1):
        folder = out_dir / f"grid_ext{k}"
        if not (folder / "results.json").is_file():
            rates = arm_rates(out_dir, names, settings.lr_grid)
            _, table = choose_rates(grid_cells(out_dir, settings.grid_split, settings.charge_set,
                                               kept_cells(output)),
                                    names, rates, settings.budget_s)
            new = grid_extension(table, settings.grid_extension_factor, settings.lr_bounds)
            if not new:
                return
            print(f"grid extension {k}: " + ", ".join(f"{a} at lr {lr:g}" for a, lr in new.items()),
                  flush=True)
            folder.mkdir(parents=True, exist_ok=True)
            data = extension_config(raw, settings, config_dir, folder,
                                    {a: (len(rates[a]), lr) for a, lr in new.items()})
            path = folder / "config.yaml"
            path.write_text(f"# derived by benchmarks/distill_bench.py from {raw['name']}'s "
                            f"config (grid extension {k}); do not edit\n"
                            + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
            run_phase(path, folder, args, deadline)
        else:  # a round that ran (or was cut by --part-minutes): finish it as written
            run_phase(folder / "config.yaml", folder,
                      argparse.Namespace(**{**vars(args), "resume": True}), deadline)


def check_kept(out_dir: Path, phases: list[str]) -> None:
    """--analyze-only: every asked phase's results and kept runs exist, or exit 1."""
    for phase in phases:
        results = out_dir / phase / "results.json"
        if not results.is_file():
            raise fail(f"--analyze-only re-reads a benchmark's kept runs, and {results.parent} "
                       "holds no results.json; run the benchmark first (without "
                       "--analyze-only), or name the folder of an earlier run with --output-dir")
        missing = missing_runs(results)
        if missing:
            raise fail(f"--analyze-only re-reads kept runs, and {len(missing)} of {results} "
                       f"are missing ({'; '.join(missing[:3])}"
                       f"{'; ...' if len(missing) > 3 else ''}); run directories are "
                       "git-ignored, so a fresh clone has none: run the benchmark first "
                       "(without --analyze-only)")


def main(argv: list[str] | None = None) -> int:
    ap = benchmark_arguments(__doc__, CONFIG)
    ap.add_argument("--phase", choices=("grid", "main", "all"), default="all",
                    help="grid: the learning-rate grid; main: the report's cells at the "
                         "grid's choice; all: both, in that order")
    ap.add_argument("--part-minutes", type=float, default=None,
                    help="start no cell after this many minutes; exit 3, to be continued "
                         "with --resume (a run in parts)")
    ap.add_argument("--also-against", action="append", default=[], metavar="ARM",
                    help="pair every arm with ARM too (repeatable), beside the baseline and "
                         "the config's distill.also_against")
    ap.add_argument("--reread-record", action="store_true",
                    help="add the comparisons to the analysis the record holds, from its "
                         "cells' curves (no kept runs needed); other figures unchanged")
    ap.add_argument("--version", type=int, default=None, metavar="N",
                    help="run version N's committed config, benchmarks/distill/v<N>.yaml "
                         "(3 and later; in place of --config)")
    args = ap.parse_args(argv)
    if args.version is not None:
        versioned = CONFIG.parent / f"v{args.version}.yaml"
        if not versioned.is_file():
            raise fail(f"--version {args.version} names {versioned.relative_to(ROOT)}, which "
                       "does not exist; give a version with a committed config (3, 4, 5) or "
                       "pass --config")
        args.config = versioned
    if args.part_minutes is not None and not args.part_minutes > 0:
        raise fail(f"--part-minutes {args.part_minutes:g} must be positive; give the minutes "
                   "after which no new cell starts")
    raw, settings = load_config(args.config)
    names = [a["name"] for a in raw["arms"]]
    against = list(dict.fromkeys([*settings.also_against, *args.also_against]))
    unknown = [a for a in [*against, *([settings.reach_arm] if settings.reach_arm else [])]
               if a not in names]
    if unknown:
        raise fail(f"also_against or reach_arm names {unknown}, not arms of {args.config} "
                   f"({names}); name arms of the config")
    settings = settings.model_copy(update={"also_against": against})
    config_dir = args.config.resolve().parent
    out_dir, output = output_paths(args, raw)
    if args.reread_record:
        source = output if output.is_file() else committed_analysis(raw["name"])
        if not source.is_file() or not json.loads(source.read_text(encoding="utf-8")).get("main"):
            raise fail(f"--reread-record reads an analysis with a main phase, and {source} "
                       "has none; run the benchmark first")
        summary = json.loads(source.read_text(encoding="utf-8"))
        add_comparisons(summary["main"], summary["baseline"], against)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {output} (comparisons with {[summary['baseline'], *against]})")
        return 0
    phases = list(PHASES) if args.phase == "all" else [args.phase]
    start = None
    deadline = (time.monotonic() + 60.0 * args.part_minutes
                if args.part_minutes is not None else None)
    if args.analyze_only:
        check_kept(out_dir, phases)
        previous = json.loads(output.read_text(encoding="utf-8")) if output.is_file() else {}
        start = previous.get("start")
    else:
        machine = check_machine(out_dir, args.resume)
        log_part(out_dir, args.resume)
        if settings.start is not None:
            warm, teacher = committed_start(settings, config_dir)
        else:
            warm, teacher = prepared_records(raw, config_dir)
        start = start_summary(warm, teacher, settings.warm_start)
        start["machine"] = machine
        start["weights_sha256"] = check_start(out_dir, args.resume,
                                              {"warm": warm, "teacher": teacher})
        check_warm_start(warm, settings.warm_start, raw["student_prepare"])
        start["gates"] = check_gates(warm, teacher, settings, raw["student_prepare"])
        print(f"warm student: T=1 {start['warm_student']['t1']:.3f} (band "
              f"{list(settings.warm_start)}); teacher margin {start['teacher_margin']}",
              flush=True)
        models = {"warm": warm["model_dir"]}
        raw = own_teacher_arms(start_arms(raw, settings, config_dir),
                               warm["model_dir"] if settings.start is None
                               else start_ref(raw, settings, config_dir, "warm"))
        start_evals(raw, config_dir, models, settings.grid_split, out_dir / START_EVALS)
        if teacher is not None:
            models["teacher"] = teacher["model_dir"]
        start_evals(raw, config_dir, models, settings.main_split, out_dir / START_EVALS)
        for phase in phases:
            chosen = None
            if phase == "main":
                grid_results = out_dir / "grid" / "results.json"
                if not grid_results.is_file():
                    raise fail(f"--phase main runs at the rates the grid chose, and "
                               f"{grid_results} does not exist; run --phase grid first")
                chosen, _ = choose_rates(grid_cells(out_dir, settings.grid_split,
                                                    settings.charge_set, kept_cells(output)),
                                         names,
                                         arm_rates(out_dir, names, settings.lr_grid),
                                         settings.budget_s)
            path = write_phase_config(raw, settings, phase, config_dir, out_dir / phase, chosen)
            try:
                run_phase(path, out_dir / phase, args, deadline)
                if phase == "grid" and settings.grid_extension_factor is not None:
                    extend_grid(raw, settings, config_dir, out_dir, output, args, deadline)
            except PartEnded:
                summary = analyze(out_dir, raw, settings, output, start)
                output.parent.mkdir(parents=True, exist_ok=True)
                output.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
                print(f"part ended after {args.part_minutes:g} minutes at a cell boundary "
                      f"(phase {phase}); wrote {output}; continue with --resume", flush=True)
                return 3
    summary = analyze(out_dir, raw, settings, output, start)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print_table(summary)
    print(f"wrote {output}")
    return 0 if all((summary.get(p) or {}).get("complete") for p in phases) else 1


if __name__ == "__main__":
    sys.exit(main())
