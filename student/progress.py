"""A rich progress bar for the training loop (optimizer steps, loss, success).

It writes to stderr so stdout stays clean for summaries, and turns itself off when
``enabled`` is false (tests, or a supervisor that draws its own view).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class TrainProgress:
    def __init__(self, total: int, *, enabled: bool = True, initial: int = 0):
        self.enabled = enabled
        self.total = total
        self.initial = initial
        self._progress: Progress | None = None

    def __enter__(self) -> TrainProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(stderr=True),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=self.total, completed=self.initial, info=""
            )
        return self

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        if self._progress is None:
            return
        info = []
        if metrics.get("loss") is not None:
            info.append(f"loss {metrics['loss']:.4f}")
        if metrics.get("train_success") is not None:
            info.append(f"success {metrics['train_success']:.0%}")
        if metrics.get("version") is not None:
            info.append(f"v{metrics['version']}")
        self._progress.update(self._task, completed=step, info="  ".join(info))

    def set_total(self, total: int) -> None:
        """The plan changed (an SFT warm-up ended early): the bar ends at ``total``."""
        self.total = total
        if self._progress is not None:
            self._progress.update(self._task, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
