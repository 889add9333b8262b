"""Where the benchmark scripts write: a fresh folder, or the committed record when told."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from miniverl.student.benchmark.outputs import (
    add_output_options,
    relative_to,
    script_output_file,
    tracked_by_git,
)


def parse(argv: list[str], committed: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_output_options(parser, committed)
    return parser.parse_args(argv)


def test_a_script_writes_a_fresh_folder_unless_told(tmp_path):
    committed = tmp_path / "benchmarks" / "results" / "x.json"
    assert script_output_file(parse([], committed), committed, tmp_path) == (
        tmp_path / "runs" / "benchmarks" / "x" / "x.json")
    assert script_output_file(parse(["--update-committed"], committed), committed,
                              tmp_path) == committed
    elsewhere = tmp_path / "mine"
    assert script_output_file(parse(["--output-dir", str(elsewhere)], committed), committed,
                              tmp_path) == elsewhere / "x.json"
    with pytest.raises(SystemExit, match="both say where to write"):
        script_output_file(parse(["--output-dir", str(elsewhere), "--update-committed"],
                                 committed), committed, tmp_path)


def test_a_committed_file_is_refused_by_name(tmp_path):
    committed = tmp_path / "benchmarks" / "results" / "x.json"
    committed.parent.mkdir(parents=True)
    committed.write_text("{}")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "benchmarks"], check=True)
    assert tracked_by_git([committed, tmp_path / "nope.json"]) == [committed]
    args = parse(["--output-dir", str(committed.parent)], committed)
    with pytest.raises(SystemExit, match=r"x\.json is a committed result; pass --update-committed"):
        script_output_file(args, committed, tmp_path)


def test_stored_paths_are_relative(tmp_path):
    assert relative_to(tmp_path / "out" / "runs" / "a", tmp_path / "out") == "runs/a"
    assert relative_to(tmp_path / "b", tmp_path / "out") == "../b"
