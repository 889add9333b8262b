"""Progress when the output is not a terminal: plain lines while the job runs, not one
bar at the end (a user following a redirected log, or CI, sees the run move)."""

from __future__ import annotations

import io

from rich.console import Console

from miniverl.student.progress import LINE_EVERY_S, TrainProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _row(step: int) -> dict:
    return {"step": step, "version": step, "loss": 1.0 / step, "train_success": step / 10}


def test_redirected_output_gets_a_line_every_few_seconds_with_the_bars_figures():
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=False)
    with TrainProgress(10, console=console, every_s=5.0, clock=clock) as progress:
        for step in range(1, 11):
            clock.now += 2.0  # a step every 2 s: a line at most every 5 s
            progress.update(step, _row(step))
            if step == 4:
                # Written while the job runs, not when it ends.
                assert out.getvalue().count("\n") == 2, out.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0] == "train 1/10  0:00:02  v1  loss 1.0000  rollout success 10%"
    assert [line.split()[1] for line in lines] == ["1/10", "4/10", "7/10", "10/10"]
    assert "v10  loss 0.1000  rollout success 100%" in lines[-1]
    assert "\x1b" not in out.getvalue() and "━" not in out.getvalue()  # no bar, no escapes


def test_the_documented_pace_is_a_line_every_5_seconds():
    assert LINE_EVERY_S == 5.0  # docs/training.md and docs/up.md say so
    assert TrainProgress(3).every_s == LINE_EVERY_S


def test_a_run_that_stops_early_still_ends_with_its_last_figures():
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=False)
    with TrainProgress(100, console=console, every_s=60.0, clock=clock) as progress:
        for step in range(1, 4):
            clock.now += 1.0
            progress.update(step, _row(step))
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/100", "3/100"]


def test_a_terminal_gets_the_bar_and_no_plain_lines():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with TrainProgress(3, console=console, every_s=0.0) as progress:
        for step in range(1, 4):
            progress.update(step, _row(step))
    text = out.getvalue()
    assert "3/3" in text and "\x1b" in text  # rich's live bar, drawn with escapes
    assert "train 1/3  0:00" not in text


def test_disabled_progress_prints_nothing_but_keeps_count(capsys):
    with TrainProgress(5, enabled=False) as progress:
        progress.update(2, _row(2))
        progress.set_total(4)
    assert (progress.completed, progress.total) == (2, 4)
    assert capsys.readouterr() == ("", "")


def test_captured_stderr_is_not_a_terminal_so_the_default_console_prints_lines(
        capsys, monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "FORCE_TERMINAL"):  # rich's overrides
        monkeypatch.delenv(name, raising=False)
    with TrainProgress(2) as progress:  # the default console: stderr
        progress.update(1, _row(1))
        progress.update(2, _row(2))
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("train 1/2  0:00:00  v1") and err[-1].startswith("train 2/2")


def test_several_teachers_show_each_ones_episodes_beside_the_bar():
    from miniverl.student.progress import progress_info

    row = {**_row(3), "by_teacher": {"calc": {"episodes": 5}, "nav": {"episodes": 7}}}
    assert progress_info(row) == "v3  loss 0.3333  rollout success 30%  teachers calc 5, nav 7"
    assert "teachers" not in progress_info(_row(3))  # one teacher: nothing added
