"""Bad inputs get one line and exit 1, never a traceback (issue 18).

Every command that takes a file or a directory is fed a binary file, a truncated file,
an empty file, a wrong-typed file (a YAML list for a mapping, JSON where YAML is
expected, a Parquet file with the wrong columns or column types) and a missing path.
A user relies on the answer being one ``error:`` line that names the file and says what
to do, with exit code 1 (2 only for typer's own usage errors).

The commands run in-process through :func:`miniverl.cli.app.run`, the same wrapper the
``miniverl`` console script uses; nothing here opens a socket or starts a process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from miniverl.cli.app import run

BINARY = os.urandom(1024) + b"\x00\xff\xfe\x89PNG\r\n\x1a\n"
if BINARY[:1].isascii():  # the first byte must not decode as UTF-8 either
    BINARY = b"\xdf" + BINARY


def _parquet(path: Path, columns: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    """A folder of bad inputs; names are used by CASES below."""
    root = tmp_path_factory.mktemp("bad")
    texts = {
        "empty.yaml": "",
        "empty.jsonl": "",
        "list.yaml": "- a\n- b\n",
        "trunc.yaml": "run:\n  name: x\n  mode: [op",
        "trunc.json": '{"run": {"name": "x"',
        "list.jsonl": "[1, 2]\n",
        "trunc.jsonl": '{"id": "t0", "spans": [',
        "types.jsonl": json.dumps({"id": 1, "split": 2, "prompt": 3, "answer": 4}) + "\n",
    }
    for name, text in texts.items():
        (root / name).write_text(text)
    for name in ("bin.yaml", "bin.jsonl", "bin.parquet", "bin.gguf", "bin.json"):
        (root / name).write_bytes(BINARY)
    (root / "empty.gguf").write_bytes(b"")
    _parquet(root / "columns.parquet", {"x": [1, 2]})
    _parquet(root / "types.parquet", {"extra_info": ["not a struct"], "prompt": ["a"]})
    whole = (root / "columns.parquet").read_bytes()
    (root / "trunc.parquet").write_bytes(whole[: len(whole) // 2])
    (root / "emptydir").mkdir()
    # Run directories whose files are binary, truncated, a list, or empty.
    for kind, content in (
        ("bin", BINARY),
        ("trunc", b'{"status": "ru'),
        ("list", b"[1, 2]\n"),
        ("empty", b""),
    ):
        run_dir = root / f"run_{kind}"
        run_dir.mkdir()
        for name in ("status.json", "manifest.json"):
            (run_dir / name).write_bytes(content)
        recipe = content if kind != "trunc" else b"run:\n  name: [x"
        (run_dir / "recipe.resolved.yaml").write_bytes(recipe)
        (run_dir / "recipe.yaml").write_bytes(recipe)
        cache = root / f"cache_{kind}"
        cache.mkdir()
        (cache / "index.json").write_bytes(content)
    return root


# (command line with {names} under the `bad` folder, what the one line must mention)
CASES: list[tuple[str, str]] = [
    # inspect: a trajectories file
    ("inspect bin.jsonl", "UTF-8"),
    ("inspect empty.jsonl", "empty"),
    ("inspect trunc.jsonl", "not valid JSON"),
    ("inspect list.jsonl", "JSON object"),
    ("inspect missing.jsonl", "does not exist"),
    ("inspect emptydir", "without trajectories files"),
    # report: a run directory
    ("report missing", "does not exist"),
    ("report bin.json", "run directory"),
    ("report emptydir", "not a run directory"),
    # validate, train --dry-run, up, teacher serve, qualify-teacher: a recipe
    ("validate bin.yaml", "UTF-8"),
    ("validate empty.yaml", "mapping"),
    ("validate list.yaml", "mapping"),
    ("validate trunc.yaml", "not valid YAML"),
    ("validate trunc.json", "not valid YAML"),
    ("validate missing.yaml", "does not exist"),
    ("validate emptydir", "emptydir"),
    ("train bin.yaml --dry-run", "UTF-8"),
    ("train list.yaml --dry-run", "mapping"),
    ("train trunc.yaml --dry-run", "not valid YAML"),
    ("train missing.yaml --dry-run", "does not exist"),
    ("up bin.yaml --quiet", "UTF-8"),
    ("up list.yaml", "mapping"),
    ("up missing.yaml --quiet", "does not exist"),
    ("teacher serve --recipe bin.yaml", "UTF-8"),
    ("teacher serve --recipe list.yaml", "mapping"),
    ("teacher serve --recipe missing.yaml", "does not exist"),
    ("qualify-teacher bin.yaml", "UTF-8"),
    # import-verl: a verl config
    ("import-verl bin.yaml --out out/r.yaml", "UTF-8"),
    ("import-verl empty.yaml --out out/r.yaml", "is empty"),
    ("import-verl list.yaml --out out/r.yaml", "mapping"),
    ("import-verl trunc.yaml --out out/r.yaml", "not valid YAML"),
    ("import-verl trunc.json --out out/r.yaml", "not valid YAML"),
    ("import-verl missing.yaml --out out/r.yaml", "does not exist"),
    ("import-verl emptydir --out out/r.yaml", "directory"),
    # convert-dataset: Parquet back to tasks, tasks to Parquet
    ("convert-dataset bin.parquet out/x.jsonl --to miniverl", "not a readable Parquet"),
    ("convert-dataset trunc.parquet out/x.jsonl --to miniverl", "not a readable Parquet"),
    ("convert-dataset columns.parquet out/x.jsonl --to miniverl", "extra_info.miniverl"),
    ("convert-dataset types.parquet out/x.jsonl --to miniverl", "wrong type"),
    ("convert-dataset bin.jsonl out/x.parquet --to verl --environment calculator", "UTF-8"),
    ("convert-dataset list.jsonl out/x.parquet --to verl --environment calculator", "object"),
    ("convert-dataset types.jsonl out/x.parquet --to verl --environment calculator", "task"),
    ("convert-dataset trunc.jsonl out/x.parquet --to verl --environment calculator", "JSON"),
    ("convert-dataset list.yaml out/x.parquet --to verl", "mapping"),
    ("convert-dataset bin.yaml out/x.parquet --to verl", "UTF-8"),
    ("convert-dataset missing.jsonl out/x.parquet --to verl", "does not exist"),
    # cache commands: a targets cache directory
    ("cache stats cache_bin", "index"),
    ("cache stats cache_trunc", "index"),
    ("cache stats cache_list", "index"),
    ("cache stats cache_empty", "index"),
    ("cache stats missing", "index.json is missing"),
    ("cache validate cache_bin", "index"),
    ("cache prune cache_trunc --max-bytes 10", "index"),
    # run directories: export-adapter, export-verl, eval, status, export-benchmark
    ("export-adapter --run run_bin --out out/a", "UTF-8"),
    ("export-adapter --run run_list --out out/a", "mapping"),
    ("export-adapter --run missing --out out/a", "recipe.resolved.yaml"),
    ("export-verl --run run_trunc --out out/b", "not valid YAML"),
    ("export-verl --run run_empty --out out/b", "mapping"),
    ("export-verl --run missing --out out/b", "recipe.resolved.yaml"),
    ("eval --run run_bin", "manifest.json"),
    ("eval --run run_trunc", "manifest.json"),
    ("eval --run missing", "run directory"),
    ("status run_bin", "status.json"),
    ("status run_trunc", "status.json"),
    ("status run_list", "status.json"),
    ("status run_empty", "status.json"),
    ("status missing", "run directory"),
    ("export-benchmark run_bin --out out/e.json", "status.json"),
    ("export-benchmark emptydir --out out/e.json", "run directory"),
    ("export-benchmark bin.json --out out/e.json", "benchmark results"),
    ("export-benchmark missing --out out/e.json", "neither"),
    # bridge doctor: a bundle directory
    ("bridge doctor missing", "does not exist"),
    ("bridge doctor bin.json", "is a file"),
    # benchmark: a benchmark config
    ("benchmark bin.yaml", "UTF-8"),
    ("benchmark list.yaml", "error(s)"),
    ("benchmark trunc.yaml", "not valid YAML"),
    ("benchmark missing.yaml", "does not exist"),
    ("benchmark emptydir", "directory"),
    # convert-gguf: a GGUF file
    ("convert-gguf bin.gguf", "not a GGUF file"),
    ("convert-gguf empty.gguf", "not a GGUF file"),
    ("convert-gguf missing.gguf", "does not exist"),
]


def _run(bad: Path, command: str, capsys) -> tuple[int, str, str]:
    cwd = os.getcwd()
    os.chdir(bad)
    try:
        code = run(command.split())
    except BaseException as exc:  # noqa: BLE001 - the test is that nothing escapes
        pytest.fail(f"`miniverl {command}` raised {type(exc).__name__}: {exc}")
    finally:
        os.chdir(cwd)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_at_least_thirty_bad_inputs():
    # The closing note counts them: 0 tracebacks across >= 30 bad CLI inputs.
    assert len(CASES) >= 30
    assert len({command for command, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("command", "mention"), CASES, ids=[c for c, _ in CASES])
def test_bad_input_is_one_line_and_exit_1(bad, command, mention, capsys):
    code, out, err = _run(bad, command, capsys)
    assert code == 1, (code, out, err)
    assert "Traceback" not in out + err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    # One error line (validate-style reports add one line per further problem, and a
    # count; a single bad input makes one problem).
    assert len(errors) == 1, err
    assert len(err.strip().splitlines()) <= 2, err
    assert mention in errors[0], errors[0]


@pytest.mark.parametrize("run_dir", ["run_bin", "run_trunc", "run_list"])
def test_report_on_a_corrupted_run_exits_1_with_one_error(bad, run_dir, capsys):
    # The report still writes the page and lists what it skipped (notes), but the exit
    # code and the one error line must not call a corrupted run sound.
    code, out, err = _run(bad, f"report {run_dir}", capsys)
    assert code == 1 and "Traceback" not in out + err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


def test_bridge_doctor_on_a_folder_that_is_not_a_bundle_reports_and_exits_1(bad, capsys):
    # An existing folder is the doctor's to judge: its report names the failed check.
    code, out, err = _run(bad, "bridge doctor emptydir", capsys)
    assert code == 1 and "Traceback" not in out + err
    assert "not a miniverl verl bundle" in out and "FAILED" in out


def test_usage_errors_exit_2_without_traceback(bad, capsys):
    code, out, err = _run(bad, "inspect", capsys)
    assert code == 2 and "Traceback" not in out + err
    assert "Missing argument" in err
