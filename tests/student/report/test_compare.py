"""``miniverl report RUN_A RUN_B ...``: one offline page comparing runs.

A user comparing two arms relies on the page holding both runs' curves in the same
charts, their summaries in adjacent columns, and exactly the recipe fields that differ
(each run's value shown), and on a damaged run being named rather than hiding the page.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from miniverl.cli.app import app
from miniverl.common.errors import ConfigError
from miniverl.student.report.compare import build_comparison, recipe_differences
from miniverl.student.report.load import load_run
from tests.student.report import report_runs

runner = CliRunner()


def test_recipe_differences_list_each_differing_field_with_every_value(tmp_path):
    a, b = report_runs.make_pair(tmp_path)
    rows, same = recipe_differences([load_run(a), load_run(b)])
    assert rows == [("loss.top_k", ["8", "16"]), ("train.lr", ["—", "0.001"])]
    assert same >= 5  # run.name, run.mode, run.seed, loss.objective, train.cycles, ...


def test_comparison_page_overlays_curves_and_puts_summaries_side_by_side(tmp_path):
    a, b = report_runs.make_pair(tmp_path)
    out, runs = build_comparison([a, b], tmp_path / "compare.html")
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing leaves the file
    # One loss chart holding both runs: two polylines with a legend A and B.
    loss = re.search(r"<svg[^>]*>(?:(?!</svg>).)*Training loss.*?</svg>", html, flags=re.S)
    assert loss and loss.group(0).count("<polyline") == 2
    assert ">A</text>" in loss.group(0) and ">B</text>" in loss.group(0)
    held = re.search(r"<svg[^>]*>(?:(?!</svg>).)*Held-out success.*?</svg>", html, flags=re.S)
    assert held and held.group(0).count("<polyline") == 2
    # Summary rows carry one cell per run, in order: 12 and 8 optimizer steps.
    assert re.search(r"<td>optimizer steps</td><td>12</td><td>8</td>", html)
    assert "<code>loss.top_k</code></td><td>8</td><td>16</td>" in html
    assert [r.run_id for r in runs] == ["run-a", "run-b"]


def test_cli_compares_and_names_a_damaged_run(tmp_path):
    a, b = report_runs.make_pair(tmp_path)
    (b / "metrics.jsonl").unlink()
    out = tmp_path / "c.html"
    result = runner.invoke(app, ["report", str(a), str(b), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"comparison: {out}" in result.output
    assert "note: run-b: metrics.jsonl is missing" in result.output
    assert "B (run-b): metrics.jsonl is missing" in out.read_text()


def test_cli_refuses_bad_comparisons_in_one_line(tmp_path):
    a, b = report_runs.make_pair(tmp_path)
    result = runner.invoke(app, ["report", str(a), str(b), "--markdown", str(tmp_path / "m")])
    assert isinstance(result.exception, ConfigError) and "--markdown" in str(result.exception)
    with pytest.raises(ConfigError, match="given twice"):
        build_comparison([a, a], tmp_path / "x.html")
    with pytest.raises(ConfigError, match="2 to 8 runs"):
        build_comparison([a] * 9, tmp_path / "x.html")


def test_cli_exits_1_when_a_compared_run_is_tampered(tmp_path):
    a, b = report_runs.make_pair(tmp_path)
    path = b / "trajectories.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"policy_version":0', '"policy_version":5')
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "c.html"
    result = runner.invoke(app, ["report", str(a), str(b), "--out", str(out)])
    assert result.exit_code == 1 and out.is_file()
