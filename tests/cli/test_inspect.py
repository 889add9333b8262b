"""``miniverl inspect``: validates every trajectory, shows provenance, stays torch-free."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers")

from miniverl.cli.app import app  # noqa: E402
from miniverl.common.errors import ProvenanceError  # noqa: E402
from miniverl.common.toy import build_toy_tokenizer  # noqa: E402
from miniverl.common.trajectory import write_trajectories  # noqa: E402
from miniverl.student.environments import make_tasks  # noqa: E402
from miniverl.student.rollout.oracle import oracle_trajectories  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def traj_file(tmp_path_factory):
    tok = build_toy_tokenizer()
    trajs = oracle_trajectories("calculator", make_tasks("calculator", "train", 3, "easy", 0), tok, "fp")
    path = tmp_path_factory.mktemp("inspect") / "trajectories.jsonl"
    write_trajectories(path, trajs)
    tok_dir = path.parent / "tok"
    tok.save_pretrained(tok_dir)
    return path, trajs, tok_dir


def test_summary_table(traj_file):
    path, trajs, _ = traj_file
    result = runner.invoke(app, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    for word in ("assistant_tool_call", "tool_result", "final_answer", "calculator", "OK"):
        assert word in result.output


def test_summary_json_counts_tokens_by_span_type(traj_file):
    path, trajs, _ = traj_file
    result = runner.invoke(app, ["inspect", str(path), "--json"])
    info = json.loads(result.output)
    assert info["trajectories"] == 3 and info["tokens"] == sum(len(t.tokens) for t in trajs)
    rows = {r["span_type"]: r for r in info["provenance"]}
    assert rows["tool_result"]["in_loss"] is False and rows["assistant_final"]["in_loss"] is True
    assert info["loss_tokens"] == sum(int(t.loss_mask().sum()) for t in trajs)
    assert info["stop_reasons"] == {"final_answer": 3}
    assert info["tool_calls"]["by_name"] == {"calculator": 3}


def test_one_trajectory_as_ids_or_text(traj_file):
    path, trajs, tok_dir = traj_file
    ids = runner.invoke(app, ["inspect", str(path), "--trajectory", "1"])
    assert ids.exit_code == 0 and str(trajs[1].tokens[0]) in ids.output
    assert "messages" in ids.output
    text = runner.invoke(app, ["inspect", str(path), "-n", "1", "--tokenizer", str(tok_dir), "--json"])
    record = json.loads(text.output)
    assert "".join(record["span_text"]).startswith("<|im_start|>system")
    out_of_range = runner.invoke(app, ["inspect", str(path), "-n", "9"])
    assert out_of_range.exit_code != 0 and "out of range" in str(out_of_range.exception)


def test_an_edited_mask_is_rejected_with_file_and_line(traj_file, tmp_path):
    path, _, _ = traj_file
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    record["loss_mask"] = "1" * len(record["tokens"])
    lines[1] = json.dumps(record)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["inspect", str(bad)])
    assert isinstance(result.exception, ProvenanceError)
    assert f"{bad}:2" in str(result.exception)


@pytest.mark.slow
def test_inspect_runs_without_torch_and_exits_1_on_bad_input(traj_file, tmp_path):
    path, _, _ = traj_file
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from miniverl.cli.app import main; sys.argv = ['miniverl', 'inspect', *sys.argv[1:]]; main()"
    )
    ok = subprocess.run([sys.executable, "-c", code, str(path), "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["trajectories"] == 3
    missing = subprocess.run([sys.executable, "-c", code, str(tmp_path / "nope.jsonl")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_a_run_directory_picks_its_files_and_says_which(traj_file, tmp_path):
    # `inspect RUN_DIR` used to be refused; it reads the run's training episodes and
    # its last held-out evaluation, names them, and counts the eval files it skipped.
    path, trajs, _ = traj_file
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    write_trajectories(run / "trajectories.jsonl", trajs)
    write_trajectories(run / "eval" / "eval-v2.trajectories.jsonl", trajs[:1])
    write_trajectories(run / "eval" / "eval-v10.trajectories.jsonl", trajs[:2])  # newest
    result = runner.invoke(app, ["inspect", str(run)])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert "picked trajectories.jsonl" in first and "eval/eval-v10.trajectories.jsonl" in first
    assert "1 earlier eval file(s) not read" in first
    info = json.loads(runner.invoke(app, ["inspect", str(run), "--json"]).output)
    assert info["picked"]["eval"] == [str(run / "eval" / "eval-v10.trajectories.jsonl")]
    assert [f["trajectories"] for f in info["files"]] == [3, 2]
    one = runner.invoke(app, ["inspect", str(run), "-n", "2"])
    assert one.exit_code == 0 and "picked trajectories.jsonl" in one.output
    assert trajs[2].id in one.output


def test_a_directory_without_trajectories_is_one_clear_error(tmp_path):
    result = runner.invoke(app, ["inspect", str(tmp_path)])
    assert result.exit_code != 0
    assert "without trajectories files" in str(result.exception)
