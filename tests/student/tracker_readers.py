"""Read back what each experiment tracker wrote, with that tracker's own reader.

Each reader returns ``(last, config, notes)``: the last value of every scalar, the run
config, and the annotation texts. TensorBoard through its ``EventAccumulator``; W&B's
offline transaction log through ``wandb leet inspect --summary --json``; MLflow through
``MlflowClient``; trackio through its ``SQLiteStorage``. ``expected_last`` computes the
values every tracker must hold from the run's own ``metrics.jsonl`` and ``events.jsonl``.
Not a test module: imported by tests/student/test_trackers.py.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

Readback = tuple[dict[str, float], dict[str, Any], list[str]]


def expected_last(run_dir: Path) -> dict[str, float]:
    """The last finite value of every numeric ``metrics.jsonl`` column (but ``step`` and
    ``ts``), and ``<split>/success`` of the last eval event of each split."""
    last: dict[str, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        for key, value in json.loads(line).items():
            if key in ("step", "ts") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                last[key] = float(value)
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "eval":
            last[f"{event['split']}/success"] = float(event["success"])
    return last


def tensorboard(run_dir: Path) -> Readback:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0,
                                                                        "tensors": 0})
    acc.Reload()
    last = {}
    for tag in acc.Tags()["scalars"]:
        events = sorted(acc.Scalars(tag), key=lambda e: (e.step, e.wall_time))
        last[tag] = events[-1].value
    # TensorBoard shows the last text written at each step: read it as the UI does.
    texts = {}
    for tag in acc.Tags()["tensors"]:
        if tag.endswith("/text_summary"):
            by_step = {t.step: t.tensor_proto.string_val[0].decode() for t in acc.Tensors(tag)}
            texts[tag] = [by_step[step] for step in sorted(by_step)]
    config = {"config": "\n".join(texts.get("config/text_summary", [])),
              "teacher": texts.get("config/teacher/text_summary", [])}
    return last, config, texts.get("events/text_summary", [])


def wandb(run_dir: Path) -> Readback:
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, f"no offline W&B run under {run_dir / 'wandb'}"
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(files[-1])],
        capture_output=True, text=True, timeout=120, check=True,
    )
    state = json.loads(proc.stdout)
    summary = state["summary"]
    last = {k: float(v) for k, v in summary.items()
            if isinstance(v, (int, float)) and not k.startswith("_")}
    notes = []
    table = summary.get("events")
    if isinstance(table, dict) and table.get("path"):
        data = json.loads((files[-1].parent / "files" / table["path"]).read_text())
        notes = [f"{row[1]}: {row[2]}" for row in data["data"]]
    config = {**state["config"], "_state": state["state"], "_project": state["project"],
              "_run_id": state["run_id"]}
    return last, config, notes


def mlflow(output_dir: Path, run_id: str) -> Readback:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{output_dir.resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("miniverl")
    runs = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`miniverl.run_id` = '{run_id}'")
    assert len(runs) == 1, f"{len(runs)} MLflow runs tagged {run_id}"
    run = runs[0]
    notes = []
    artifact = client.download_artifacts(run.info.run_id, "events.txt", str(output_dir))
    notes = Path(artifact).read_text().splitlines()
    config = {**run.data.params, "_tags": run.data.tags, "_status": run.info.status}
    return dict(run.data.metrics), config, notes


def trackio(run_id: str) -> Readback:
    from trackio import SQLiteStorage

    last: dict[str, float] = {}
    for row in SQLiteStorage.get_logs("miniverl", run_id):
        for key, value in row.items():
            if key not in ("step", "timestamp") and isinstance(value, (int, float)):
                last[key] = float(value)
    config = SQLiteStorage.get_run_config("miniverl", run_id) or {}
    notes = [f"{a['title']}: {a['text']}" for a in SQLiteStorage.get_alerts("miniverl",
                                                                            run_name=run_id)]
    return last, config, notes
