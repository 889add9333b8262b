"""Experiment trackers: a run's metrics and events mirrored into TensorBoard, W&B, MLflow, trackio.

``run.loggers`` in the recipe (and ``--logger`` on ``train`` and ``up``) names them;
``jsonl`` (the run's own ``metrics.jsonl`` and ``events.jsonl``) is always on. Each
tracker is an optional extra: a missing one stops the run before it starts, with one
line naming the extra to install (:func:`check_loggers`).

:func:`open_trackers` starts the chosen trackers with the run id, the recipe digest, the
teacher and the redacted recipe as run config, and observes the run directory: every
metrics row and every event the run writes reaches every tracker the same way:

- each numeric column of a metrics row (``loss``, ``divergence``, ``train_success``,
  ``bytes_sent``, ``bytes_received``, ``stale_dropped``, ...) under its
  ``metrics.jsonl`` name, at the row's ``step``; non-finite values are not sent;
- each ``eval`` event as ``<split>/success`` at its ``version``;
- each teacher change (``teacher_connected``, ``teacher_changed``) as
  ``teacher/changes`` (a running count), and the new identity as run config;
- every event as an annotation (a text line with its fields, local paths redacted).

A tracker that fails while the run goes on is closed and recorded as a
``tracker_failed`` event: a dashboard never stops training. The backends
(:mod:`~miniverl.student.tracker_backends`) call each library's own API; this module
imports no tracker library and no torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import threading
from collections.abc import Sequence
from typing import Any

from miniverl.common.errors import ConfigError, MissingExtraError, ProvenanceError
from miniverl.common.manifest import read_manifest
from miniverl.common.recipe import Recipe, recipe_dict, recipe_digest
from miniverl.common.recipe_sections import LOGGERS, RunConfig
from miniverl.common.redact import redact, redact_text
from miniverl.common.rundir import RunDir
from miniverl.student.tracker_backends import BACKENDS, Backend

# The module each tracker imports; its extra has the tracker's own name.
TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow",
                   "trackio": "trackio"}
TEACHER_EVENTS = frozenset({"teacher_connected", "teacher_changed"})
NOT_SCALARS = frozenset({"ts", "step"})  # the time stamp, and the x axis itself


def check_loggers(loggers: Sequence[str]) -> None:
    """Raise :class:`MissingExtraError` for the first chosen tracker that is not installed.

    Only looks the packages up (``importlib.util.find_spec``): importing them is slow,
    and a run must fail on a missing extra before it creates anything.
    """
    for name in loggers:
        module = TRACKER_MODULES.get(name)
        if module is not None and importlib.util.find_spec(module) is None:
            raise MissingExtraError(module, name)


def with_loggers(recipe: Recipe, extra: Sequence[str] | None) -> Recipe:
    """``recipe`` with the ``--logger`` names added to ``run.loggers``."""
    unknown = [name for name in extra or () if name not in LOGGERS]
    if unknown:
        raise ConfigError(
            f"--logger {unknown[0]!r} is not a logger; use one of {', '.join(LOGGERS)} "
            "(repeat --logger for several)"
        )
    if not extra:
        return recipe
    run = RunConfig.model_validate(
        {**recipe.run.model_dump(), "loggers": [*recipe.run.loggers, *extra]}
    )
    return recipe.model_copy(update={"run": run})


def metric_scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numeric columns of a metrics row that trackers receive (finite numbers only)."""
    return {key: float(value) for key, value in row.items()
            if key not in NOT_SCALARS and _finite(value)}


def event_text(record: dict[str, Any]) -> str:
    """One line for an event: its fields as compact JSON, local paths and secrets redacted."""
    fields = {k: v for k, v in record.items() if k not in ("ts", "event")}
    if record.get("event") == "teacher_changed":
        head = (f"teacher {fields.get('how', 'change')}: {_label(fields.get('old'))} -> "
                f"{_label(fields.get('new'))} at version {fields.get('version')}")
        return redact_text(head)
    # redact() first: a value under a secret-named key (`admin_token`) matches no text
    # rule once it is JSON.
    return redact_text(json.dumps(redact(fields), sort_keys=True, default=str,
                                  separators=(", ", ": ")))


def run_config(run: RunDir, recipe: Recipe) -> dict[str, Any]:
    """What every tracker records as the run's config (shared dashboards: redacted)."""
    try:
        digest = read_manifest(run).get("recipe_digest") or recipe_digest(recipe)
    except (OSError, ValueError, ProvenanceError):
        digest = recipe_digest(recipe)
    teacher = None
    if recipe.teacher is not None:
        teacher = {"model": recipe.teacher.model.model_dump(mode="json", exclude_none=True),
                   "adapter": recipe.teacher.adapter, "mode": recipe.teacher.mode}
    return redact({
        "run_id": run.id,
        "recipe_digest": digest,
        "mode": recipe.run.mode,
        "on_policy": recipe.on_policy,
        "teacher": teacher,
        "recipe": recipe_dict(recipe),
    })


class Trackers:
    """The open trackers of one run; an observer of its :class:`RunDir`."""

    def __init__(self, run: RunDir, backends: list[Backend]):
        self.run = run
        self.backends = backends
        self.teacher_changes = 0
        self.last_step = 0
        # The control socket's thread writes events too: one caller at a time, and a
        # tracker_failed event written from inside a call must not loop back in.
        self._lock = threading.Lock()
        self._inside = threading.local()

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.backends]

    def observe(self, kind: str, record: dict[str, Any]) -> None:
        """Forward one metrics row (``kind`` ``metric``) or event to every tracker."""
        if getattr(self._inside, "busy", False) or not self.backends:
            return
        with self._lock:
            self._inside.busy = True
            try:
                if kind == "metric":
                    step = record.get("step")
                    self.last_step = step if isinstance(step, int) else self.last_step
                    self._each("log", metric_scalars(record), self.last_step)
                else:
                    self._event(record)
            finally:
                self._inside.busy = False

    def _event(self, record: dict[str, Any]) -> None:
        name = str(record.get("event"))
        version = record.get("version")
        step = version if isinstance(version, int) and not isinstance(version, bool) else (
            self.last_step)
        scalars: dict[str, float] = {}
        if name == "eval" and _finite(record.get("success")):
            scalars[f"{record.get('split', 'eval')}/success"] = float(record["success"])
        if name in TEACHER_EVENTS:
            self.teacher_changes += 1
            scalars["teacher/changes"] = float(self.teacher_changes)
            identity = record.get("new") or record.get("teacher")
            if isinstance(identity, dict):
                self._each("set_teacher", redact(identity), step)
        if scalars:
            self._each("log", scalars, step)
        self._each("annotate", name, event_text(record), step)

    def _each(self, method: str, *args: Any) -> None:
        for backend in list(self.backends):
            try:
                getattr(backend, method)(*args)
            except Exception as exc:  # a dashboard must never stop training
                self._drop(backend, exc)

    def _drop(self, backend: Backend, exc: BaseException) -> None:
        self.backends.remove(backend)
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        with contextlib.suppress(Exception):  # already broken; the event below says why
            backend.close("failed")
        self.run.event("tracker_failed", logger=backend.name, reason=redact_text(reason)[:300])

    def close(self, status: str) -> None:
        """Finish every tracker (``status``: the run's final status) and stop observing."""
        if self.observe in self.run.observers:
            self.run.observers.remove(self.observe)
        with self._lock:
            self._finish(status)

    def _finish(self, status: str) -> None:
        for backend in list(self.backends):
            try:
                backend.close(status)
            except Exception as exc:
                self.backends.remove(backend)
                self.run.event("tracker_failed", logger=backend.name,
                               reason=redact_text(f"{type(exc).__name__}: {exc}")[:300])


def open_trackers(run: RunDir, recipe: Recipe) -> Trackers:
    """Start the trackers ``recipe.run.loggers`` names and observe ``run``.

    A tracker that cannot start (not logged in, an unreachable server) stops the run
    here with one line naming the tracker; the ones already started are finished first.
    """
    names = [n for n in recipe.run.loggers if n != "jsonl"]
    check_loggers(names)
    config = run_config(run, recipe)
    backends: list[Backend] = []
    for name in names:
        try:
            backends.append(BACKENDS[name](run, recipe, config))
        except MissingExtraError:
            _close_all(backends)
            raise
        except Exception as exc:
            _close_all(backends)
            first = (str(exc).splitlines() or [""])[0][:300]
            raise ConfigError(
                f"run.loggers: {name} could not start ({type(exc).__name__}: {first}); fix "
                f"its setup (docs/tracking.md) or remove {name} from run.loggers"
            ) from None
    trackers = Trackers(run, backends)
    if backends:
        run.observers.append(trackers.observe)
        run.event("trackers_started", loggers=["jsonl", *trackers.names],
                  where={b.name: b.where for b in backends})
    return trackers


def _close_all(backends: list[Backend]) -> None:
    for backend in backends:
        with contextlib.suppress(Exception):  # the start-up error that follows is the one to report
            backend.close("failed")


def _finite(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _label(identity: Any) -> str:
    if isinstance(identity, dict):
        name = identity.get("name") or identity.get("model") or "teacher"
        gen = f" gen {identity['gen']}" if identity.get("gen") is not None else ""
        inst = f" instance {str(identity['instance'])[:8]}" if identity.get("instance") else ""
        return f"{name}{inst}{gen}"
    return str(identity or "?")
