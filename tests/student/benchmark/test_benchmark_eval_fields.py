"""A benchmark cell carries the sampled (T=1) success and the state-coverage figure of
its run's evaluations beside the greedy success (``eval.samples``, docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from miniverl.student.benchmark.results import cell_result_from_run
from tests.toy_kit import events, make_recipe


def test_a_cell_reads_sampled_success_and_unseen_states_from_its_run(tmp_path):
    pytest.importorskip("torch")
    from miniverl.student.train.trainer import Trainer

    recipe = make_recipe("sft", tmp_path, cycles=1, sections={"eval": {"samples": 2}})
    with Trainer(recipe, show_progress=False, write_report=False) as trainer:
        result = trainer.train()
    before, after = events(result.run_dir, "eval")
    cell = cell_result_from_run(result.run_dir)
    assert cell.success_after == after["success"]
    assert cell.sampled_success_before == before["sampled"]["success"]
    assert cell.sampled_success_after == after["sampled"]["success"]
    assert after["sampled"]["episodes"] == 2 * after["n"]
    assert cell.unseen_states_after == after["coverage"]["unseen_share"]
    assert 0.0 <= cell.unseen_states_after <= 1.0
