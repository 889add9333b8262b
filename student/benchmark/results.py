"""The schema of a benchmark's ``results.json``, and reading one finished run into a cell.

:class:`BenchmarkResults` holds every arm × seed :class:`CellRecord` and the per-arm
:class:`ArmSummary`; ``miniverl schema benchmark-results`` prints its JSON Schema.
:func:`cell_result_from_run` reads a finished run directory (through the torch-free
report reader) into a :class:`CellResult`.

This module runs nothing and imports no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from miniverl.common.errors import ConfigError
from miniverl.student.benchmark.config import Metric, StrictModel
from miniverl.student.report.load import load_run


class CellResult(StrictModel):
    """What one arm × seed training run produced."""

    status: Literal["ok", "failed"] = "ok"
    run_dir: str | None = None  # in a results.json: relative to the folder that holds it
    final_version: int | None = None
    updates: int | None = Field(None, ge=0)
    wall_s: float | None = Field(None, ge=0)
    success_before: float | None = Field(None, ge=0, le=1)
    success_after: float | None = Field(None, ge=0, le=1)
    # Environments with injected faults (the eval summary's ``faults``), else None.
    faulted_success_before: float | None = Field(None, ge=0, le=1)
    faulted_success_after: float | None = Field(None, ge=0, le=1)
    fault_free_success_before: float | None = Field(None, ge=0, le=1)
    fault_free_success_after: float | None = Field(None, ge=0, le=1)
    recovery_before: float | None = Field(None, ge=0, le=1)
    recovery_after: float | None = Field(None, ge=0, le=1)
    # eval.samples set: mean success over N sampled episodes per task (the summary's
    # ``sampled``, student/eval_sampling.py), beside the greedy success above.
    sampled_success_before: float | None = Field(None, ge=0, le=1)
    sampled_success_after: float | None = Field(None, ge=0, le=1)
    # A fixed set that is a function of the task: the evaluated episodes' share of
    # turn-start states its source never shows (the summary's ``coverage``).
    unseen_states_before: float | None = Field(None, ge=0, le=1)
    unseen_states_after: float | None = Field(None, ge=0, le=1)
    final_loss: float | None = None
    positions_per_s: float | None = None
    peak_memory_bytes: int | None = Field(None, ge=0)
    loss_curve: list[float] = Field(default_factory=list)
    error: str | None = None


class CellRecord(StrictModel):
    arm: str
    seed: int
    recipe_digest: str
    budget_matched: bool | None = None
    finished_at: str
    result: CellResult


class ArmSummary(StrictModel):
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


class BenchmarkResults(StrictModel):
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


def benchmark_results_json_schema() -> dict[str, Any]:
    """JSON Schema of ``results.json`` (``miniverl schema benchmark-results``)."""
    return BenchmarkResults.model_json_schema()


def load_results(path: str | Path) -> BenchmarkResults:
    """A ``results.json`` written earlier (``--resume``, ``export-benchmark``)."""
    path = Path(path)
    try:
        return BenchmarkResults.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError, ValueError) as exc:
        raise ConfigError(
            f"{path} is not a readable benchmark results file ({type(exc).__name__}); "
            "start again without --resume in a fresh output_dir"
        ) from exc


def cell_result_from_run(run_dir: str | Path, **known: Any) -> CellResult:
    """Read a finished run directory into a :class:`CellResult` (``known`` fields win)."""
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
    for when, row in (("before", before), ("after", after or before)):
        faults = (row or {}).get("faults")
        if isinstance(faults, dict):
            fields[f"faulted_success_{when}"] = (faults.get("faulted") or {}).get("success")
            fields[f"fault_free_success_{when}"] = (faults.get("fault_free") or {}).get("success")
            fields[f"recovery_{when}"] = (faults.get("recovery") or {}).get("rate")
        sampled, coverage = (row or {}).get("sampled"), (row or {}).get("coverage")
        if isinstance(sampled, dict):
            fields[f"sampled_success_{when}"] = sampled.get("success")
        if isinstance(coverage, dict):
            fields[f"unseen_states_{when}"] = coverage.get("unseen_share")
    fields.update({k: v for k, v in known.items() if v is not None})
    return CellResult(**fields)
