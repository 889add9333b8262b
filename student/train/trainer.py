"""The public entry to training: :class:`Trainer` owns one run's lifetime.

Build it from a recipe (and a teacher client or endpoint for teacher modes); call
:meth:`Trainer.train`. It opens (or resumes, or adopts) the run directory under a
lock, builds the :class:`~miniverl.student.train.state.TrainState`, runs
:func:`~miniverl.student.train.loop.run`, records how the run ended (``completed``,
``interrupted``, ``failed``) and writes the report.

The trainer does not know how the teacher is reached: it is handed a client (any
:class:`~miniverl.protocol.scoring_client.ScoringClient`: the real ``SyncTeacherClient``
or ``miniverl.testing.FakeTeacherClient``) or an endpoint.
This module does not run cycles (``loop.py``) or hold training state (``state.py``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miniverl.common.errors import ConfigError
from miniverl.common.memory_plan import refilled
from miniverl.common.recipe import Recipe, diff_recipes
from miniverl.common.rundir import RunDir
from miniverl.common.teacher_routes import is_routed
from miniverl.protocol.scoring_client import ScoringClient
from miniverl.student.report.build import build_report
from miniverl.student.trackers import Trackers, check_loggers, open_trackers
from miniverl.student.train.loop import resume_from_checkpoint, run
from miniverl.student.train.state import TrainState, build_state, prepare_process
from miniverl.student.train.teacher.link import TeacherSide
from miniverl.student.train.teacher.routed import RouteSide, routed_side


@dataclass
class TrainResult:
    """What :meth:`Trainer.train` returns."""

    run_dir: Path
    status: str
    final_version: int
    steps: int
    eval_before: dict[str, Any] | None
    eval: dict[str, Any] | None
    wall_s: float
    counters: dict[str, Any] = field(default_factory=dict)


def recipe_changes(old: Recipe, new: Recipe) -> list[str]:
    """Fields that differ, ignoring ``run.output_dir`` and ``run.loggers``: where a run
    lives (``runs`` or its absolute path, as ``miniverl up`` passes it) and which
    trackers watch it (``--logger``) do not change what it learns."""
    return [f for f in diff_recipes(old, new) if f not in ("run.output_dir", "run.loggers")]


def open_run(recipe: Recipe, run_id: str | None, resume: bool,
             recipe_text: str | None) -> tuple[RunDir, Recipe]:
    """Create, resume or adopt the run directory, and take its lock; returns it and the
    recipe to run (a resumed run's: with what its memory plan filled in, from its
    manifest, where ``recipe`` leaves it null)."""
    out = Path(recipe.run.output_dir)
    if resume:
        if run_id is None:
            raise ConfigError("--resume needs --run-id ID (the run to continue)")
        run_dir = RunDir.open(out / run_id)
        run_dir.verify()  # a tampered manifest or trajectory line stops the resume here
        recipe = refilled(recipe, run_dir.filled())
        differing = recipe_changes(run_dir.recipe(), recipe)
        if differing:
            raise ConfigError(
                f"run {run_id} was started with another recipe; differing fields: "
                f"{', '.join(differing)}; resume with the original recipe or start a new run"
            )
    elif run_id is not None and (out / run_id / "status.json").is_file():
        # `miniverl up` creates the run directory (for logs and sockets) before the
        # student starts; the student adopts it while it is still `ready`.
        run_dir = RunDir.open(out / run_id)
        if run_dir.status != "ready" or recipe_changes(run_dir.recipe(), recipe):
            raise ConfigError(
                f"run {run_id} already exists ({run_dir.status}); pick another --run-id, "
                "or pass --resume to continue it"
            )
    else:
        run_dir = RunDir.create(out, recipe, recipe_text=recipe_text, run_id=run_id)
    run_dir.lock().__enter__()
    return run_dir, recipe


class Trainer:
    """Build from a recipe (and a teacher client for teacher modes); call :meth:`train`.

    Use it as a context manager: leaving the block releases the run lock and closes the
    teacher client. ``stop_event`` (a ``threading.Event``) asks the loop to checkpoint
    and stop at the next update boundary. ``state`` is the run's
    :class:`~miniverl.student.train.state.TrainState` once :meth:`train` has built it.
    """

    def __init__(
        self,
        recipe: Recipe,
        *,
        teacher_endpoint: str | None = None,
        teacher_curve: tuple[str, str] | None = None,
        teacher_admin_token: str | None = None,
        client: ScoringClient | None = None,
        teacher_endpoints: dict[str, str] | None = None,
        route_clients: dict[str, ScoringClient] | None = None,
        run_id: str | None = None,
        resume: bool = False,
        offline: bool = False,
        recipe_text: str | None = None,
        stop_event: threading.Event | None = None,
        show_progress: bool = True,
        write_report: bool = True,
        checkpoints: bool = True,
    ):
        self.recipe = recipe
        endpoint = teacher_endpoint or (recipe.teacher.endpoint if recipe.teacher else None)
        self.teacher = TeacherSide(client=client, endpoint=endpoint, curve=teacher_curve,
                                   admin_token_file=teacher_admin_token)
        if is_routed(recipe.teacher, recipe.teachers) and recipe.needs_teacher:  # not SeqKD
            self.teacher = routed_side(recipe, teacher_endpoint, teacher_endpoints,
                                       route_clients, teacher_curve)
        self.offline = offline
        self.stop_event = stop_event or threading.Event()
        self.show_progress = show_progress
        self.write_report = write_report
        self.checkpoints = checkpoints
        self.started = time.perf_counter()
        self.state: TrainState | None = None
        self.trackers: Trackers | None = None
        check_loggers(recipe.run.loggers)  # a missing extra stops before the run exists
        if recipe.needs_teacher and client is None and endpoint is None \
                and self.teacher.routes is None:
            raise ConfigError(
                f"mode {recipe.run.mode!r} needs a teacher: pass --teacher ENDPOINT, set "
                "teacher.endpoint, or start both processes with `miniverl up`"
            )
        self.run, self.recipe = open_run(recipe, run_id, resume, recipe_text)
        self.resume = resume

    def train(self) -> TrainResult:
        """Run the recipe to the end (or to a stop request); returns what happened."""
        self.run.set_status("running")
        try:
            self.recipe = prepare_process(self.recipe, self.run, offline=self.offline)
            self.trackers = open_trackers(self.run, self.recipe)
            self.state = state = build_state(
                self.recipe, self.run, self.teacher, offline=self.offline,
                stop_event=self.stop_event, started=self.started, checkpoints=self.checkpoints,
            )
            if self.resume:
                resume_from_checkpoint(state)
            finished = threading.Event()
            watcher = threading.Thread(target=self._end_waits_on_stop, args=(finished,),
                                       name="stop-watcher", daemon=True)
            watcher.start()
            try:
                status, eval_before, final_eval = run(state, resumed=self.resume,
                                                      show_progress=self.show_progress)
            finally:
                finished.set()
            self.run.set_status(status)
        except KeyboardInterrupt:
            # A hard interrupt can land inside an optimizer step, so the parameters may be
            # half-updated: write no checkpoint now. The last one is complete (they are
            # written atomically) and `--resume` continues from it exactly.
            self.run.event("run_interrupted", version=self.version, steps=self.step,
                           checkpoint="none written; resume continues from the last one")
            self.run.set_status("interrupted", reason="KeyboardInterrupt")
            raise
        except BaseException as exc:
            self.run.event("run_failed", reason=f"{type(exc).__name__}: {exc}")
            self.run.set_status("failed", reason=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if self.trackers is not None:
                self.trackers.close(self.run.status)
            self._finish_report()
        return TrainResult(
            run_dir=self.run.path, status=status, final_version=state.version, steps=state.step,
            eval_before=eval_before, eval=final_eval,
            wall_s=time.perf_counter() - self.started, counters=self.teacher.counters(),
        )

    def _end_waits_on_stop(self, finished: threading.Event) -> None:
        """On a stop request, end a wait on the teacher at once: a teacher that never
        answers (or drips its answer) must not hold a stop. The loop then stops at the
        update boundary it was waiting at and checkpoints (loop.run). A client made
        after the stop (the connect after the warm-up) is interrupted as it appears."""
        interrupted: set[int] = set()
        while not finished.wait(0.1):
            if not self.stop_event.is_set():
                continue
            routes = self.teacher.routes or {}
            for client in (self.teacher.client, *(r.client for r in routes.values())):
                if client is not None and id(client) not in interrupted:
                    client.interrupt("stop requested while waiting on the teacher")
                    interrupted.add(id(client))

    @property
    def version(self) -> int:
        """The student's parameter version now (0 before training starts)."""
        return self.state.version if self.state is not None else 0

    @property
    def step(self) -> int:
        """Optimizer steps taken so far."""
        return self.state.step if self.state is not None else 0

    def request_retarget(self, endpoint: str, route: RouteSide | None = None) -> None:
        """Switch teachers (one ``route`` of several) at the next update boundary
        (control socket ``RETARGET``)."""
        if route is not None:
            route.pending_endpoint = endpoint
        else:
            self.teacher.pending_endpoint = endpoint

    def route_to_retarget(self, name: str | None) -> RouteSide | None:
        """The route a ``RETARGET`` names (None for a run with one teacher); raises
        ``ConfigError`` when the name and the run do not match."""
        routes = self.teacher.routes
        if routes is None:
            if name is not None:
                raise ConfigError(f"--route {name}: this run has one teacher; drop --route")
            return None
        if name not in routes:
            said = "no route" if name is None else f"route {name!r}"
            raise ConfigError(f"this run scores with several teachers ({', '.join(routes)}) "
                              f"and the request names {said}; pass --route with one of them")
        return routes[name]

    def _finish_report(self) -> None:
        if not self.write_report:
            return
        try:
            build_report(self.run.path)
        except Exception as exc:  # a report problem must not hide the run's outcome
            self.run.event("report_failed", reason=f"{type(exc).__name__}: {exc}")

    # -- context manager -----------------------------------------------------------------

    def close(self) -> None:
        routes = self.teacher.routes or {}
        for client in (self.teacher.client, *(r.client for r in routes.values())):
            if client is not None:
                client.close()
        self.run.release()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
