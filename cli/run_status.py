"""What ``miniverl status RUN`` says about a run that is not running.

A finished (or failed, or stopped) run has no control socket to ask, so the summary is
read back from its directory: ``status.json``, ``events.jsonl``, ``metrics.jsonl`` and
the manifest. It gives the steps (on- and off-policy), greedy held-out success before
and after when the run evaluated, the wall time, why it stopped, and where its
artifacts are, with the commands that read them.

Torch-free and read-only; a file that is missing or unreadable leaves its line out
rather than failing the command (``report`` is the place that checks every file).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from miniverl.common.errors import MiniverlError
from miniverl.common.manifest import read_manifest
from miniverl.common.rundir import RunDir
from miniverl.student.report.summary import fmt_by_teacher, last_by_teacher

TERMINAL = ("run_completed", "run_failed", "run_interrupted")


def _stamp(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def _wall_s(events: list[dict[str, Any]]) -> float | None:
    """Seconds from each ``run_started`` to the end that followed it, summed (resumes)."""
    total, start, seen = 0.0, None, False
    for event in events:
        stamp = _stamp(event.get("ts"))
        if stamp is None:
            continue
        if event.get("event") == "run_started":
            start = stamp
        elif event.get("event") in TERMINAL and start is not None:
            total += (stamp - start).total_seconds()
            start, seen = None, True
    return total if seen else None


def _success(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    evals = [e for e in events if e.get("event") == "eval"
             and isinstance(e.get("success"), (int, float)) and isinstance(e.get("version"), int)]
    if not evals:
        return None
    split = Counter(e.get("split", "eval") for e in evals).most_common(1)[0][0]
    rows = sorted((e for e in evals if e.get("split", "eval") == split),
                  key=lambda e: e["version"])
    first, last = rows[0], rows[-1]
    # A mixture's last eval holds each environment's success too.
    envs = last.get("by_environment")
    return {"split": split, "n": last.get("n"), "before": first["success"],
            "before_version": first["version"], "after": last["success"],
            "after_version": last["version"],
            **({"by_environment": envs} if isinstance(envs, dict) else {})}


def _steps(metrics: list[dict[str, Any]], manifest: dict[str, Any]) -> dict[str, Any]:
    # Rows with an integer step only: a damaged row leaves the count, not a traceback.
    rows = [r for r in metrics if isinstance(r.get("step"), int)]
    total = max((r["step"] for r in rows), default=0)
    counted = manifest.get("steps")
    on, off = (counted.get("on_policy"), counted.get("off_policy")) if isinstance(
        counted, dict) else (None, None)
    if not (isinstance(on, int) and isinstance(off, int) and on + off == total and total):
        # a run that did not finish has no counts in its manifest yet
        on = len({r["step"] for r in rows if r.get("on_policy") is True})
        off = total - on
    warmup = len({r["step"] for r in rows if r.get("phase") == "sft_warmup"})
    version = manifest.get("final_version")
    if not isinstance(version, int):
        versions = [r["version"] for r in metrics if isinstance(r.get("version"), int)]
        version = max(versions) if versions else None
    return {"total": total, "on_policy": on, "off_policy": off, "sft_warmup": warmup,
            "final_version": version}


def _latest_checkpoint(run: RunDir) -> Path | None:
    found = [(int(p.name[5:]), p) for p in run.checkpoints_dir.glob("step_*")
             if p.name[5:].isdigit() and (p / "state.json").is_file()]
    return max(found)[1] if found else None


def finished_summary(run: RunDir) -> dict[str, Any]:
    """The facts ``status`` prints for a run that is not running, as data."""
    status = run.read_status()
    events, metrics = run.events(), run.metrics()
    try:
        manifest = read_manifest(run)
    except (MiniverlError, OSError, ValueError):
        manifest = {}
    mode = manifest.get("mode") or next((r["mode"] for r in metrics if r.get("mode")), None)
    checkpoint = _latest_checkpoint(run)
    artifacts = {
        "report": run.report_path if run.report_path.is_file() else None,
        "checkpoint": checkpoint,
        "metrics": run.metrics_path if run.metrics_path.is_file() else None,
        "trajectories": run.trajectories_path if run.trajectories_path.is_file() else None,
        "eval": run.eval_dir if any(run.eval_dir.glob("*.json*")) else None,
        "logs": run.logs_dir if any(run.logs_dir.glob("*")) else None,
    }
    return {
        "run_id": run.id, "status": status.get("status"), "reason": status.get("reason"),
        "updated_at": status.get("updated_at"), "mode": mode,
        "steps": _steps(metrics, manifest), "success": _success(events),
        "wall_s": _wall_s(events), "path": str(run.path),
        "by_teacher": last_by_teacher(metrics),
        "artifacts": {k: str(v) for k, v in artifacts.items() if v is not None},
    }


def finished_lines(s: dict[str, Any]) -> list[str]:
    """``finished_summary`` as the lines ``status`` prints."""
    lines = [f"{s['run_id']}: {s['status']} (not running; updated {s['updated_at']})"]
    if s.get("reason"):
        lines.append(f"  reason     {s['reason']}")
    steps = s["steps"]
    if steps["total"]:
        kinds = f"{steps['on_policy']} on-policy, {steps['off_policy']} off-policy"
        if steps["sft_warmup"] and steps["sft_warmup"] == steps["off_policy"]:
            kinds += ": the SFT warm-up"
        elif steps["sft_warmup"]:
            kinds += f", {steps['sft_warmup']} of them the SFT warm-up"
        lines.append(f"  steps      {steps['total']} optimizer steps ({kinds}), mode "
                     f"{s['mode']}, parameter version {steps['final_version']}")
    success = s["success"]
    if success:
        if success["after_version"] != success["before_version"]:
            figure = (f"{success['before']:.1%} -> {success['after']:.1%} (v"
                      f"{success['before_version']} -> v{success['after_version']})")
        else:
            figure = f"{success['before']:.1%} at v{success['before_version']} (no eval after)"
        lines.append(f"  success    {figure}, greedy on the {success['split']} split, "
                     f"{success['n']} tasks")
        for name, env in (success.get("by_environment") or {}).items():
            lines.append(f"             {name} {float(env['success']):.1%} at v"
                         f"{success['after_version']} ({env.get('n')} tasks, weight "
                         f"{float(env.get('weight', 0)):g})")
    for i, line in enumerate(fmt_by_teacher(s.get("by_teacher") or {})):
        lines.append(f"  {'teachers' if i == 0 else '':<10} {line}")
    if s["wall_s"] is not None:
        lines.append(f"  wall time  {s['wall_s']:.1f} s")
    art = s["artifacts"]
    where = [f"{Path(art[k]).relative_to(s['path'])}{tail} ({label})" for k, tail, label in (
        ("report", "", "open in a browser"), ("checkpoint", "", "the last checkpoint"),
        ("metrics", "", "one row per step"), ("trajectories", "", "episodes trained on"),
        ("eval", "/", "held-out evals"), ("logs", "/", "process logs")) if k in art]
    lines.append(f"  artifacts  {s['path']}: " + (", ".join(where) if where else "none yet"))
    nxt = [f"miniverl report {s['path']}" if "report" not in art else None,
           f"miniverl inspect {s['path']}" if "trajectories" in art or "eval" in art else None]
    if s["status"] in ("interrupted", "failed"):
        nxt.append(f"miniverl up RECIPE --resume --run-id {s['run_id']} --output-dir "
                   f"{Path(s['path']).parent} (RECIPE: the one it was started with)")
    nxt = [n for n in nxt if n]
    if nxt:
        lines.append("  next       " + "; ".join(nxt))
    return lines
