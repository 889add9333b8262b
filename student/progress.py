"""Training progress (optimizer steps, loss, success): a rich bar, or plain lines.

On a terminal it draws a rich progress bar. When the output is not a terminal (a file,
a pipe, a CI log) a bar is drawn only once, at the end, so a long job looked silent:
there it prints one plain line instead at the first step, then at most every
``every_s`` seconds, and at the last step, with the same figures as the bar::

    train 120/340  0:00:18  v120  loss 0.0412  rollout success 69%

It writes to stderr (the console it is given) so stdout stays clean for summaries,
and turns itself off when ``enabled`` is false (tests). The training loop and the
``up`` supervisor (which reads ``metrics.jsonl``) both show progress through it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

LINE_EVERY_S = 5.0  # plain-line mode: at most one line per this many seconds


def progress_info(metrics: dict[str, Any]) -> str:
    """The figures shown beside the bar (and on each plain line) for one metrics row."""
    info = []
    if metrics.get("version") is not None:
        info.append(f"v{metrics['version']}")
    if metrics.get("loss") is not None:
        info.append(f"loss {metrics['loss']:.4f}")
    if metrics.get("train_success") is not None:
        info.append(f"rollout success {metrics['train_success']:.0%}")
    if isinstance(metrics.get("by_teacher"), dict):  # several teachers: episodes each
        info.append("teachers " + ", ".join(
            f"{name} {int(c.get('episodes', 0))}" for name, c in metrics["by_teacher"].items()))
    return "  ".join(info)


class TrainProgress:
    """``with TrainProgress(total) as p: p.update(step, metrics_row)``.

    ``completed`` and ``total`` are kept whether or not anything is shown.
    """

    def __init__(self, total: int, *, enabled: bool = True, initial: int = 0,
                 console: Console | None = None, every_s: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.enabled = enabled
        self.total = total
        self.completed = initial
        self.console = console or Console(stderr=True)
        self.every_s = every_s
        self.clock = clock
        self.info = ""
        self._progress: Progress | None = None
        self._lines = False
        self._started = 0.0
        self._last_line: float | None = None
        self._last_line_step: int | None = None

    def __enter__(self) -> TrainProgress:
        if not self.enabled:
            return self
        if self.console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=self.total, completed=self.completed, info=""
            )
        else:
            self._lines = True
            self._started = self.clock()
        return self

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        self.completed = step
        self.info = progress_info(metrics)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=self.info)
        elif self._lines:
            now = self.clock()
            due = self._last_line is None or now - self._last_line >= self.every_s
            if due or step >= self.total:
                self._line(now)

    def set_total(self, total: int) -> None:
        """The plan changed (an SFT warm-up ended early): the bar ends at ``total``."""
        self.total = total
        if self._progress is not None:
            self._progress.update(self._task, total=total)

    def _line(self, now: float) -> None:
        elapsed = timedelta(seconds=int(now - self._started))
        text = f"train {self.completed}/{self.total}  {elapsed}"
        if self.info:
            text += f"  {self.info}"
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self._last_line, self._last_line_step = now, self.completed

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
        elif self._lines and self._last_line_step != self.completed and self.info:
            self._line(self.clock())  # the last figures, also when a run stops early
