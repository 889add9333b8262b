"""Two specialists or one generalist? The several-teachers benchmark.

    python benchmarks/several_bench.py                 # preparations, grid, main, analysis
    python benchmarks/several_bench.py --phase grid    # the learning-rate grid alone
    python benchmarks/several_bench.py --phase main    # the report's cells (after the grid)
    python benchmarks/several_bench.py --resume        # continue an interrupted one
    python benchmarks/several_bench.py --analyze-only  # re-read the kept runs

Runs ``benchmarks/several/config.yaml`` (docs/several-teachers-bench.md, "Design (version 1)"): a
student learns two tool domains at once, from the same start, by each arm of the
config. Its teachers are one base model and named LoRA adapters of it, all served by
one teacher process (``teacher.adapters``): one adapter per domain (the specialists)
and one trained on both (the generalist).

- **Before any cell**, the preparations of the ``several:`` section, each made once and
  cached (``student/teacher_prep.py``): the base (``several.base``, an sft recipe of
  the base model), every adapter (``several.adapters``: a LoRA sft recipe each, whose
  ``student.model`` this script replaces by the prepared base's directory; the adapter
  is kept alone, unmerged) and the student's start (``several.student``). The base
  recipe (``recipe``) is then written with the prepared directories
  (``recipe.resolved.yaml`` in the output folder: ``student.model.path``,
  ``teacher.model.path``, ``teacher.adapters``), and every prepared model is evaluated
  once on each split it is read on (greedy and ``eval.samples`` episodes per task at
  T=1, each domain apart, with its tool calls per episode; an adapter merged into the
  base): the student's row is every cell's update 0, and the teachers' rows are what
  each teacher does in each domain (``start_evals.json``).
- **grid** (``--phase grid``): every arm at each rate of ``several.lr_grid`` on
  ``several.grid_seed``, scored on ``several.grid_split`` after the budget; each arm's
  rate is its highest T=1 success over both domains (ties: greedy, then the lower rate).
- **main** (``--phase main``): every arm at its rate on every seed, on
  ``several.main_split``.

Every cell of an arm whose ``train.fixed_set`` is ``teacher`` (SeqKD: the
specialists' own samples) shares one episode cache across its seeds and rates, and
pays for what it trains on (``preparation_s``). Per arm at the budget: each domain's T=1
and greedy success and tool calls per episode (T=1), the mixture's, mean over seeds
with a 95% bootstrap interval, and the paired difference per seed to the baseline and
to each arm of ``several.also_against``, with the count of seeds above; each cell's
training seconds and their split. Writes ``several_bench.json`` in the output folder
(``--update-committed``: ``benchmarks/results/several_bench.json``, or
``several_bench_<suffix>.json`` for another config).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts beside this file

from distill_bench import (  # noqa: E402
    GridSettings,
    check_kept,
    choose_rates,
    eval_recipe,
    evaluate_dir,
    fail,
    load_section_config,
    output_paths,
    preparation_s,
    run_phase,
    time_split,
)
from real_model_learning import (  # noqa: E402
    benchmark_arguments,
    provenance,
    run_path,
)
from recovery_bench import seed_interval  # noqa: E402

from miniverl.common.rundir import RunDir  # noqa: E402
from miniverl.student.benchmark.config import merge_overrides  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmarks" / "several" / "config.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "several_bench.json"
PHASES = ("grid", "main")
START_EVALS = "start_evals.json"
RESOLVED = "recipe.resolved.yaml"
ROUTE_COUNTERS = ("episodes", "positions_scored", "stale_dropped", "held_back", "wait_s")


class SeveralSettings(GridSettings):
    """The ``several:`` section of the several-teachers benchmark config (its grid:
    distill_bench.GridSettings)."""

    base: str = Field(description="the sft recipe that prepares the teachers' base model")
    adapters: dict[str, str] = Field(
        min_length=1, description="adapter name -> the LoRA sft recipe that prepares it")
    student: str = Field(description="the sft recipe that prepares every arm's start")
    also_against: list[str] = Field(default_factory=list)


def load_config(path: Path) -> tuple[dict[str, Any], SeveralSettings]:
    """The benchmark config's own fields and its validated ``several:`` section."""
    raw, settings = load_section_config(path, "several", SeveralSettings,
                                        "several-teachers benchmark",
                                        "benchmarks/several/config.yaml")
    names = [a["name"] for a in raw.get("arms") or []]
    unknown = [a for a in settings.also_against if a not in names]
    if unknown:
        raise fail(f"several.also_against names {unknown}, not arms of {path} ({names}); "
                   "name arms of the config")
    return raw, settings


# -- the preparations --------------------------------------------------------------------


def _model_of(prep: Path) -> dict[str, Any]:
    return yaml.safe_load(prep.read_text(encoding="utf-8"))["student"]["model"]


def _record(prepared: Any, prep: Path) -> dict[str, Any]:
    record = prepared.record
    return {"model_dir": str(prepared.model_dir), "cached": prepared.cached,
            "prep_recipe": Path(os.path.relpath(prep.resolve(), ROOT)).as_posix(),
            "steps": record.get("steps"), "prep_wall_s": record.get("wall_s")}


def prepare_all(settings: SeveralSettings, config_dir: Path,
                out_dir: Path) -> dict[str, dict[str, Any]]:
    """The base, each adapter (trained on the prepared base) and the student's start,
    each prepared now or found cached: name -> its directory and preparation."""
    from miniverl.common.errors import ConfigError
    from miniverl.common.recipe_models import ModelSource
    from miniverl.student.teacher_prep import prepare_model

    def prepare(prep: Path, model: dict[str, Any], what: str, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            made = prepare_model(prep, ModelSource.model_validate(model), what=what,
                                 model_field=f"{what}'s student.model", **kw)
        except ConfigError as exc:
            raise fail(str(exc)) from None
        print(f"{what}: {made.model_dir.name} "
              f"({'cached' if made.cached else f'{time.perf_counter() - t0:.0f} s'})", flush=True)
        return made

    out: dict[str, dict[str, Any]] = {}
    base_prep = config_dir / settings.base
    base = prepare(base_prep, _model_of(base_prep), "several.base")
    out["base"] = _record(base, base_prep)
    resolved = out_dir / "prepared"
    resolved.mkdir(parents=True, exist_ok=True)
    for name, rel in settings.adapters.items():
        prep = config_dir / rel
        data = yaml.safe_load(prep.read_text(encoding="utf-8"))
        data["student"]["model"] = {"path": str(base.model_dir)}
        copy_path = resolved / f"{prep.stem}.resolved.yaml"
        copy_path.write_text(f"# {rel} on the prepared base, written by "
                             "benchmarks/several_bench.py; do not edit\n"
                             + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        made = prepare(copy_path, data["student"]["model"], f"several.adapters.{name}",
                       adapter=True)
        out[f"adapter:{name}"] = {**_record(made, prep), "base": base.model_dir.name}
    student_prep = config_dir / settings.student
    out["student"] = _record(prepare(student_prep, _model_of(student_prep), "several.student"),
                             student_prep)
    return out


def resolved_recipe(raw: dict[str, Any], config_dir: Path, out_dir: Path,
                    prepared: dict[str, dict[str, Any]]) -> Path:
    """The base recipe with the prepared directories, written to the output folder."""
    data = yaml.safe_load((config_dir / raw["recipe"]).read_text(encoding="utf-8"))
    data["student"]["model"] = {"path": prepared["student"]["model_dir"]}
    teacher = data["teacher"]
    teacher["model"] = {"path": prepared["base"]["model_dir"]}
    unknown = [n for n in teacher.get("adapters") or {} if f"adapter:{n}" not in prepared]
    if unknown:
        raise fail(f"{raw['recipe']}'s teacher.adapters names {unknown}, which several.adapters "
                   "does not prepare; give each a recipe in several.adapters")
    teacher["adapters"] = {name: prepared[f"adapter:{name}"]["model_dir"]
                           for name in teacher.get("adapters") or {}}
    path = out_dir / RESOLVED
    path.write_text(f"# {raw['recipe']} with the prepared models, written by "
                    "benchmarks/several_bench.py; do not edit\n"
                    + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def domains_of(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """An eval summary's figures per domain: greedy and T=1 success, tool calls each."""
    greedy = summary.get("by_environment") or {}
    sampled = (summary.get("sampled") or {}).get("by_environment") or {}
    return {env: {"greedy": greedy[env]["success"], "t1": (sampled.get(env) or {}).get("success"),
                  "tool_calls_greedy": greedy[env].get("tool_calls"),
                  "tool_calls_t1": (sampled.get(env) or {}).get("tool_calls")}
            for env in greedy}


def point(summary: dict[str, Any]) -> dict[str, Any]:
    """One evaluation's figures: the mixture's and each domain's."""
    sampled = summary.get("sampled") or {}
    return {"greedy": summary.get("success"), "t1": sampled.get("success"),
            "tool_calls_t1": sampled.get("mean_tool_calls"),
            "tool_calls_greedy": summary.get("mean_tool_calls"),
            "domains": domains_of(summary)}


def start_evals(raw: dict[str, Any], recipe_path: Path, prepared: dict[str, dict[str, Any]],
                names: list[str], split: str, cache: Path) -> dict[str, Any]:
    """Each named prepared model's eval on ``split`` (an adapter merged into the base),
    with the baseline arm's environments, rollout and eval settings; made once, kept in
    ``cache``."""
    known = json.loads(cache.read_text(encoding="utf-8")) if cache.is_file() else {}
    # The baseline arm's recipe: its environments, rollout and eval are every cell's.
    arm = next(a for a in raw["arms"] if a["name"] == raw["baseline"])
    base = merge_overrides(yaml.safe_load(recipe_path.read_text(encoding="utf-8")),
                           arm.get("overrides") or {})
    for name in names:
        key = f"{name}:{split}"
        model_dir = prepared[name]["model_dir"]
        if known.get(key, {}).get("model") == Path(model_dir).name:
            continue
        if name.startswith("adapter:"):  # merged into the base it was trained on
            on, adapter = prepared["base"]["model_dir"], model_dir
        else:
            on, adapter = model_dir, None
        summary, seconds = evaluate_dir(eval_recipe(base, split, on), on, adapter)
        known[key] = {"model": Path(model_dir).name, "split": split, "n": summary.get("n"),
                      "eval_s": round(seconds, 1), **point(summary)}
        shown = {env: d["t1"] for env, d in known[key]["domains"].items()}
        print(f"{name} on {split}: T=1 {known[key]['t1']} {shown}", flush=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known, indent=2) + "\n", encoding="utf-8")
    return {name: known[f"{name}:{split}"] for name in names}


# -- the phases ---------------------------------------------------------------------------


def _arm_overrides(arm: dict[str, Any], lr: float, split: str,
                   eval_every: int | None = None) -> dict[str, Any]:
    over: dict[str, Any] = {"train": {"lr": lr}, "eval": {"split": split}}
    if eval_every is not None:  # the grid reads the last evaluation only
        over["train"]["eval_every"] = eval_every
    if ((arm.get("overrides") or {}).get("train") or {}).get("fixed_set") == "teacher":
        # The specialists' episodes are played once for every seed and rate of the arm;
        # each cell that trains on them is charged what they cost (preparation_s).
        over["cache"] = {"dir": f"../targets/{arm['name']}"}
    return merge_overrides(arm.get("overrides") or {}, over)


def phase_config(raw: dict[str, Any], settings: SeveralSettings, phase: str,
                 recipe_path: Path, phase_dir: Path,
                 chosen: dict[str, float] | None = None) -> dict[str, Any]:
    """The ``miniverl benchmark`` config of one phase, its recipe relative to
    ``phase_dir`` (where it is written)."""
    out = copy.deepcopy(raw)
    out["recipe"] = Path(os.path.relpath(recipe_path.resolve(), phase_dir.resolve())).as_posix()
    out.pop("student_prepare", None)
    out["name"] = f"{raw['name']}-{phase}"[:24]
    out["output_dir"] = f"{raw.get('output_dir') or 'benchmarks/results/' + raw['name']}/{phase}"
    if phase == "grid":
        out["seeds"] = [settings.grid_seed]
        last = raw["budget"].get("updates")
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


# -- reading the cells --------------------------------------------------------------------


def read_curve(run_dir: Path, start: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every evaluation of a run by update (the mixture's and each domain's figures, the
    training seconds up to it and their split), from ``start`` at update 0."""
    run = RunDir(run_dir)
    events, rows = run.read_jsonl("events.jsonl"), run.read_jsonl("metrics.jsonl")
    prep = preparation_s(events)
    evals = {int(e["version"]): e for e in events if e.get("event") == "eval"}
    curve = []
    if 0 not in evals and start is not None:
        curve.append({"update": 0, "train_s": 0.0,
                      **{k: start[k] for k in ("greedy", "t1", "tool_calls_t1",
                                               "tool_calls_greedy", "domains")}})
    for update in sorted(evals):
        split = time_split(rows, update)
        curve.append({"update": update,
                      "train_s": round((prep if update > 0 else 0.0) + sum(split.values()), 3),
                      **point(evals[update]),
                      "time_split": {**split, "preparation_s": round(prep if update else 0.0, 3)}})
    return curve


def analyze_cell(cell: dict[str, Any], results_dir: Path,
                 start: dict[str, Any] | None) -> dict[str, Any]:
    result = cell["result"]
    out = {"arm": cell["arm"], "seed": cell["seed"], "status": result["status"],
           **{k: result.get(k) for k in ("error", "updates", "wall_s", "run_dir")}}
    if out["status"] != "ok" or not out["run_dir"]:
        return out
    run_dir = run_path(results_dir, out["run_dir"])
    out["curve"] = read_curve(run_dir, start)
    out["training_s"] = out["curve"][-1]["train_s"] if out["curve"] else None
    out["time_split"] = out["curve"][-1].get("time_split") if out["curve"] else None
    rows = RunDir(run_dir).read_jsonl("metrics.jsonl")
    out["stale_dropped"] = int((rows[-1].get("stale_dropped") or 0) if rows else 0)
    # Each route's counters as the last row holds them (cumulative over the run).
    out["routes"] = {name: {k: c.get(k) for k in ROUTE_COUNTERS}
                     for name, c in ((rows[-1].get("by_teacher") or {}) if rows else {}).items()}
    return out


def _readings(p: dict[str, Any]) -> dict[str, float | None]:
    """The figures one evaluation is compared on: ``t1``, ``greedy``, ``tool_calls_t1``
    and, per domain, ``<domain>/t1`` / ``<domain>/greedy`` / ``<domain>/tool_calls_t1``
    (a ``/``: a figure's record path joins keys with ``.``)."""
    out = {k: p.get(k) for k in ("t1", "greedy", "tool_calls_t1")}
    for env, d in (p.get("domains") or {}).items():
        for k in ("t1", "greedy", "tool_calls_t1"):
            out[f"{env}/{k}"] = d.get(k)
    return out


def _interval(values: list[float], rng: np.random.Generator) -> dict[str, float]:
    mean, low, high = seed_interval(values, rng)
    return {"mean": round(mean, 4), "low": round(low, 4), "high": round(high, 4)}


def compare(cells: list[dict[str, Any]], baseline: str, against: list[str],
            update: int, seed: int) -> dict[str, Any]:
    """Per arm at ``update``: every reading's mean over seeds with its interval, and the
    paired difference per seed to ``baseline`` and each arm of ``against``."""
    rng = np.random.default_rng(seed)
    final: dict[str, dict[int, dict[str, float | None]]] = {}
    for c in cells:
        p = next((q for q in c.get("curve") or [] if q["update"] == update), None)
        if p is not None:
            final.setdefault(c["arm"], {})[c["seed"]] = _readings(p)
    arms: dict[str, Any] = {}
    for arm, by_seed in final.items():
        keys = sorted({k for r in by_seed.values() for k in r})
        block: dict[str, Any] = {"seeds": len(by_seed), "per_seed": {
            str(s): r for s, r in sorted(by_seed.items())}}
        for k in keys:
            vals = [r[k] for r in by_seed.values() if r.get(k) is not None]
            if vals:
                block[k] = _interval(vals, rng)
        for other in [baseline, *against]:
            if other == arm or other not in final:
                continue
            for k in keys:
                diffs = [r[k] - final[other][s][k] for s, r in by_seed.items()
                         if s in final[other] and r.get(k) is not None
                         and final[other][s].get(k) is not None]
                if diffs:
                    block[f"{k}_vs_{other}"] = {**_interval(diffs, rng),
                                                "above": sum(d > 0 for d in diffs),
                                                "below": sum(d < 0 for d in diffs),
                                                "seeds": len(diffs)}
        seconds = [c["training_s"] for c in cells if c["arm"] == arm and c.get("training_s")]
        if seconds:
            block["mean_training_s"] = round(float(np.mean(seconds)), 1)
            splits = [c["time_split"] for c in cells if c["arm"] == arm and c.get("time_split")]
            block["mean_time_split"] = {k: round(float(np.mean([s[k] for s in splits])), 1)
                                        for k in splits[0]}
        mine = [c for c in cells if c["arm"] == arm and c["status"] == "ok"]
        block["stale_dropped"] = sum(c.get("stale_dropped") or 0 for c in mine)
        block["routes"] = {}
        for c in mine:
            for name, counters in (c.get("routes") or {}).items():
                total = block["routes"].setdefault(name, dict.fromkeys(ROUTE_COUNTERS, 0))
                for k in ROUTE_COUNTERS:
                    total[k] = round(total[k] + (counters.get(k) or 0), 4)
        arms[arm] = block
    return arms


def analyze(out_dir: Path, raw: dict[str, Any], settings: SeveralSettings, output: Path,
            start: dict[str, Any] | None) -> dict[str, Any]:
    """The analysis of every phase that has results."""
    summary: dict[str, Any] = {"name": raw["name"], "baseline": raw["baseline"],
                               "also_against": settings.also_against,
                               "lr_grid": settings.lr_grid, "start": start}
    update = raw["budget"]["updates"]
    names = [a["name"] for a in raw["arms"]]
    seed = (raw.get("bootstrap") or {}).get("seed", 0)
    for phase in PHASES:
        results = out_dir / phase / "results.json"
        if not results.is_file():
            continue
        data = json.loads(results.read_text(encoding="utf-8"))
        split = settings.grid_split if phase == "grid" else settings.main_split
        student = ((start or {}).get("evals") or {}).get(f"student:{split}")
        cells = [analyze_cell(c, results.parent, student) for c in data["cells"]]
        block: dict[str, Any] = {"provenance": provenance(results, data, output),
                                 "complete": data["complete"], "split": split,
                                 "cells": cells}
        if phase == "grid":
            if data["complete"]:
                block["chosen"], block["grid"] = choose_rates(cells, names, settings.lr_grid)
        else:
            block["updates"] = update
            block["arms"] = compare(cells, raw["baseline"], settings.also_against, update, seed)
            block["wall_s"] = round(sum(c.get("wall_s") or 0.0 for c in cells), 1)
        summary[phase] = block
    return summary


def print_table(summary: dict[str, Any]) -> None:
    main = summary.get("main")
    if not main or not main.get("arms"):
        return
    domains = sorted({k.split("/")[0] for a in main["arms"].values() for k in a if "/" in k})
    print(f"after {main['updates']} updates, T=1 on {main['split']} (mean over seeds):")
    for arm, block in main["arms"].items():
        by_domain = ", ".join(f"{d} {block[f'{d}/t1']['mean']:.3f} "
                              f"({block[f'{d}/tool_calls_t1']['mean']:.2f} calls)"
                              for d in domains if f"{d}/t1" in block)
        print(f"  {arm}: {block['t1']['mean']:.3f}; {by_domain}")


def committed_analysis(name: str) -> Path:
    """``several_bench.json`` for the config ``several``, ``several_bench_<suffix>.json``
    for ``several-<suffix>``."""
    suffix = str(name).removeprefix("several").replace("-", "_")
    return RESULTS.with_name(f"several_bench{suffix}.json")


def main(argv: list[str] | None = None) -> int:
    ap = benchmark_arguments(__doc__, CONFIG)
    ap.add_argument("--phase", choices=("grid", "main", "all"), default="all",
                    help="grid: the learning-rate grid; main: the report's cells at the "
                         "grid's choice; all: both, in that order")
    args = ap.parse_args(argv)
    raw, settings = load_config(args.config)
    config_dir = args.config.resolve().parent
    out_dir, output = output_paths(args, raw, committed_analysis(raw["name"]))
    phases = list(PHASES) if args.phase == "all" else [args.phase]
    if args.analyze_only:
        check_kept(out_dir, phases)
        previous = json.loads(output.read_text(encoding="utf-8")) if output.is_file() else {}
        start = previous.get("start")
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        prepared = prepare_all(settings, config_dir, out_dir)
        recipe_path = resolved_recipe(raw, config_dir, out_dir, prepared)
        teachers = ["base", *(f"adapter:{n}" for n in settings.adapters)]
        evals: dict[str, Any] = {}
        for split, names in ((settings.grid_split, ["student"]),
                             (settings.main_split, ["student", *teachers])):
            found = start_evals(raw, recipe_path, prepared, names, split, out_dir / START_EVALS)
            evals.update({f"{n}:{split}": v for n, v in found.items()})
        start = {"prepared": {k: {f: v for f, v in p.items() if f != "model_dir"}
                              for k, p in prepared.items()},
                 "evals": evals, "preparation_s": round(time.perf_counter() - t0, 1)}
        for phase in phases:
            chosen = None
            if phase == "main":
                grid_results = out_dir / "grid" / "results.json"
                if not grid_results.is_file():
                    raise fail(f"--phase main runs at the rates the grid chose, and "
                               f"{grid_results} does not exist; run --phase grid first")
                data = json.loads(grid_results.read_text(encoding="utf-8"))
                cells = [analyze_cell(c, grid_results.parent, None) for c in data["cells"]]
                chosen, _ = choose_rates(cells, [a["name"] for a in raw["arms"]],
                                         settings.lr_grid)
            phase_dir = out_dir / phase
            phase_dir.mkdir(parents=True, exist_ok=True)
            path = phase_dir / "config.yaml"
            path.write_text(f"# derived by benchmarks/several_bench.py from {raw['name']}'s "
                            f"config (phase {phase}); do not edit\n"
                            + yaml.safe_dump(phase_config(raw, settings, phase, recipe_path,
                                                          phase_dir, chosen), sort_keys=False),
                            encoding="utf-8")
            run_phase(path, phase_dir, args)
    summary = analyze(out_dir, raw, settings, output, start)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print_table(summary)
    print(f"wrote {output}")
    return 0 if all((summary.get(p) or {}).get("complete") for p in phases) else 1


if __name__ == "__main__":
    sys.exit(main())
