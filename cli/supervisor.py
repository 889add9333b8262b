"""``miniverl up``: start the teacher and the student, watch both, stop both.

The supervisor creates the run directory, starts the student at once (its imports,
model build and first eval overlap the teacher's start), prepares the teacher when the
recipe says so (``teacher.prepare``, cached), starts ``python -m miniverl.teacher_server``
on ``ipc://<run>/teacher.sock`` and waits for it to answer ``PING`` with ``READY``
while watching the child: a crash during load fails fast with the teacher's last log
lines. While training runs it shows prefixed log lines and one progress bar read from
``metrics.jsonl`` (plain progress lines when its output is not a terminal). A
teacher that dies is restarted at the same endpoint with bounded retries and backoff;
the student's client re-handshakes and re-sends. Ctrl-C or SIGTERM asks the student to
checkpoint and stop at the next update boundary, then shuts the teacher down; the exit
code is then 130, otherwise the student's. A second Ctrl-C does not wait: both children
are killed at once (no checkpoint) and the exit code is 130.

With ``--teacher ENDPOINT`` no teacher is started: the student attaches to it (over
CURVE with ``--curve-secret-key``/``--curve-server-key`` or the recipe's
``teacher.curve_*``). A teacher ``up`` starts writes its admin token beside its socket;
the student is told the file (``--admin-token``) so the ``swap`` memory strategy's
PARK/WAKE are admitted.

With several teachers (``teachers:``, docs/several-teachers.md) ``up`` starts one
teacher process per teacher that has no ``endpoint`` (``ipc://<run>/teacher-NAME.sock``,
its output in ``logs/teacher-NAME.stderr.log``), tells the student each one
(``--teacher NAME=ENDPOINT``) and restarts each that dies, on its own bounded retries;
a teacher with an ``endpoint`` is attached to as it is.

The supervisor trains nothing and scores nothing; it only runs processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from miniverl.common.errors import ConfigError, MiniverlError, TeacherUnavailable
from miniverl.common.jsonl_tail import JsonlTail
from miniverl.common.memory_plan import refuse_before_start
from miniverl.common.names import path_inside
from miniverl.common.recipe import Recipe, load_recipe
from miniverl.common.recipe_paths import path_problems
from miniverl.common.rundir import RunDir, new_run_id
from miniverl.protocol.endpoints import admin_token_path
from miniverl.student.progress import TrainProgress
from miniverl.student.teacher_process import StudentExited, teacher_command, wait_until_ready
from miniverl.student.trackers import check_loggers, with_loggers

TEACHER_RESTARTS = 3


@dataclass
class NamedTeacher:
    """One teacher of ``teachers:``: where it listens and, if ``up`` runs it, its process."""

    name: str
    endpoint: str
    launched: bool  # False: the recipe gave its endpoint; it is attached to as it is
    proc: subprocess.Popen | None = None
    restarts: int = 0
    prepared_dir: Path | None = None  # teachers.NAME.prepare's result, once prepared
TEACHER_OUTPUT = "teacher.stderr.log"  # the teacher's stdout and stderr, under logs/
STOP_GRACE_S = 120.0
START_FAILED_GRACE_S = 10.0


def threads_per_process(recipe: Recipe) -> int:
    """Divide the cores between the two processes: one each on a machine of <= 2 cores."""
    cores = os.cpu_count() or 1
    return max(1, min(recipe.runtime.cpu_threads, cores // 2))


class _Pump(threading.Thread):
    """Copy a child's output lines to a log file and to the console with a prefix."""

    def __init__(self, stream: IO[bytes], prefix: str, log_path: Path, console: Console,
                 echo: bool):
        super().__init__(daemon=True)
        self.stream, self.prefix, self.log_path = stream, prefix, log_path
        self.console, self.echo = console, echo
        self.tail: deque[str] = deque(maxlen=30)

    def run(self) -> None:
        with self.log_path.open("a", encoding="utf-8") as log:
            for raw in iter(self.stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                log.write(line + "\n")
                log.flush()
                self.tail.append(line)
                if self.echo and line.strip():
                    self.console.print(f"[dim]{self.prefix}[/dim] {line}", markup=True,
                                       highlight=False, soft_wrap=True)


class Supervisor:
    def __init__(
        self,
        recipe_path: str | Path,
        *,
        teacher: str | None = None,
        run_id: str | None = None,
        resume: bool = False,
        output_dir: str | None = None,
        console: Console | None = None,
        show_progress: bool = True,
        echo: bool = True,
        teacher_restarts: int = TEACHER_RESTARTS,
        curve: tuple[str, str] | None = None,
        loggers: list[str] | None = None,
    ):
        self.recipe_path = Path(recipe_path).resolve()
        self.recipe = with_loggers(load_recipe(self.recipe_path), loggers)
        check_loggers(self.recipe.run.loggers)  # before a run directory exists
        # What `validate` refuses about the recipe's paths is refused before the run
        # directory exists too (a missing adapter once left a step_0 run behind).
        problems = path_problems(self.recipe, self.recipe_path.parent)
        if problems:
            raise ConfigError(problems[0])
        self.loggers = list(loggers or [])
        if output_dir is not None:
            self.recipe = self.recipe.model_copy(
                update={"run": self.recipe.run.model_copy(update={"output_dir": output_dir})}
            )
        self.output_dir = Path(self.recipe.run.output_dir).resolve()
        if teacher is not None and self.recipe.teachers is not None:
            raise ConfigError(
                f"--teacher {teacher} names one teacher, and this recipe names several "
                f"({', '.join(self.recipe.teachers)}); set teachers.NAME.endpoint for each "
                "one already serving, and `up` starts the others")
        self.external = teacher or (self.recipe.teacher.endpoint if self.recipe.teacher else None)
        # Several teachers (teachers:): one per name, made when the run directory exists.
        self.named: dict[str, NamedTeacher] = {}
        self.curve = tuple(str(Path(f).resolve()) for f in curve) if curve else None
        keyed = self.curve or (self.recipe.teacher and self.recipe.teacher.curve_secret_key)
        if keyed and self.external is None:
            raise ConfigError(
                "CURVE keys are for a remote teacher: pass --teacher tcp://HOST:PORT (or set "
                "teacher.endpoint); the teacher `up` starts listens on a private ipc socket"
            )
        # A CUDA student whose memory plan cannot fit its device is refused before any
        # process starts (the student plans again before its weights load).
        refuse_before_start(self.recipe, teacher_elsewhere=self.external is not None)
        self.resume = resume
        if resume and run_id is None:
            raise ConfigError("--resume needs --run-id ID (the run to continue)")
        self.run_id = run_id or new_run_id(self.recipe.run.name)
        self.console = console or Console(stderr=True)
        self.show_progress = show_progress
        self.echo = echo
        self.teacher_restarts = teacher_restarts
        self.student: subprocess.Popen | None = None
        self.teacher: subprocess.Popen | None = None
        self.teacher_model_dir: Path | None = None
        self._stopping = False
        self._forced = False
        self._preparing = False
        self._pumps: list[_Pump] = []
        # What the teacher is doing, for live displays: starting, preparing, loading,
        # serving, restarting, stopped.
        self.teacher_phase = "starting"

    # -- processes -------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        n = str(threads_per_process(self.recipe))
        env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, MINIVERL_CPU_THREADS=n,
                   PYTHONUNBUFFERED="1", TRANSFORMERS_VERBOSITY="error",
                   HF_HUB_DISABLE_PROGRESS_BARS="1",
                   PYTHONWARNINGS=env.get("PYTHONWARNINGS", "ignore::FutureWarning"))
        return env

    def _spawn(self, cmd: list[str], prefix: str, log_name: str) -> subprocess.Popen:
        # A new session: the terminal's Ctrl-C reaches only the supervisor, which then
        # stops the children in the right order (student first, teacher last).
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=self._env(), start_new_session=True)
        pump = _Pump(proc.stdout, prefix, self.run.logs_dir / log_name, self.console, self.echo)
        pump.start()
        self._pumps.append(pump)
        proc.pump = pump  # type: ignore[attr-defined]
        return proc

    def _start_student(self) -> None:
        cmd = [sys.executable, "-m", "miniverl.student", str(self.recipe_path),
               "--run-id", self.run_id, "--output-dir", str(self.output_dir), "--control",
               "--no-progress"]
        if self.named:
            for named in self.named.values():
                cmd += ["--teacher", f"{named.name}={named.endpoint}"]
        elif self.recipe.needs_teacher:
            cmd += ["--teacher", self.endpoint]
            if self.external is None:  # our teacher writes its token there (swap's PARK)
                cmd += ["--admin-token", str(admin_token_path(self.endpoint))]
            elif self.curve:
                cmd += ["--curve-secret-key", self.curve[0], "--curve-server-key", self.curve[1]]
        if self.resume:
            cmd.append("--resume")
        for name in self.loggers:
            cmd += ["--logger", name]
        self.student = self._spawn(cmd, "[student]", "student.log")

    def _teacher_cmd(self) -> list[str]:
        args = ["--bind", self.endpoint, "--log", str(self.run.logs_dir / "teacher.log"),
                "--threads", str(threads_per_process(self.recipe)),
                "--heartbeat-ms", str(self.recipe.runtime.heartbeat_ms)]
        if self.teacher_model_dir is not None:
            # --gate: a RELOAD onto a teacher this recipe's teacher.min_success refuses is
            # refused by the teacher itself (--recipe implies it).
            args += ["--model", str(self.teacher_model_dir), "--gate", str(self.recipe_path)]
            if not (self.teacher_model_dir / "config.json").is_file():
                # Still being prepared: the teacher imports its libraries meanwhile, and
                # waits as long as the student waits for it (a real model's preparation
                # outlasts the 600 s startup default; the student's unavailable_timeout_s
                # is the recipe's own bound on it).
                runtime = self.recipe.runtime
                wait_s = max(runtime.teacher_startup_timeout_s, runtime.unavailable_timeout_s)
                args += ["--wait-for-model", str(wait_s)]
            teacher = self.recipe.teacher
            if teacher.scorer != "causal_lm":  # --recipe reads these itself
                args += ["--scorer", teacher.scorer]
                for key, value in teacher.scorer_options.items():
                    args += ["--scorer-option", f"{key}={value}"]
        else:
            args += ["--recipe", str(self.recipe_path)]
        return teacher_command(args)

    def _start_named(self) -> None:
        """Several teachers: prepare those with ``teachers.NAME.prepare`` (cached after the
        first run; one after the other, while the student starts), start every one ``up``
        runs, then wait until each is READY."""
        from miniverl.common.recipe_models import ModelSource
        from miniverl.student.teacher_prep import prepare_model

        for named in self.named.values():
            section = self.recipe.teachers[named.name]
            if not named.launched or section.prepare is None:
                continue
            prep = Path(section.prepare)
            prep = prep if prep.is_absolute() else self.recipe_path.parent / prep
            self.console.print(f"[bold]teacher {named.name}[/bold] preparing from "
                               f"{prep.name} (cached after the first run)")
            self._preparing, self.teacher_phase = True, "preparing"
            try:
                prepared = prepare_model(prep, ModelSource.model_validate(
                    section.model.model_dump()), what=f"teachers.{named.name}.prepare",
                    model_field=f"teachers.{named.name}.model",
                    show_progress=self.show_progress)
            finally:
                self._preparing = False
            named.prepared_dir = prepared.model_dir
            self.run.event("teacher_prepared", teacher=named.name, cached=prepared.cached,
                           model_dir=str(prepared.model_dir),
                           eval_success=(prepared.record.get("eval") or {}).get("success"))
            if self._stopping or self.student.poll() is not None:
                return
        for named in self.named.values():
            if named.launched:
                self._spawn_named(named)
        self.teacher_phase = "loading"
        for named in self.named.values():
            if named.launched:
                self._wait_named(named)
        self.teacher_phase = "serving"
        for named in self.named.values():
            self.console.print(f"[bold]teacher {named.name}[/bold] "
                               f"{'serving' if named.launched else 'attached'} on "
                               f"{named.endpoint}")

    def _spawn_named(self, named: NamedTeacher) -> None:
        log = path_inside(self.run.logs_dir, f"teacher-{named.name}.log", what="teacher log")
        args = ["--bind", named.endpoint,
                "--log", str(log),
                "--threads", str(threads_per_process(self.recipe)),
                "--heartbeat-ms", str(self.recipe.runtime.heartbeat_ms),
                "--recipe", str(self.recipe_path), "--recipe-teacher", named.name,
                *(["--prepared-dir", str(named.prepared_dir)] if named.prepared_dir else [])]
        named.proc = self._spawn(teacher_command(args), f"[teacher {named.name}]",
                                 f"teacher-{named.name}.stderr.log")

    def _wait_named(self, named: NamedTeacher) -> None:
        try:
            wait_until_ready(named.endpoint, named.proc,
                             self.recipe.runtime.teacher_startup_timeout_s,
                             log=self.run.logs_dir / f"teacher-{named.name}.stderr.log",
                             also_watch=self.student)
        except TeacherUnavailable as exc:
            named.proc.pump.join(2)
            tail = self._teacher_tail(proc=named.proc, log_name=f"teacher-{named.name}.log")
            raise MiniverlError(f"teacher {named.name}: {exc}; last teacher log lines:\n"
                                f"{tail}") from None

    def _restart_dead_named(self) -> None:
        """Restart each teacher of ``teachers:`` that died, on its own bounded retries; the
        others keep serving (the student's routes to them never notice)."""
        for named in self.named.values():
            if named.proc is None or named.proc.poll() is None:
                continue
            code = named.proc.returncode
            if named.restarts >= self.teacher_restarts:
                self.run.event("teacher_gave_up", restarts=named.restarts, exit_code=code,
                               teacher=named.name)
                self.console.print(f"[bold red]teacher {named.name}[/bold red] died again; "
                                   "no more restarts")
                named.proc = None
                continue
            named.restarts += 1
            time.sleep(min(8.0, 0.5 * 2**named.restarts))
            self.console.print(f"[bold yellow]teacher {named.name}[/bold yellow] exited "
                               f"({code}); restart {named.restarts}/{self.teacher_restarts}")
            self.run.event("teacher_restarted", attempt=named.restarts, exit_code=code,
                           teacher=named.name)
            try:
                self._spawn_named(named)
                self._wait_named(named)
            except MiniverlError as exc:
                self.console.print(f"[bold red]teacher {named.name}[/bold red] restart "
                                   f"failed: {exc}")

    def _children(self) -> list[subprocess.Popen]:
        """Every teacher process ``up`` runs now."""
        return [p for p in (self.teacher, *(n.proc for n in self.named.values()))
                if p is not None]

    def _spawn_teacher(self) -> None:
        self.teacher = self._spawn(self._teacher_cmd(), "[teacher]", TEACHER_OUTPUT)

    def _start_teacher(self) -> None:
        if self.teacher is None or self.teacher.poll() is not None:
            self._spawn_teacher()
        self.teacher_phase = "loading"
        try:
            wait_until_ready(self.endpoint, self.teacher,
                             self.recipe.runtime.teacher_startup_timeout_s,
                             log=self.run.logs_dir / TEACHER_OUTPUT, also_watch=self.student)
        except TeacherUnavailable as exc:
            self.teacher.pump.join(2)
            tail = self._teacher_tail()
            raise MiniverlError(f"{exc}; last teacher log lines:\n{tail}") from None

    def _teacher_tail(self, n: int = 15, *, proc: subprocess.Popen | None = None,
                      log_name: str = "teacher.log") -> str:
        """The last lines of a teacher's JSON log and output (default: the one teacher)."""
        proc = proc or self.teacher
        lines: list[str] = []
        log = self.run.logs_dir / log_name
        if log.is_file():
            lines += log.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
        if proc is not None:
            lines += list(proc.pump.tail)[-n:]
        return "\n".join(f"  {line}" for line in lines[-n:]) or "  (no output)"

    def _prepare_teacher(self) -> None:
        """Start the teacher process, then prepare its model if the recipe says so.

        With ``teacher.prepare`` the teacher is spawned first with the directory the
        preparation will produce and ``--wait-for-model``: its cold imports overlap the
        preparation instead of following it.
        """
        from miniverl.student.teacher_prep import (
            prep_recipe_path,
            prepare_teacher,
            prepared_dir,
        )

        prep = prep_recipe_path(self.recipe, self.recipe_path)
        if prep is not None:
            self.teacher_model_dir = prepared_dir(self.recipe, prep)
        self._spawn_teacher()
        if prep is None:
            return
        self.console.print(f"[bold]teacher[/bold] preparing from {prep.name} (cached after "
                           "the first run)")
        self._preparing = True
        self.teacher_phase = "preparing"
        try:
            prepared = prepare_teacher(self.recipe, prep, show_progress=self.show_progress)
        finally:
            self._preparing = False
        self.teacher_model_dir = prepared.model_dir
        success = (prepared.record.get("eval") or {}).get("success")
        self.run.event("teacher_prepared", cached=prepared.cached, model_dir=str(prepared.model_dir),
                       steps=prepared.record.get("steps"), eval_success=success,
                       wall_s=None if prepared.cached else prepared.record.get("wall_s"))
        where = "cached" if prepared.cached else f"trained in {prepared.record['wall_s']:.1f} s"
        shown = f", held-out success {success:.0%}" if success is not None else ""
        self.console.print(f"[bold]teacher[/bold] ready ({where}{shown})")

    # -- the run ---------------------------------------------------------------------

    def run_all(self) -> int:
        """Start, watch and stop both processes; returns the exit code."""
        from miniverl.student.control import record_socket, socket_endpoint

        if self.resume:
            self.run = RunDir.open(self.output_dir / self.run_id)
            # A run that is still going must not get a second teacher: binding its ipc
            # endpoint again would steal the live teacher's socket.
            self.run.lock()
            self.run.release()
        else:
            text = self.recipe_path.read_text(encoding="utf-8")
            self.run = RunDir.create(self.output_dir, self.recipe, recipe_text=text,
                                     run_id=self.run_id)
        self.run.logs_dir.mkdir(parents=True, exist_ok=True)
        needs_teacher = self.recipe.needs_teacher
        self.endpoint = self.external or socket_endpoint(self.run.path, "teacher.sock")
        # SeqKD from several teachers (sft) plays them in the student process: no server.
        for name, section in (self.recipe.teachers or {} if needs_teacher else {}).items():
            self.named[name] = NamedTeacher(
                name, section.endpoint or socket_endpoint(self.run.path, f"teacher-{name}.sock"),
                launched=section.endpoint is None)
            record_socket(self.run.path, f"teacher:{name}", self.named[name].endpoint)
        if needs_teacher and not self.named:
            record_socket(self.run.path, "teacher", self.endpoint)
        self.console.print(f"[bold]run[/bold] {self.run.path}")
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        try:
            self._start_student()
            if self.named:
                self._start_named()
            elif self.external is None and needs_teacher:  # sft runs need no teacher
                self._prepare_teacher()
                if self._stopping or self.student.poll() is not None:
                    return self._watch()
                self._start_teacher()
                self.teacher_phase = "serving"
                self.console.print(f"[bold]teacher[/bold] serving on {self.endpoint}")
            return self._watch()
        except StudentExited:
            return self._watch()
        except BaseException as exc:
            # Whatever went wrong here (a failed preparation, an interrupt during it),
            # no child outlives the supervisor. The student has trained nothing yet (it
            # connects to the teacher before its first update), so it gets a short grace:
            # with STOP_GRACE_S a teacher that failed to load kept `up` waiting 2 minutes.
            self._shutdown(1, grace_s=START_FAILED_GRACE_S)
            first_line = (str(exc).splitlines() or [""])[0]
            # The student, stopped by the shutdown, marks its run `interrupted` with no
            # reason; the run failed, and its status says why (issue 53).
            self._close_abandoned_run(f"{type(exc).__name__}: {first_line}",
                                      failed_start=True)
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        if self._stopping:
            self._force_stop()
            return
        self._stopping = True
        if self._preparing:
            # The preparation runs in this process; interrupt it rather than finish it.
            raise KeyboardInterrupt
        self.console.print("[bold]stopping[/bold]: the student checkpoints at the next update "
                           "boundary, then the teacher shuts down (Ctrl-C again: stop now, "
                           "no checkpoint)")
        if self.student is not None and self.student.poll() is None:
            self.student.send_signal(signal.SIGTERM)

    def _force_stop(self) -> None:
        """The second Ctrl-C: kill both children now; the last checkpoint is what remains."""
        if self._forced:
            return
        self._forced = True
        self.console.print("[bold red]stopping now[/bold red]: killing the student and the "
                           "teacher without a checkpoint")
        for child in (self.student, *self._children()):
            if child is not None and child.poll() is None:
                child.kill()

    def _watch(self) -> int:
        from miniverl.student.train.optim import total_optimizer_steps

        total = self._planned_total = total_optimizer_steps(self.recipe)
        restarts = 0
        metrics = JsonlTail(self.run.metrics_path)
        self._first_train_row_seen = False
        with TrainProgress(total, enabled=self.show_progress, console=self.console) as progress:
            stop_deadline = None
            while self.student.poll() is None:
                time.sleep(0.2)
                self._update_progress(progress, metrics)
                if self._stopping and stop_deadline is None:
                    stop_deadline = time.monotonic() + STOP_GRACE_S
                if stop_deadline is not None and time.monotonic() > stop_deadline:
                    self.student.kill()
                if self.named and not self._stopping and self.student.poll() is None:
                    self._restart_dead_named()
                teacher_dead = (self.teacher is not None and self.teacher.poll() is not None)
                if teacher_dead and not self._stopping and self.student.poll() is None:
                    if restarts >= self.teacher_restarts:
                        self.run.event("teacher_gave_up", restarts=restarts,
                                       exit_code=self.teacher.returncode)
                        self.console.print("[bold red]teacher[/bold red] died again; no more "
                                           "restarts (the student will stop when it times out)")
                        self.teacher = None
                        continue
                    restarts += 1
                    code = self.teacher.returncode
                    time.sleep(min(8.0, 0.5 * 2**restarts))
                    self.console.print(f"[bold yellow]teacher[/bold yellow] exited ({code}); "
                                       f"restart {restarts}/{self.teacher_restarts}")
                    self.run.event("teacher_restarted", attempt=restarts, exit_code=code)
                    try:
                        self._start_teacher()
                        self.teacher_phase = "serving"
                    except MiniverlError as exc:
                        self.console.print(f"[bold red]teacher[/bold red] restart failed: {exc}")
            self._update_progress(progress, metrics)
        code = self.student.returncode
        self.student.pump.join(5)
        self._say_why(code)
        self._close_abandoned_run(
            "a second Ctrl-C killed the student; the last checkpoint is what remains"
            if self._forced else
            f"the student process exited with code {code} without closing the run")
        if code < 0:  # killed by a signal: report it the way a shell does
            code = 128 - code
        return self._shutdown(130 if self._stopping else code)

    def _say_why(self, code: int) -> None:
        """``--quiet`` hides the children's lines; a failed run must still say why."""
        if self.echo or code == 0 or self._stopping:
            return
        tail = [line for line in self.student.pump.tail if line.strip()]
        errors = [line for line in tail if line.startswith("error:")]
        why = errors[-1] if errors else (tail[-1] if tail else "(no output)")
        self.console.print(f"student exited with code {code}: {why} (full output: "
                           f"{self.run.logs_dir / 'student.log'})", markup=False, highlight=False,
                           soft_wrap=True)

    def _close_abandoned_run(self, reason: str, failed_start: bool = False) -> None:
        """A student killed outright (SIGKILL, the OOM killer) cannot mark its run; do it.

        Without this the run stayed ``running`` forever and ``--resume`` was the only
        way to learn it was dead. ``failed_start``: the run failed while its processes
        started (the student was stopped for it, and said only ``interrupted``): it is
        ``failed``, with ``reason``.
        """
        try:
            current = self.run.status
            if failed_start and current == "interrupted":
                self.run.event("run_failed", reason=reason)
                self.run.set_status("failed", reason=reason)
                return
            if current not in ("ready", "running"):
                return
            status = "interrupted" if self._stopping and not failed_start else "failed"
            self.run.event("run_interrupted" if self._stopping else "run_failed", reason=reason)
            self.run.set_status(status, reason=reason)
        except (MiniverlError, OSError, ValueError) as exc:
            self.console.print(f"[bold red]run[/bold red] could not record the student's exit: {exc}")

    def _update_progress(self, progress: TrainProgress, metrics: JsonlTail) -> None:
        for row in metrics.read():
            step = row.get("step", 0)
            if row.get("phase") == "train" and not self._first_train_row_seen:
                # The file's first distillation row follows the warm-up's last step; when
                # that is before sft_warmup_steps (train.sft_warmup_until_loss ended the
                # warm-up early) the run is that much shorter.
                self._first_train_row_seen = True
                warmup = self.recipe.train.sft_warmup_steps
                if step - 1 < warmup:
                    progress.set_total(self._planned_total - (warmup - (step - 1)))
            progress.update(step, row)

    def _shutdown(self, code: int, grace_s: float = STOP_GRACE_S) -> int:
        if self.student is not None and self.student.poll() is None:
            self.student.send_signal(signal.SIGTERM)
            try:
                self.student.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.student.kill()
                self.student.wait()
        for child in self._children():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)  # SIGTERM = SHUTDOWN drain
        for child in self._children():
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.teacher_phase = "stopped"
        for pump in self._pumps:
            pump.join(2)
        return code


def up(recipe_path: str | Path, **kwargs: Any) -> tuple[int, Path]:
    """Run ``miniverl up``; returns ``(exit code, run directory)``."""
    sup = Supervisor(recipe_path, **kwargs)
    code = sup.run_all()
    return code, sup.run.path
