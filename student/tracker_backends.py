"""The four experiment trackers behind ``run.loggers``, each through its library's own API.

Every backend takes the same calls from :class:`~miniverl.student.trackers.Trackers`:
``log(scalars, step)``, ``annotate(event, text, step)``, ``set_teacher(identity, step)``
and ``close(status)``; ``where`` says where its records go. Where each one writes:

- ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter`` event files in
  ``<run>/tensorboard/`` (``tensorboard --logdir runs`` shows every run); annotations
  (all events of a step in one text) and the config are text summaries.
- ``wandb``: ``wandb.init`` with ``dir=<run>``, the run id as W&B id (a resumed run
  continues), project ``$WANDB_PROJECT`` or ``miniverl``; ``WANDB_MODE=offline`` keeps
  it on disk. Annotations go into an ``events`` table at the end.
- ``mlflow``: ``MlflowClient`` on ``$MLFLOW_TRACKING_URI``, else a local store
  ``sqlite:///<output_dir>/mlflow.db`` with artifacts in ``<output_dir>/mlartifacts``;
  experiment ``$MLFLOW_EXPERIMENT_NAME`` or ``miniverl``; the run is found again by its
  ``miniverl.run_id`` tag on resume. Annotations are the ``events.txt`` artifact, the
  teacher a tag.
- ``trackio``: ``trackio.init`` (its local store, ``$TRACKIO_DIR``), project
  ``miniverl``, run name = run id, ``resume="allow"``; teacher changes, refusals and
  failures are trackio alerts, and every annotation goes into an ``events`` table.

This module holds no policy (what is sent, when): that is ``trackers.py``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Protocol

from miniverl.common.errors import require
from miniverl.common.recipe import dotted_items
from miniverl.common.rundir import RunDir

PROJECT = "miniverl"
FAILED_STATUSES = frozenset({"failed", "interrupted"})


class Backend(Protocol):
    name: str
    where: str

    def log(self, scalars: dict[str, float], step: int) -> None: ...
    def annotate(self, event: str, text: str, step: int) -> None: ...
    def set_teacher(self, identity: dict[str, Any], step: int) -> None: ...
    def close(self, status: str) -> None: ...


def shown(value: Any) -> str:
    """A config value as text: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


class TensorBoardBackend:
    name = "tensorboard"

    def __init__(self, run: RunDir, recipe: Any, config: dict[str, Any]):
        require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.where = str(run.path / "tensorboard")
        self.writer = SummaryWriter(log_dir=self.where)
        self.notes: dict[int, list[str]] = {}
        rows = "\n".join(f"| {k} | {shown(v)} |" for k, v in dotted_items(config).items())
        self.writer.add_text("config", f"| key | value |\n| --- | --- |\n{rows}", 0)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def annotate(self, event: str, text: str, step: int) -> None:
        # TensorBoard shows one text per tag and step (the last written): each write
        # carries every event of its step so far, so none is hidden behind another.
        lines = self.notes.setdefault(step, [])
        lines.append(f"**{event}** {text}")
        self.writer.add_text("events", "\n\n".join(lines), step)

    def set_teacher(self, identity: dict[str, Any], step: int) -> None:
        self.writer.add_text("config/teacher", json.dumps(identity, default=str), step)

    def close(self, status: str) -> None:
        self.writer.close()


class WandbBackend:
    name = "wandb"

    def __init__(self, run: RunDir, recipe: Any, config: dict[str, Any]):
        self.wandb = require("wandb", "wandb")
        self.run = self.wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT), name=run.id, id=run.id,
            dir=str(run.path), config=config, resume="allow",
            tags=[recipe.run.mode,
                  *(env.name for env in recipe.environments or [recipe.environment])],
        )
        self.where = str(run.path / "wandb")
        self.events: list[list[Any]] = []
        self.step = 0

    def log(self, scalars: dict[str, float], step: int) -> None:
        # W&B drops a row whose step goes backwards (an eval event recorded after a later
        # metrics row): hold the step instead, the value still lands in the run.
        self.step = max(self.step, step)
        self.run.log(scalars, step=self.step)

    def annotate(self, event: str, text: str, step: int) -> None:
        self.events.append([step, event, text])

    def set_teacher(self, identity: dict[str, Any], step: int) -> None:
        self.run.config.update({"teacher_identity": identity}, allow_val_change=True)

    def close(self, status: str) -> None:
        if self.events:
            table = self.wandb.Table(columns=["version", "event", "details"], data=self.events)
            self.run.log({"events": table}, step=self.step)
        self.run.finish(exit_code=1 if status in FAILED_STATUSES else 0)


class MlflowBackend:
    name = "mlflow"

    def __init__(self, run: RunDir, recipe: Any, config: dict[str, Any]):
        mlflow = require("mlflow", "mlflow")
        self.entities = mlflow.entities
        out = Path(recipe.run.output_dir).resolve()
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{out / 'mlflow.db'}"
        self.client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            local = None if os.environ.get("MLFLOW_TRACKING_URI") else str(out / "mlartifacts")
            experiment_id = self.client.create_experiment(name, artifact_location=local)
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`miniverl.run_id` = '{run.id}'", max_results=1
        )
        if found:  # a resumed run continues its MLflow run
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            created = self.client.create_run(
                experiment_id, run_name=run.id,
                tags={"miniverl.run_id": run.id, "mode": recipe.run.mode},
            )
            self.run_id = created.info.run_id
            params = [self.entities.Param(k, shown(v)[:6000]) for k, v in dotted_items(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.where = f"{uri} (experiment {name}, run {self.run_id})"
        self.events: list[str] = []

    def log(self, scalars: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [self.entities.Metric(k, v, now, step) for k, v in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def annotate(self, event: str, text: str, step: int) -> None:
        self.events.append(f"version {step}  {event}  {text}")

    def set_teacher(self, identity: dict[str, Any], step: int) -> None:
        self.client.set_tag(self.run_id, "teacher", json.dumps(identity, default=str)[:5000])

    def close(self, status: str) -> None:
        if self.events:
            self.client.log_text(self.run_id, "\n".join(self.events) + "\n", "events.txt")
        final = {"completed": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED")
        self.client.set_terminated(self.run_id, status=final)


class TrackioBackend:
    name = "trackio"

    def __init__(self, run: RunDir, recipe: Any, config: dict[str, Any]):
        self.trackio = require("trackio", "trackio")
        self.run = self.trackio.init(project=PROJECT, name=run.id, config=config,
                                     resume="allow")
        self.where = f"{self.trackio.TRACKIO_DIR} (project {PROJECT})"
        self.events: list[list[Any]] = []
        self.step = 0

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.step = max(self.step, step)
        self.run.log(scalars, step=step)

    def annotate(self, event: str, text: str, step: int) -> None:
        self.events.append([step, event, text])
        level = self.trackio.AlertLevel
        if event in ("run_failed", "tracker_failed"):
            self.run.alert(event, text, level=level.ERROR, step=step)
        elif event.endswith(("_refused", "_reached", "_interrupted", "_gave_up")):
            self.run.alert(event, text, level=level.WARN, step=step)
        elif event.startswith("teacher_"):
            self.run.alert(event, text, level=level.INFO, step=step)

    def set_teacher(self, identity: dict[str, Any], step: int) -> None:
        pass  # a trackio config is fixed at init: the teacher's alert carries the identity

    def close(self, status: str) -> None:
        if self.events:
            table = self.trackio.Table(columns=["version", "event", "details"], data=self.events)
            self.run.log({"events": table}, step=self.step)
        self.run.finish()


BACKENDS: dict[str, type] = {
    "tensorboard": TensorBoardBackend,
    "wandb": WandbBackend,
    "mlflow": MlflowBackend,
    "trackio": TrackioBackend,
}
