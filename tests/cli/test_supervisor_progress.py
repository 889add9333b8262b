"""`up`'s progress follows the student's plan, also when the warm-up ends early."""

from __future__ import annotations

import json
from types import SimpleNamespace

from miniverl.cli.supervisor import Supervisor
from miniverl.common.jsonl_tail import JsonlTail
from miniverl.common.recipe import Recipe
from miniverl.student.progress import TrainProgress
from miniverl.student.train.optim import total_optimizer_steps
from tests.toy_kit import ONE_LAYER


def _recipe(**train) -> Recipe:
    return Recipe.model_validate({
        "run": {"name": "p", "mode": "opd"},
        "student": {"model": {"toy": ONE_LAYER}},
        "teacher": {"model": {"toy": ONE_LAYER}},
        "environment": {"name": "calculator"},
        "train": {"cycles": 5, "sft_warmup_steps": 20, **train},
    })


def _bar_after(tmp_path, recipe, rows):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sup = Supervisor.__new__(Supervisor)  # only the progress logic, no processes
    sup.recipe, sup.run = recipe, SimpleNamespace(metrics_path=metrics)
    sup._first_train_row_seen = False
    sup._planned_total = total_optimizer_steps(recipe)  # what _watch sets
    progress = TrainProgress(25, enabled=False)
    sup._update_progress(progress, JsonlTail(metrics))
    return progress


def _rows(warmup_end: int, distill: int):
    rows = [{"step": s, "phase": "sft_warmup", "version": s} for s in range(1, warmup_end + 1)]
    rows += [{"step": warmup_end + 1 + c, "phase": "train", "version": warmup_end + 1 + c,
              "cycle": c} for c in range(distill)]
    return rows


def test_the_bar_shrinks_when_the_warm_up_ends_early(tmp_path):
    recipe = _recipe(sft_warmup_until_loss=0.1)
    bar = _bar_after(tmp_path, recipe, _rows(12, 3))
    assert (bar.total, bar.completed) == (17, 15)  # 12 warm-up + 5 cycles


def test_the_bar_keeps_its_total_after_a_full_warm_up(tmp_path):
    bar = _bar_after(tmp_path, _recipe(), _rows(20, 5))
    assert (bar.total, bar.completed) == (25, 25)


def test_redirected_output_gets_plain_lines_from_the_metrics(tmp_path):
    # `up > log 2>&1`: the rows the student wrote so far appear as lines at once.
    import io

    from rich.console import Console

    recipe = _recipe()
    metrics_file = tmp_path / "metrics.jsonl"
    metrics_file.write_text("".join(json.dumps({**r, "loss": 0.5}) + "\n"
                                    for r in _rows(20, 2)))
    sup = Supervisor.__new__(Supervisor)
    sup.recipe, sup.run = recipe, SimpleNamespace(metrics_path=metrics_file)
    sup._first_train_row_seen, sup._planned_total = False, total_optimizer_steps(recipe)
    out = io.StringIO()
    with TrainProgress(25, console=Console(file=out, force_terminal=False)) as progress:
        sup._update_progress(progress, JsonlTail(metrics_file))
        assert out.getvalue().startswith("train 1/25  0:00:00  v1  loss 0.5000")
    assert out.getvalue().splitlines()[-1].startswith("train 22/25")
