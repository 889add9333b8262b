"""Matched-budget benchmarks: several training arms, several seeds, one comparison.

A benchmark config (YAML, :class:`BenchmarkConfig`) names a base recipe, the arms
(``sft``, ``offline_kd``, ``opd``, ``replay``; pipelined or serial), the seeds and
one budget that every cell gets: the same number of optimizer updates, or the same
wall time. :func:`run_benchmark` runs every arm × seed cell through an injectable
``run_cell(recipe_dict, seed) -> CellResult`` (the default, :class:`TrainerCells`,
trains with ``miniverl.student.trainer``, imported lazily), and after each cell atomically
rewrites ``results.json`` (schema-validated :class:`BenchmarkResults`),
``summary.md`` and ``report.html`` in the output folder. ``resume=True`` keeps the
finished cells of an interrupted benchmark and runs the rest; failed cells run again.

Each arm is compared with the baseline arm by a paired bootstrap over seeds
(numpy, seeded): the interval of the mean per-seed difference.

This module does not train anything itself and imports no torch; the HTML page is
drawn by :mod:`miniverl.student.benchmark_html`. Run with
``miniverl benchmark CONFIG [--resume]``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from miniverl.common.errors import ConfigError

ArmMode = Literal["sft", "offline_kd", "opd", "replay"]
Metric = Literal["success_after", "success_gain", "final_loss", "wall_s"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budget(_Strict):
    kind: Literal["updates", "wall_time"] = Field(
        description="updates: every cell takes the same optimizer steps; wall_time: the same seconds."
    )
    updates: int | None = Field(
        None, ge=1, le=1_000_000, description="Steps per cell (kind updates)."
    )
    wall_s: float | None = Field(
        None, gt=0, le=7 * 86400, description="Seconds per cell (kind wall_time)."
    )
    max_updates: int = Field(
        100_000, ge=1, le=10_000_000, description="Step cap under a wall-time budget."
    )

    @model_validator(mode="after")
    def _matching_field(self) -> Budget:
        if self.kind == "updates" and self.updates is None:
            raise ValueError("budget.kind is 'updates' but budget.updates is unset; add updates: N")
        if self.kind == "wall_time" and self.wall_s is None:
            raise ValueError("budget.kind is 'wall_time' but budget.wall_s is unset; add wall_s: S")
        return self


class Arm(_Strict):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=24, description="Arm label."
    )
    mode: ArmMode = Field(description="Training mode of this arm.")
    pipelining: bool | None = Field(
        None, description="Override train.pipelining; null keeps the recipe's."
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Nested recipe fields merged over the base recipe."
    )


class BootstrapConfig(_Strict):
    samples: int = Field(2000, ge=100, le=1_000_000, description="Bootstrap resamples.")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Interval coverage.")
    seed: int = Field(0, ge=0, description="Seed of the resampling generator.")


class BenchmarkConfig(_Strict):
    schema_version: Literal[1] = 1
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=24, description="Benchmark name."
    )
    recipe: str = Field(description="Base recipe path, relative to the config file.")
    arms: list[Arm] = Field(min_length=1, description="Arms to compare.")
    baseline: str = Field(description="The arm every other arm is compared with.")
    seeds: list[int] = Field(
        min_length=1, max_length=1000, description="Seeds; each arm runs each."
    )
    budget: Budget
    metric: Metric = Field("success_after", description="Primary metric of the comparison.")
    teacher_endpoint: str | None = Field(
        None, description="Teacher for arms that need one (start it with `miniverl teacher serve`)."
    )
    output_dir: str | None = Field(
        None, description="Results folder; null = benchmarks/results/<name>."
    )
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig)

    @model_validator(mode="after")
    def _consistent(self) -> BenchmarkConfig:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique, got {names}; rename the duplicates")
        if self.baseline not in names:
            raise ValueError(
                f"baseline {self.baseline!r} is not an arm ({names}); name one of them"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be unique, got {self.seeds}")
        return self


class CellResult(_Strict):
    """What one arm × seed training run produced."""

    status: Literal["ok", "failed"] = "ok"
    run_dir: str | None = None
    final_version: int | None = None
    updates: int | None = Field(None, ge=0)
    wall_s: float | None = Field(None, ge=0)
    success_before: float | None = Field(None, ge=0, le=1)
    success_after: float | None = Field(None, ge=0, le=1)
    final_loss: float | None = None
    positions_per_s: float | None = None
    peak_memory_bytes: int | None = Field(None, ge=0)
    loss_curve: list[float] = Field(default_factory=list)
    error: str | None = None


class CellRecord(_Strict):
    arm: str
    seed: int
    recipe_digest: str
    budget_matched: bool | None = None
    finished_at: str
    result: CellResult


class ArmSummary(_Strict):
    arm: str
    n_ok: int
    n_failed: int
    mean: float | None
    std: float | None
    mean_low: float | None
    mean_high: float | None
    diff_vs_baseline: float | None
    diff_low: float | None
    diff_high: float | None
    n_pairs: int
    mean_wall_s: float | None
    mean_updates: float | None


class BenchmarkResults(_Strict):
    """The schema of ``results.json``."""

    schema_version: Literal[1] = 1
    kind: Literal["miniverl.benchmark.results"] = "miniverl.benchmark.results"
    name: str
    config_digest: str
    config: dict[str, Any]
    metric: Metric
    baseline: str
    complete: bool = False
    updated_at: str
    environment: dict[str, Any] = Field(default_factory=dict)
    cells: list[CellRecord] = Field(default_factory=list)
    summary: list[ArmSummary] = Field(default_factory=list)


RunCell = Callable[[dict[str, Any], int], CellResult]


def benchmark_results_json_schema() -> dict[str, Any]:
    """JSON Schema of ``results.json`` (``miniverl schema benchmark-results``)."""
    return BenchmarkResults.model_json_schema()


# -- config and per-cell recipes ----------------------------------------------------------


def load_benchmark_config(path: str | Path) -> tuple[BenchmarkConfig, dict[str, Any]]:
    """The validated config and the base recipe as a dict; ConfigError lists every problem."""
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"benchmark config {path} does not exist; pass a YAML file") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    try:
        config = BenchmarkConfig.model_validate(raw if isinstance(raw, dict) else {})
    except ValidationError as exc:
        issues = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{path}: {exc.error_count()} error(s): {issues}") from exc
    recipe_path = (path.parent / config.recipe).resolve()
    try:
        base = yaml.safe_load(recipe_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{path}: recipe {config.recipe!r} cannot be read ({type(exc).__name__}); "
            "give a recipe path relative to the config file"
        ) from exc
    if not isinstance(base, dict):
        raise ConfigError(f"{recipe_path}: a recipe must be a YAML mapping")
    return config, base


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def cell_recipe(
    config: BenchmarkConfig, base: dict[str, Any], arm: Arm, seed: int, out_dir: Path
) -> dict[str, Any]:
    """The recipe of one cell: base, arm overrides, then mode, seed, budget and run folder."""
    recipe = _merge(base, arm.overrides)
    run = recipe.setdefault("run", {})
    run.update(
        mode=arm.mode,
        seed=seed,
        name=f"{config.name}-{arm.name}-s{seed}"[:64],
        output_dir=str(out_dir / "runs"),
    )
    train = recipe.setdefault("train", {})
    if arm.pipelining is not None:
        train["pipelining"] = arm.pipelining
    if config.budget.kind == "updates":
        train["cycles"] = config.budget.updates
        train.pop("max_wall_s", None)
    else:
        train["cycles"] = config.budget.max_updates
        train["max_wall_s"] = config.budget.wall_s
    return recipe


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def default_output_dir(config: BenchmarkConfig) -> Path:
    return (
        Path(config.output_dir) if config.output_dir else Path("benchmarks/results") / config.name
    )


# -- statistics ------------------------------------------------------------------------


def bootstrap_mean_interval(
    values: list[float], samples: int, confidence: float, seed: int
) -> tuple[float, float, float]:
    """Mean of ``values`` and a percentile bootstrap interval of that mean."""
    arr = np.asarray(values, dtype=np.float64)
    mean = float(arr.mean())
    if len(arr) < 2:
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, len(arr), size=(samples, len(arr)))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return mean, float(lo), float(hi)


def metric_value(result: CellResult, metric: Metric) -> float | None:
    if result.status != "ok":
        return None
    if metric == "success_gain":
        if result.success_after is None or result.success_before is None:
            return None
        return result.success_after - result.success_before
    value = getattr(result, metric)
    return None if value is None or not math.isfinite(value) else float(value)


def summarize(results: BenchmarkResults, config: BenchmarkConfig) -> list[ArmSummary]:
    """Per-arm mean, bootstrap interval, and paired difference to the baseline arm."""
    boot = config.bootstrap
    by_arm: dict[str, dict[int, float]] = {a.name: {} for a in config.arms}
    failed: dict[str, int] = {a.name: 0 for a in config.arms}
    walls: dict[str, list[float]] = {a.name: [] for a in config.arms}
    updates: dict[str, list[float]] = {a.name: [] for a in config.arms}
    for cell in results.cells:
        if cell.arm not in by_arm:
            continue
        value = metric_value(cell.result, config.metric)
        if value is None:
            failed[cell.arm] += cell.result.status != "ok"
            continue
        by_arm[cell.arm][cell.seed] = value
        if cell.result.wall_s is not None:
            walls[cell.arm].append(cell.result.wall_s)
        if cell.result.updates is not None:
            updates[cell.arm].append(float(cell.result.updates))
    base = by_arm[config.baseline]
    out = []
    for arm in config.arms:
        values = by_arm[arm.name]
        mean = std = lo = hi = d_mean = d_lo = d_hi = None
        if values:
            mean, lo, hi = bootstrap_mean_interval(
                list(values.values()), boot.samples, boot.confidence, boot.seed
            )
            std = float(np.std(list(values.values()), ddof=1)) if len(values) > 1 else 0.0
        paired = sorted(set(values) & set(base))
        if paired and arm.name != config.baseline:
            diffs = [values[s] - base[s] for s in paired]
            d_mean, d_lo, d_hi = bootstrap_mean_interval(
                diffs, boot.samples, boot.confidence, boot.seed
            )
        out.append(
            ArmSummary(
                arm=arm.name,
                n_ok=len(values),
                n_failed=failed[arm.name],
                mean=mean,
                std=std,
                mean_low=lo,
                mean_high=hi,
                diff_vs_baseline=d_mean,
                diff_low=d_lo,
                diff_high=d_hi,
                n_pairs=len(paired) if arm.name != config.baseline else 0,
                mean_wall_s=float(np.mean(walls[arm.name])) if walls[arm.name] else None,
                mean_updates=float(np.mean(updates[arm.name])) if updates[arm.name] else None,
            )
        )
    return out


def summary_markdown(results: BenchmarkResults) -> str:
    def f(v: float | None, digits: int = 3) -> str:
        return "n/a" if v is None else f"{v:.{digits}f}"

    conf = results.config.get("bootstrap", {}).get("confidence", 0.95)
    lines = [
        f"# Benchmark {results.name}",
        "",
        f"Metric: `{results.metric}`; baseline arm: `{results.baseline}`; "
        f"budget: {json.dumps(results.config.get('budget'))}; "
        f"{'complete' if results.complete else 'incomplete'}.",
        "",
        f"| arm | ok | failed | mean | {conf:.0%} interval | Δ vs baseline | paired {conf:.0%} interval | mean wall s | mean updates |",
        "| --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: |",
    ]
    for s in results.summary:
        lines.append(
            f"| {s.arm} | {s.n_ok} | {s.n_failed} | {f(s.mean)} | [{f(s.mean_low)}, {f(s.mean_high)}] | "
            f"{f(s.diff_vs_baseline)} | [{f(s.diff_low)}, {f(s.diff_high)}] | {f(s.mean_wall_s, 1)} | "
            f"{f(s.mean_updates, 1)} |"
        )
    return "\n".join(lines) + "\n"


# -- the runner --------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_outputs(out_dir: Path, results: BenchmarkResults) -> None:
    from miniverl.common.atomic import atomic_write_text
    from miniverl.student.benchmark_html import render_benchmark_html

    BenchmarkResults.model_validate(results.model_dump())  # never publish an invalid file
    atomic_write_text(out_dir / "results.json", results.model_dump_json(indent=2) + "\n")
    atomic_write_text(out_dir / "summary.md", summary_markdown(results))
    atomic_write_text(out_dir / "report.html", render_benchmark_html(results))


def load_results(path: str | Path) -> BenchmarkResults:
    path = Path(path)
    try:
        return BenchmarkResults.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError, ValueError) as exc:
        raise ConfigError(
            f"{path} is not a readable benchmark results file ({type(exc).__name__}); "
            "start again without --resume in a fresh output_dir"
        ) from exc


def run_benchmark(
    config_path: str | Path,
    *,
    resume: bool = False,
    run_cell: RunCell | None = None,
    output_dir: str | Path | None = None,
    on_cell: Callable[[CellRecord], None] | None = None,
) -> tuple[BenchmarkResults, Path]:
    """Run (or continue) every arm × seed cell; returns the results and the output folder."""
    from miniverl.student.benchmark_export import collect_environment

    config, base = load_benchmark_config(config_path)
    out_dir = Path(output_dir) if output_dir else default_output_dir(config)
    results_path = out_dir / "results.json"
    config_dump = config.model_dump(mode="json")
    digest = _digest({"config": config_dump, "recipe": base})
    if results_path.exists() and not resume:
        raise ConfigError(
            f"{results_path} already exists; pass --resume to continue it or set another output_dir"
        )
    if resume and results_path.exists():
        results = load_results(results_path)
        if results.config_digest != digest:
            raise ConfigError(
                f"{results_path} was made by a different config or base recipe "
                f"({results.config_digest[:19]} != {digest[:19]}); resume needs the same config, "
                "or start a fresh output_dir"
            )
        results.cells = [c for c in results.cells if c.result.status == "ok"]
        results.complete = False
    else:
        results = BenchmarkResults(
            name=config.name,
            config_digest=digest,
            config=config_dump,
            metric=config.metric,
            baseline=config.baseline,
            updated_at=_now(),
            environment=collect_environment(),
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    owned = None
    if run_cell is None:
        run_cell = owned = TrainerCells(config.teacher_endpoint, out_dir)
    try:
        _run_cells(config, base, out_dir, results, run_cell, on_cell)
    finally:
        if owned is not None:
            owned.close()
    results.summary = summarize(results, config)
    results.complete = all(c.result.status == "ok" for c in results.cells)
    results.updated_at = _now()
    _write_outputs(out_dir, results)
    return results, out_dir


def _run_cells(
    config: BenchmarkConfig,
    base: dict[str, Any],
    out_dir: Path,
    results: BenchmarkResults,
    run_cell: RunCell,
    on_cell: Callable[[CellRecord], None] | None,
) -> None:
    done = {(c.arm, c.seed) for c in results.cells}
    # Seed-major order: an interrupted benchmark still holds complete pairs to compare.
    for seed in config.seeds:
        for arm in config.arms:
            if (arm.name, seed) in done:
                continue
            recipe = cell_recipe(config, base, arm, seed, out_dir)
            try:
                result = run_cell(recipe, seed)
            except Exception as exc:  # one broken cell must not lose the others
                result = CellResult(status="failed", error=f"{type(exc).__name__}: {exc}"[:500])
            matched = None
            if (
                config.budget.kind == "updates"
                and result.status == "ok"
                and result.updates is not None
            ):
                matched = result.updates == config.budget.updates
            record = CellRecord(
                arm=arm.name,
                seed=seed,
                recipe_digest=_digest(recipe),
                budget_matched=matched,
                finished_at=_now(),
                result=result,
            )
            results.cells.append(record)
            results.summary = summarize(results, config)
            results.updated_at = _now()
            _write_outputs(out_dir, results)
            if on_cell:
                on_cell(record)


# -- the real cell: one trainer run ------------------------------------------------------


def cell_result_from_run(run_dir: str | Path, **known: Any) -> CellResult:
    """Read a finished run directory into a :class:`CellResult` (``known`` fields win)."""
    from miniverl.student.report import load_run

    data = load_run(run_dir)
    before, after = data.success_before_after()
    losses = [float(r["loss"]) for r in data.metrics if isinstance(r.get("loss"), (int, float))]
    peaks = [
        int(r[k])
        for r in data.metrics
        for k in ("peak_memory_bytes", "peak_mem_bytes")
        if isinstance(r.get(k), (int, float))
    ]
    if isinstance(data.manifest.get("peak_memory_bytes"), int):
        peaks.append(data.manifest["peak_memory_bytes"])
    fields: dict[str, Any] = {
        "run_dir": str(run_dir),
        "final_version": data.versions[1] if isinstance(data.versions[1], int) else None,
        "updates": data.steps,
        "wall_s": data.wall_clock_s(),
        "success_before": float(before["success"]) if before else None,
        "success_after": float((after or before)["success"]) if (after or before) else None,
        "final_loss": losses[-1] if losses else None,
        "positions_per_s": data.throughput()["positions_per_s"],
        "peak_memory_bytes": max(peaks) if peaks else None,
        "loss_curve": losses[:2000],
    }
    fields.update({k: v for k, v in known.items() if v is not None})
    return CellResult(**fields)


class TrainerCells:
    """The default ``run_cell``: train one recipe with ``miniverl.student.trainer``.

    Arms that need a teacher use ``teacher_endpoint``; when it is None, one teacher
    process is started for the whole benchmark from the first such recipe's teacher
    section (``python -m miniverl.teacher_server --recipe``) and stopped by :meth:`close`.
    The teacher is frozen, so every arm and seed is scored by the same one.
    """

    def __init__(self, teacher_endpoint: str | None, work_dir: Path):
        self.endpoint = teacher_endpoint
        self.work_dir = work_dir
        self.process: Any = None

    def _launch_teacher(self, recipe_dict: dict[str, Any]) -> str:
        import socket
        import subprocess
        import sys

        import yaml

        with socket.socket() as probe:  # a free loopback port for this benchmark's teacher
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        endpoint = f"tcp://127.0.0.1:{port}"
        recipe_path = self.work_dir / "teacher_recipe.yaml"
        recipe_path.write_text(yaml.safe_dump(recipe_dict, sort_keys=False), encoding="utf-8")
        log = (self.work_dir / "teacher.stderr").open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "miniverl.teacher_server",
                "--recipe",
                str(recipe_path),
                "--bind",
                endpoint,
                "--log",
                str(self.work_dir / "teacher.log"),
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        self.endpoint = endpoint
        return endpoint

    def __call__(self, recipe_dict: dict[str, Any], seed: int) -> CellResult:
        from miniverl.common.recipe import Recipe
        from miniverl.student.trainer import Trainer

        recipe = Recipe.model_validate(recipe_dict)
        endpoint = self.endpoint
        if recipe.needs_teacher and endpoint is None and recipe.teacher.endpoint is None:
            endpoint = self._launch_teacher(recipe_dict)
        start = time.perf_counter()
        with Trainer(recipe, teacher_endpoint=endpoint, show_progress=False) as trainer:
            result = trainer.train()
        wall = time.perf_counter() - start
        final_version = getattr(result, "final_version", None)
        return cell_result_from_run(
            result.run_dir,
            wall_s=wall,
            final_version=final_version if isinstance(final_version, int) else None,
            status="ok" if getattr(result, "status", "completed") == "completed" else "failed",
        )

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # SIGTERM means SHUTDOWN drain
            try:
                self.process.wait(timeout=30)
            except Exception:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None
