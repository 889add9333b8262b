"""TRL 1.16's own client gets our teacher's targets from ``miniverl teacher serve --openai``.

A TRL user points ``ServerDistillationTrainer`` (``teacher_model_server_url``) at our
teacher and relies on ``VLLMClient.get_sequence_logprobs`` returning exactly what our
teacher computes: the same top-k ids in the same order, the same log-probs as float32,
the actual token's log-prob for the reverse-KL term. This test serves a toy teacher with
``miniverl teacher serve --openai 127.0.0.1:0`` (a real process), runs TRL's client code
in the TRL venv (``tests/teacher_server/trl_client_check.py``: TRL's constructor, its
``/health`` wait and ``/v1/models`` lookup, ``get_sequence_logprobs``) and compares with
``score_positions`` on the same weights in this process. Marker ``integration``; skips
without the venv (``bash tests/teacher_server/setup_trl_venv.sh``), which also holds
the aiohttp the server's endpoint needs.

A second test runs TRL's ``ServerDistillationTrainer`` itself against the same endpoint
(``tests/teacher_server/trl_trainer_check.py``): a toy student of the teacher's tokenizer
(other weights) generates, asks our teacher for its top-k, and takes optimizer steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.toy_kit import ONE_LAYER, toy_dir

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("MINIVERL_TRL_VENV", Path.home() / ".cache/miniverl/trl-1.16.0-venv"))
PYTHON = VENV / "bin" / "python"
K = 8


def _trl_missing() -> str | None:
    if not PYTHON.is_file():
        return (f"no TRL venv at {VENV}; create it with: bash "
                "tests/teacher_server/setup_trl_venv.sh (pip install trl==1.16.0 aiohttp)")
    probe = subprocess.run(
        [str(PYTHON), "-c", "from importlib.metadata import version as v; "
         "print(v('trl'), v('aiohttp'))"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0 or not probe.stdout.startswith("1.16.0 "):
        return f"trl 1.16.0 and aiohttp are not both in {VENV}: {(probe.stderr or probe.stdout)[-300:]}"
    return None


def _bound_port(log: Path, proc: subprocess.Popen, timeout_s: float = 120.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.is_file():
            for line in log.read_text().splitlines():
                record = json.loads(line)
                if record["event"] == "openai_bound":
                    return int(record["port"])
        if proc.poll() is not None:
            raise AssertionError(f"teacher exited {proc.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError("the teacher did not bind its OpenAI endpoint in time")


def _serve(model_dir: Path, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """``miniverl teacher serve --openai 127.0.0.1:0`` on ``model_dir`` (a real process)."""
    log = tmp_path / "teacher.jsonl"
    proc = subprocess.Popen(
        [str(PYTHON), "-m", "miniverl.cli.app", "teacher", "serve", "--model", str(model_dir),
         "--bind", f"ipc://{tmp_path}/t.sock", "--openai", "127.0.0.1:0", "--log", str(log),
         "--device", "cpu", "--dtype", "float32", "--threads", "1",
         # A cached prefix rounds differently from one pass over the whole sequence.
         "--prefix-cache-tokens", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return proc, log


def test_trls_client_gets_our_targets(tmp_path):
    reason = _trl_missing()
    if reason:
        pytest.skip(reason)
    import torch
    from transformers import AutoModelForCausalLM

    from miniverl.teacher_server.scoring import score_positions

    model_dir = toy_dir(ONE_LAYER, seed=1)
    proc, log = _serve(model_dir, tmp_path)
    try:
        port = _bound_port(log, proc)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        vocab = model.get_output_embeddings().weight.shape[0]
        rng = np.random.default_rng(0)
        lengths, prompt_lengths = [12, 9, 15], [4, 3, 6]
        sequences = [rng.integers(0, vocab, n).tolist() for n in lengths]
        request = tmp_path / "request.json"
        request.write_text(json.dumps({"sequences": sequences, "prompt_lengths": prompt_lengths,
                                       "k": K, "temperature": 1.0}))
        run = subprocess.run(
            [str(PYTHON), str(HERE / "trl_client_check.py"), f"http://127.0.0.1:{port}",
             str(request)], capture_output=True, text=True, timeout=300)
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith("TRL_RESULT ")]
        assert lines, f"rc={run.returncode}\n{run.stderr[-3000:]}"
        got = json.loads(lines[-1][len("TRL_RESULT "):])
    finally:
        proc.terminate()
        proc.wait(60)
    assert got["trl_version"] == "1.16.0" and got["model"] == model_dir.name
    # The request the endpoint makes of one HTTP body: the sequences packed into one SCORE,
    # every position but each sequence's last.
    cu = np.concatenate([[0], np.cumsum(lengths)])
    packed = score_positions(model, np.concatenate(sequences), cu,
                             np.concatenate([np.arange(cu[i], cu[i + 1] - 1) for i in range(3)]),
                             kind="topk", k=K)
    row = 0
    for b, (seq, start) in enumerate(zip(sequences, prompt_lengths, strict=True)):
        # TRL's position q holds the teacher's distribution over token q: our position q-1.
        rows = slice(row + start - 1, row + len(seq) - 1)
        row += len(seq) - 1
        ref = {name: packed[name][rows] for name in packed}
        assert np.array_equal(np.array(got["logprob_token_ids"][b]), ref["ids"])
        assert np.array_equal(np.array(got["logprobs"][b], dtype=np.float32), ref["logprobs"])
        # The token actually there, in or outside the top-k: TRL's reverse-KL input.
        assert np.array_equal(np.array(got["actual_logprobs"][b], dtype=np.float32)[:, 0],
                              ref["target_logprobs"])
        assert [t[0] for t in got["actual_token_ids"][b]] == seq[start:]


def test_trls_server_distillation_trainer_trains_against_our_teacher(tmp_path):
    # TRL's own trainer, unchanged but for the client-side vLLM import check: it asks our
    # teacher for the top-k of every on-policy completion and takes its optimizer steps.
    reason = _trl_missing()
    if reason:
        pytest.skip(reason)
    teacher_dir, student_dir = toy_dir(ONE_LAYER, seed=1), toy_dir(ONE_LAYER, seed=2)
    proc, log = _serve(teacher_dir, tmp_path)
    try:
        port = _bound_port(log, proc)
        run = subprocess.run(
            [str(PYTHON), str(HERE / "trl_trainer_check.py"), f"http://127.0.0.1:{port}",
             str(student_dir), str(tmp_path / "trl_out")],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                 "CUDA_VISIBLE_DEVICES": "", "WANDB_DISABLED": "true"})
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith("TRL_TRAINER ")]
        assert lines, f"rc={run.returncode}\n{run.stderr[-4000:]}"
        got = json.loads(lines[-1][len("TRL_TRAINER "):])
    finally:
        proc.terminate()
        proc.wait(60)
    assert got["trl_version"] == "1.16.0" and got["global_step"] == 2
    losses = [row["loss"] for row in got["log_history"] if "loss" in row]
    # Each step's loss is the top-k forward KL to our teacher's targets: a student with
    # other weights is at a positive, finite distance from it.
    assert len(losses) == 2 and all(np.isfinite(v) and v > 0 for v in losses), got["log_history"]
