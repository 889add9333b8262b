"""Shareable hardware results: what a run or benchmark measured, with nothing private in it.

``export_benchmark(source, out)`` reads a run directory or a benchmark
``results.json`` and writes a :class:`HardwareResult`: device, memory, software
versions, throughput, peak memory and the recipe digest. The whole record passes
through :func:`miniverl.common.redact.redact` (secrets and local paths) before it is
validated against the schema and written. ``benchmark_result_json_schema()`` is the
JSON Schema that ``miniverl schema benchmark`` prints.

Hardware comes from the run's manifest when it recorded it; otherwise from the
machine doing the export, and ``hardware_source`` says so. This module imports no
torch and never reads model weights.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from miniverl.common.atomic import atomic_write_text
from miniverl.common.clock import utc_now
from miniverl.common.errors import ConfigError
from miniverl.common.hashing import sha256_text
from miniverl.common.manifest import PACKAGES, git_info, package_versions
from miniverl.common.redact import redact
from miniverl.common.rundir import RunDir
from miniverl.student.benchmark.config import StrictModel
from miniverl.student.benchmark.results import cell_result_from_run, load_results
from miniverl.student.report.load import load_run

# The versions a shared result lists: a manifest's packages less the optional extras.
EXPORTED_PACKAGES = tuple(
    name
    for name in PACKAGES
    if name not in {"accelerate", "bitsandbytes", "pydantic", "msgpack", "pyarrow"}
)


class ArmResult(StrictModel):
    arm: str
    n: int
    mean: float | None
    diff_vs_baseline: float | None
    diff_low: float | None
    diff_high: float | None
    mean_wall_s: float | None


class DeviceInfo(StrictModel):
    kind: str = Field(description="cpu, cuda, mps or unknown.")
    name: str | None = Field(None, description="Accelerator or CPU model name.")
    count: int | None = Field(None, ge=0, description="Number of devices of this kind.")
    memory_bytes: int | None = Field(None, ge=0, description="Memory of one device.")


class HostInfo(StrictModel):
    os: str | None = None
    machine: str | None = None
    cpu_count: int | None = Field(None, ge=0)
    memory_bytes: int | None = Field(None, ge=0)


class Throughput(StrictModel):
    positions_per_s: float | None = Field(None, description="Teacher-scored positions per second.")
    step_time_s: float | None = Field(None, description="Mean optimizer-step wall time.")
    bytes_sent: float | None = Field(None, description="Bytes sent to the teacher.")
    bytes_received: float | None = Field(None, description="Bytes received from the teacher.")


class HardwareResult(StrictModel):
    """A shareable, redacted measurement (``miniverl export-benchmark``)."""

    schema_version: Literal[1] = 1
    kind: Literal["miniverl.hardware_result"] = "miniverl.hardware_result"
    created_at: str
    source: Literal["run", "benchmark"]
    name: str
    hardware_source: Literal["manifest", "this_machine"]
    device: DeviceInfo
    host: HostInfo
    python: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    models: dict[str, str] = Field(default_factory=dict)
    mode: str | None = None
    steps: int | None = Field(None, ge=0)
    final_version: int | None = None
    success_before: float | None = Field(None, ge=0, le=1)
    success_after: float | None = Field(None, ge=0, le=1)
    throughput: Throughput = Field(default_factory=Throughput)
    peak_memory_bytes: int | None = Field(None, ge=0)
    recipe_digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")
    metric: str | None = None
    baseline: str | None = None
    arms: list[ArmResult] = Field(default_factory=list)


def benchmark_result_json_schema() -> dict[str, Any]:
    """JSON Schema of the exported hardware result (``miniverl schema benchmark``)."""
    return HardwareResult.model_json_schema()


# -- this machine ------------------------------------------------------------------------


def _host_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _versions() -> dict[str, str]:
    """Installed versions of :data:`EXPORTED_PACKAGES`; packages not installed are left out."""
    return {k: v for k, v in package_versions(EXPORTED_PACKAGES).items() if v is not None}


def collect_environment() -> dict[str, Any]:
    """Facts about this machine and the code measured (its commit and whether the tree had
    uncommitted changes), torch-free (accelerators are known only from manifests)."""
    return {
        "git": git_info(),
        "python": platform.python_version(),
        "host": {
            "os": f"{platform.system()} {platform.release()}",
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "memory_bytes": _host_memory(),
        },
        "versions": _versions(),
    }


# -- from a manifest ----------------------------------------------------------------------


def _device_from(hardware: dict[str, Any]) -> DeviceInfo | None:
    """Device facts from a manifest's ``hardware`` (common/manifest.py's hardware_info)."""
    if not hardware:
        return None
    gpus = [g for g in hardware.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        memory = gpus[0].get("total_memory_bytes") or gpus[0].get("memory_bytes")
        return DeviceInfo(
            kind="cuda",
            name=str(gpus[0].get("name")) if gpus[0].get("name") else None,
            count=len(gpus),
            memory_bytes=int(memory) if isinstance(memory, (int, float)) else None,
        )
    processor = hardware.get("processor") or hardware.get("machine")
    return DeviceInfo(kind="cpu", name=str(processor) if processor else None, count=1)


def _model_label(entry: Any) -> str | None:
    """``id`` of a hub/path model, or the toy spec, from a manifest ``models`` entry."""
    if isinstance(entry, str):
        return entry
    if not isinstance(entry, dict):
        return None
    if entry.get("id"):
        revision = f"@{entry['revision']}" if entry.get("revision") else ""
        return f"{entry['id']}{revision}"
    if isinstance(entry.get("toy"), dict):
        return "toy " + json.dumps(entry["toy"], sort_keys=True)
    return None


def _from_run(run_dir: Path) -> dict[str, Any]:
    data = load_run(run_dir)
    cell = cell_result_from_run(run_dir)
    manifest = data.manifest
    here = collect_environment()
    hardware = manifest.get("hardware") if isinstance(manifest.get("hardware"), dict) else {}
    device = _device_from(hardware)
    digest = manifest.get("recipe_digest")
    if not (isinstance(digest, str) and digest.startswith("sha256:")) and data.resolved_text:
        digest = "sha256:" + sha256_text(data.resolved_text)
    times = [
        sum(
            float(r.get(k) or 0) for k in ("time_rollout_s", "time_teacher_wait_s", "time_update_s")
        )
        for r in data.metrics
    ]
    tp = data.throughput()
    packages = manifest.get("packages") if isinstance(manifest.get("packages"), dict) else {}
    models_raw = manifest.get("models") if isinstance(manifest.get("models"), dict) else {}
    models = {
        role: label
        for role in ("student", "teacher")
        if (label := _model_label(models_raw.get(role)))
    }
    return {
        "source": "run",
        "name": data.run_id,
        "hardware_source": "manifest" if device else "this_machine",
        "device": (
            device or DeviceInfo(kind="cpu", name=platform.processor() or None)
        ).model_dump(),
        "host": {
            "os": manifest.get("os") if device else here["host"]["os"],
            "machine": hardware.get("machine") if device else here["host"]["machine"],
            "cpu_count": hardware.get("cpu_count") if device else here["host"]["cpu_count"],
            "memory_bytes": hardware.get("memory_bytes")
            if device
            else here["host"]["memory_bytes"],
        },
        "python": str(manifest["python"]) if manifest.get("python") else None,
        "versions": {str(k): str(v) for k, v in packages.items() if v is not None},
        "models": models,
        "mode": data.mode,
        "steps": data.steps,
        "final_version": cell.final_version,
        "success_before": cell.success_before,
        "success_after": cell.success_after,
        "throughput": {
            "positions_per_s": tp["positions_per_s"],
            "step_time_s": sum(times) / len(times) if times else None,
            "bytes_sent": tp["bytes_sent"],
            "bytes_received": tp["bytes_received"],
        },
        "peak_memory_bytes": cell.peak_memory_bytes,
        "recipe_digest": digest
        if isinstance(digest, str) and digest.startswith("sha256:")
        else None,
    }


def _from_results(path: Path) -> dict[str, Any]:
    results = load_results(path)
    env = results.environment or collect_environment()
    ok = [c.result for c in results.cells if c.result.status == "ok"]
    rates = [r.positions_per_s for r in ok if r.positions_per_s is not None]
    peaks = [r.peak_memory_bytes for r in ok if r.peak_memory_bytes is not None]
    return {
        "source": "benchmark",
        "name": results.name,
        "hardware_source": "this_machine",
        "device": {"kind": "cpu", "name": platform.processor() or None},
        "host": env.get("host", {}),
        "python": env.get("python"),
        "versions": env.get("versions", {}),
        "throughput": {"positions_per_s": sum(rates) / len(rates) if rates else None},
        "peak_memory_bytes": max(peaks) if peaks else None,
        "recipe_digest": results.config_digest,
        "metric": results.metric,
        "baseline": results.baseline,
        "arms": [
            {
                "arm": s.arm,
                "n": s.n_ok,
                "mean": s.mean,
                "diff_vs_baseline": s.diff_vs_baseline,
                "diff_low": s.diff_low,
                "diff_high": s.diff_high,
                "mean_wall_s": s.mean_wall_s,
            }
            for s in results.summary
        ],
    }


def _check_json_object(path: Path) -> None:
    """Refuse a file that is not a JSON object (binary, truncated, a list)."""
    try:
        ok = isinstance(json.loads(path.read_bytes()), dict)
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(
            f"{path} is not a JSON object; the file is corrupted, restore it from a copy or rerun"
        )


def build_hardware_result(source: str | Path) -> HardwareResult:
    """The redacted, validated result for a run directory or a benchmark results file."""
    source = Path(source)
    if source.is_dir():
        # A shared result must not come from a run whose status or manifest is unreadable.
        run = RunDir.open(source)
        run.read_status()
        if run.manifest_path.is_file():
            _check_json_object(run.manifest_path)
        record = _from_run(source)
    elif source.is_file():
        record = _from_results(source)
    else:
        raise ConfigError(
            f"{source} is neither a run directory nor a benchmark results.json; "
            "pass runs/<id> or benchmarks/results/<name>/results.json"
        )
    record["created_at"] = utc_now()
    if not record.get("python"):
        record["python"] = platform.python_version() if record["source"] == "benchmark" else None
    return HardwareResult.model_validate(redact(record))


def export_benchmark(source: str | Path, out: str | Path) -> Path:
    """Write the shareable result for ``source`` to ``out`` (JSON) and return the path."""
    result = build_hardware_result(source)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, result.model_dump_json(indent=2) + "\n")
    return out
