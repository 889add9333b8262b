"""The demo's live board: both processes on one screen while ``miniverl demo`` runs.

It reads what the processes already write, nothing else: the supervisor's
``teacher_phase``, the teacher preparation's ``metrics.jsonl`` (in its work folder
under ``$MINIVERL_CACHE/teachers``), and the student run's ``events.jsonl`` and
``metrics.jsonl``. :meth:`Board.poll` folds the new rows into a :class:`BoardState`;
on a terminal a rich ``Live`` table redraws it twice a second, elsewhere (a pipe, a CI
log) one plain line is printed each time a process changes phase.

    teacher   serving         prepared: 200 SFT steps, held-out success 97%
    student   strict OPD      update 6/12  loss 0.0213  rollout success 88%
    wire      1,903 positions scored  41 KB sent  610 KB received  0 stale replies dropped
    clock     38.2 s

It starts no process and trains nothing (:mod:`miniverl.cli.demo` does the run).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from miniverl.common.jsonl_tail import JsonlTail

REFRESH_S = 0.5


def epoch(ts: str | None) -> float | None:
    """Seconds since the epoch of an events/metrics ``ts`` (ISO 8601), or None."""
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class BoardState:
    """What the board knows; every field comes from a file or the supervisor."""

    teacher_phase: str = "starting"
    prep_step: int = 0
    prep_total: int = 0
    prep_loss: float | None = None
    teacher_success: float | None = None
    teacher_cached: bool | None = None
    student_phase: str = "starting"
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)
    warmup_step: int = 0
    train_step: int = 0
    train_total: int = 0
    last_row: dict[str, Any] = field(default_factory=dict)
    first_train_row: dict[str, Any] = field(default_factory=dict)
    positions_scored: int = 0
    train_rows: list[dict[str, Any]] = field(default_factory=list)


class Board:
    """``with Board(sup, console, prep_total=N, cycles=M): sup.run_all()``."""

    def __init__(self, supervisor: Any, console: Console, *, prep_total: int, cycles: int,
                 warmup: int = 0, started: float | None = None):
        self.sup = supervisor
        self.console = console
        self.warmup = warmup
        self.state = BoardState(prep_total=prep_total, train_total=cycles)
        self.started = started if started is not None else time.time()
        self._student: tuple[JsonlTail, JsonlTail] | None = None
        self._prep: JsonlTail | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Live | None = None
        self._said: dict[str, str] = {}
        self._lock = threading.Lock()

    # -- reading -----------------------------------------------------------------------
    def poll(self) -> BoardState:
        with self._lock:
            self._poll_teacher()
            self._poll_student()
            return self.state

    def _poll_teacher(self) -> None:
        s = self.state
        s.teacher_phase = getattr(self.sup, "teacher_phase", s.teacher_phase)
        final = getattr(self.sup, "teacher_model_dir", None)
        if self._prep is None and final is not None and s.teacher_phase == "preparing":
            found = sorted(Path(final).parent.glob(f".{Path(final).name}-*/runs/*/metrics.jsonl"))
            if found:
                self._prep = JsonlTail(found[-1])
        if self._prep is not None:
            for row in self._prep.read():
                s.prep_step = int(row.get("step") or s.prep_step)
                if row.get("loss") is not None:
                    s.prep_loss = float(row["loss"])

    def _poll_student(self) -> None:
        s = self.state
        run = getattr(self.sup, "run", None)
        if run is None:
            return
        if self._student is None:
            self._student = (JsonlTail(run.path / "events.jsonl"), JsonlTail(run.metrics_path))
        events, metrics = self._student
        for ev in events.read():
            name = str(ev.get("event"))
            s.events.setdefault(name, ev)
            if name == "eval":
                s.evals.append(ev)
            elif name == "teacher_prepared":
                s.teacher_success = ev.get("eval_success")
                s.teacher_cached = ev.get("cached")
            elif name == "teacher_qualified" and s.teacher_success is None:
                s.teacher_success = ev.get("success")
        for row in metrics.read():
            s.last_row = row
            if row.get("phase") == "sft_warmup":
                s.warmup_step = int(row.get("step") or 0)
            else:
                if not s.first_train_row:
                    s.first_train_row = row
                s.train_rows.append(row)
                s.train_step = len(s.train_rows)
                s.positions_scored += int(row.get("positions_scored") or 0)
        s.student_phase = self._student_phase()

    def _student_phase(self) -> str:
        s, ev = self.state, self.state.events
        if "run_completed" in ev:
            return "done"
        if "run_failed" in ev or "run_interrupted" in ev:
            return "stopped"
        if "run_started" not in ev:
            return "starting"
        if not s.evals:
            return "eval before"
        if s.train_step >= s.train_total > 0:
            return "eval after"
        if s.train_step:
            return "strict OPD"
        if self.warmup and "sft_warmup_done" not in ev:
            return "SFT warm-up"
        return "waiting for the teacher"

    # -- drawing -----------------------------------------------------------------------
    def teacher_text(self) -> tuple[str, str]:
        s = self.state
        phase = s.teacher_phase
        if phase == "preparing" and s.prep_total and s.prep_step >= s.prep_total:
            phase = "qualifying"
        if phase == "preparing":
            loss = f"  loss {s.prep_loss:.4f}" if s.prep_loss is not None else ""
            return phase, f"SFT step {s.prep_step}/{s.prep_total}{loss}"
        if phase == "qualifying":
            return phase, "greedy eval on the held-out tasks"
        if s.teacher_success is not None:
            how = "cached" if s.teacher_cached else "prepared"
            return phase, f"{how}, held-out success {s.teacher_success:.0%}"
        return phase, ""

    def student_text(self) -> tuple[str, str]:
        s = self.state
        phase = s.student_phase
        before = f"success {s.evals[0]['success']:.0%}" if s.evals else ""
        if phase == "starting":
            return phase, "imports, model build"
        if phase == "eval before":
            return phase, "greedy eval on the held-out tasks"
        if phase == "SFT warm-up":
            loss = s.last_row.get("loss")
            return phase, f"step {s.warmup_step}  loss {loss:.4f}  (eval before: {before})" if (
                loss is not None) else f"(eval before: {before})"
        if phase == "waiting for the teacher":
            done = f", warm-up ended at step {s.warmup_step}" if s.warmup_step else ""
            return phase, f"(eval before: {before}{done})"
        if phase in ("strict OPD", "eval after"):
            row = s.last_row
            bits = [f"update {s.train_step}/{s.train_total}"]
            if s.train_step and row.get("loss") is not None:
                bits.append(f"loss {row['loss']:.4f}")
            if s.train_step and row.get("train_success") is not None:
                bits.append(f"rollout success {row['train_success']:.0%}")
            return phase, "  ".join(bits)
        if phase == "done" and len(s.evals) >= 2:
            return phase, f"success {s.evals[0]['success']:.0%} -> {s.evals[-1]['success']:.0%}"
        return phase, ""

    def wire_text(self) -> str:
        s = self.state
        row = s.last_row if s.train_step else {}
        return (f"{s.positions_scored:,} positions scored  "
                f"{(row.get('bytes_sent') or 0) / 1e3:,.0f} KB sent  "
                f"{(row.get('bytes_received') or 0) / 1e3:,.0f} KB received  "
                f"{row.get('stale_dropped', 0)} stale replies dropped")

    def __rich__(self) -> Table:
        self.poll()
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column(style="cyan")
        table.add_column()
        table.add_row("teacher", *self.teacher_text())
        table.add_row("student", *self.student_text())
        table.add_row("wire", "", self.wire_text())
        table.add_row("clock", "", f"{time.time() - self.started:.1f} s")
        return table

    def _say_changes(self) -> None:
        self.poll()
        for who, (phase, detail) in (("teacher", self.teacher_text()),
                                     ("student", self.student_text())):
            if self._said.get(who) != phase:
                self._said[who] = phase
                self.console.print(f"[{time.time() - self.started:6.1f} s] {who:<8} {phase}"
                                   + (f": {detail}" if detail else ""),
                                   markup=False, highlight=False, soft_wrap=True)

    def _loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            self._say_changes()

    def __enter__(self) -> Board:
        if self.console.is_terminal:
            self._live = Live(self, console=self.console, refresh_per_second=1 / REFRESH_S,
                              transient=False)
            self._live.start()
        else:
            self._thread = threading.Thread(target=self._loop, name="demo-board", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
        if self._thread is not None:
            self._stop.set()
            self._thread.join(2)
            self._say_changes()
