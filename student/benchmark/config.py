"""A benchmark config: the arms, seeds and matched budget, and the recipe of each cell.

A benchmark config (YAML, :class:`BenchmarkConfig`) names a base recipe, the arms
(``sft``, ``offline_kd``, ``opd``, ``replay``; pipelined or serial), the seeds and
one budget that every cell gets: the same number of optimizer updates, or the same
wall time; optionally an sft recipe that warms the student every cell starts from
(``student_prepare``). :func:`load_benchmark_config` validates it and reads the base recipe;
:func:`cell_recipe` builds one arm × seed cell's recipe from them. A run writes to
:func:`fresh_output_dir` (``runs/benchmarks/<name>``, git-ignored) unless it is given a
folder or told to rewrite the committed results (:func:`committed_output_dir`, the
config's ``output_dir``).

This module runs nothing and imports no torch (:mod:`~miniverl.student.benchmark.run`
runs the cells).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from miniverl.common.errors import ConfigError
from miniverl.common.hashing import sha256_text

ArmMode = Literal["sft", "offline_kd", "opd", "replay", "rl"]
# The fault metrics read the eval's fault breakdown (environments with injected faults,
# student/eval.py): success on faulted and on fault-free tasks, recovery after an error.
Metric = Literal["success_after", "success_gain", "final_loss", "wall_s", "faulted_success_after",
                 "fault_free_success_after", "recovery_after", "sampled_success_after"]


class StrictModel(BaseModel):
    """A benchmark file model: unknown keys are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class Budget(StrictModel):
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


class Arm(StrictModel):
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


class BootstrapConfig(StrictModel):
    samples: int = Field(2000, ge=100, le=1_000_000, description="Bootstrap resamples.")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Interval coverage.")
    seed: int = Field(0, ge=0, description="Seed of the resampling generator.")


def _gate(description: str, **bounds: float) -> Any:
    """A gate's field: off (null) unless the config sets it, and dropped from
    :meth:`BenchmarkConfig.dump` while off, so a config that predates the gate keeps its
    digest."""
    return Field(None, description=f"{description} null: not checked.", **bounds)


class BenchmarkConfig(StrictModel):
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
    student_prepare: str | None = Field(
        None,
        description=(
            "An sft recipe (relative to this file) that warms the base recipe's student "
            "once (cached); every cell starts from the model it makes. null: cells start "
            "from the base recipe's student.model."
        ),
    )
    student_prepare_band: tuple[float, float] | None = _gate(
        "[low, high]: the held-out success the student_prepare preparation must reach "
        "(its own eval: T=1 success when its eval section sets samples, else greedy), "
        "checked before the first cell; outside it the benchmark stops with one line."
    )
    student_prepare_plateau: float | None = _gate(
        "The plateau rule: the student_prepare preparation's last two validation "
        "evaluations (T=1 success) must differ by at most this much, checked before the "
        "first cell (student/benchmark/gates.py).",
        gt=0.0, le=1.0,
    )
    teacher_margin: float | None = _gate(
        "The teacher's T=1 validation success (its preparation's eval) must be at least "
        "this much above the student's plateau (the student_prepare preparation's last "
        "evaluation), checked before the first cell.",
        gt=0.0, le=1.0,
    )
    output_dir: str | None = Field(
        None,
        description=(
            "The committed results folder, written only with --update-committed; null = "
            "benchmarks/results/<name>. A plain run writes runs/benchmarks/<name>."
        ),
    )
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig)

    def dump(self) -> dict[str, Any]:
        """The config as JSON data, as results store and digest it. A config without a
        ``student_prepare_band`` (or plateau, or margin) gate dumps as it did before the
        field existed, so the results it made still resume and still match their digest."""
        out = self.model_dump(mode="json")
        for gate in ("student_prepare_band", "student_prepare_plateau", "teacher_margin"):
            if out.get(gate) is None:
                out.pop(gate, None)
        return out

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
        if self.student_prepare_band is not None:
            low, high = self.student_prepare_band
            if not 0.0 <= low <= high <= 1.0:
                raise ValueError(f"student_prepare_band {list(self.student_prepare_band)} must be "
                                 "[low, high] with 0 <= low <= high <= 1")
            if self.student_prepare is None:
                raise ValueError("student_prepare_band is set but student_prepare is not; "
                                 "name the sft recipe whose preparation it checks")
        for gate in ("student_prepare_plateau", "teacher_margin"):
            if getattr(self, gate) is not None and self.student_prepare is None:
                raise ValueError(f"{gate} is set but student_prepare is not; name the sft "
                                 "recipe whose preparation it checks")
        return self


def load_benchmark_config(path: str | Path) -> tuple[BenchmarkConfig, dict[str, Any]]:
    """The validated config and the base recipe as a dict; ConfigError lists every problem."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"benchmark config {path} does not exist; pass a YAML file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"benchmark config {path} cannot be read ({why}); pass a YAML file") from None
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
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{path}: recipe {config.recipe!r} cannot be read ({type(exc).__name__}); "
            "give a recipe path relative to the config file"
        ) from exc
    if not isinstance(base, dict):
        raise ConfigError(f"{recipe_path}: a recipe must be a YAML mapping")
    if config.student_prepare is not None:
        prep = path.parent / config.student_prepare
        if not prep.is_file():
            raise ConfigError(
                f"{path}: student_prepare {config.student_prepare!r} does not exist (looked "
                f"at {prep}); give an sft recipe path relative to the config file"
            )
    return config, base


def merge_overrides(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in, nested mappings key by key (an arm's overrides)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_overrides(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def cell_recipe(
    config: BenchmarkConfig, base: dict[str, Any], arm: Arm, seed: int, out_dir: Path
) -> dict[str, Any]:
    """The recipe of one cell: base, arm overrides, then mode, seed, budget and run folder.

    A relative ``cache.dir`` names a folder under the benchmark's output folder: the
    cells that give the same one (an arm's seeds) share one targets cache, so a fixed
    set one of them scored is free for the others.
    """
    recipe = merge_overrides(base, arm.overrides)
    cache = recipe.get("cache")
    if isinstance(cache, dict) and cache.get("dir") and not Path(cache["dir"]).is_absolute():
        cache["dir"] = str(out_dir / cache["dir"])
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
        # An arm's own train.cycles caps its updates under a wall-time budget (a fixed
        # set is played for the planned cycles: SeqKD's teacher plays no more than it needs).
        own = (arm.overrides.get("train") or {}).get("cycles")
        train["cycles"] = min(int(own), config.budget.max_updates) if own else config.budget.max_updates
        train["max_wall_s"] = config.budget.wall_s
    return recipe


def digest(obj: Any) -> str:
    """``sha256:`` over the canonical JSON of ``obj`` (config, recipe)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + sha256_text(text)


def committed_output_dir(config: BenchmarkConfig) -> Path:
    """Where the committed results of ``config`` live (written only when asked to)."""
    return (
        Path(config.output_dir) if config.output_dir else Path("benchmarks/results") / config.name
    )


def fresh_output_dir(config: BenchmarkConfig) -> Path:
    """Where a run writes unless told otherwise: a git-ignored folder of its own."""
    return Path("runs") / "benchmarks" / config.name
