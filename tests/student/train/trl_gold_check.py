"""Runs inside the TRL 1.16 venv (tests/teacher_server/setup_trl_venv.sh): TRL's own
GOLD functions on the inputs tests/student/train/test_cross_vocab_trl.py wrote.

Reads ``inputs.npz`` and ``cases.json`` from the directory in argv[1] and writes
``trl.npz`` there: per case, TRL's byte-offset alignment groups, its merged group
probabilities (both strategies), ``ULDLoss``'s distillation loss (plain and hybrid) and
its vocabulary mapping for a real tokenizer pair. Not a test module: it imports TRL,
which the README environment does not hold.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.gold import GOLDConfig  # noqa: E402
from trl.experimental.gold.gold_trainer import ULDLoss  # noqa: E402


def _loss(strategy: str, hybrid: bool, student_temperature: float, teacher_temperature: float,
          beta: float) -> ULDLoss:
    config = GOLDConfig(
        output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True, bf16=False, use_uld_loss=True, use_extended_uld=True,
        uld_crossentropy_weight=0.0, uld_distillation_weight=1.0,
        uld_student_temperature=student_temperature, uld_teacher_temperature=teacher_temperature,
        uld_skip_student_eos=False, uld_skip_teacher_eos=False,
        uld_token_merge_strategy=strategy, uld_use_hybrid_loss=hybrid, beta=beta,
        teacher_model_name_or_path="unused", teacher_tokenizer_name_or_path="unused",
    )
    return ULDLoss(config)


def main(root: Path) -> None:
    data = dict(np.load(root / "inputs.npz"))
    cases = json.loads((root / "cases.json").read_text())
    out: dict[str, np.ndarray] = {}
    for c, case in enumerate(cases):
        a = lambda name, c=c: data[f"{c}_{name}"]  # noqa: E731
        s_off = a("s_offsets").tolist()
        t_off = a("t_offsets").tolist()
        s_groups, t_groups = ULDLoss._align_by_byte_offsets(s_off, t_off)
        out[f"{c}_s_group_sizes"] = np.asarray([len(g) for g in s_groups])
        out[f"{c}_t_group_sizes"] = np.asarray([len(g) for g in t_groups])
        probs = torch.from_numpy(a("probs"))
        ids = a("ids").tolist()
        for strategy in ("observed", "bayesian"):
            merger = _loss(strategy, False, 1.0, 1.0, 1.0)
            merged = merger._merge_probabilities_with_alignment_groups(probs, s_groups, ids)
            out[f"{c}_merged_{strategy}"] = merged.numpy()
        # The whole ULDLoss on one sequence: prompt, then completion positions.
        s_logits = torch.from_numpy(a("s_logits"))[None]
        t_logits = torch.from_numpy(a("t_logits"))[None]
        s_labels = torch.from_numpy(a("s_labels"))[None]
        t_labels = torch.from_numpy(a("t_labels"))[None]
        s_bo = torch.from_numpy(a("s_byte_offsets"))[None]
        t_bo = torch.from_numpy(a("t_byte_offsets"))[None]
        for strategy in ("observed", "bayesian"):
            for hybrid in (False, True):
                loss = _loss(strategy, hybrid, case["student_temperature"],
                             case["teacher_temperature"], case["beta"])
                if hybrid:  # the matched pairs the test chose, as TRL's mapping holds them
                    t_m, s_m = a("teacher_matched").tolist(), a("student_matched").tolist()
                    loss._vocab_mapping = dict(zip(t_m, s_m, strict=True))
                    loss._teacher_matched_ids = set(t_m)
                    loss._student_matched_ids = set(s_m)
                    loss.mapping_tensor = torch.full((max(t_m) + 1,), -1, dtype=torch.long)
                    loss.mapping_tensor[torch.tensor(t_m)] = torch.tensor(s_m)
                value = loss(s_logits, t_logits, s_labels, t_labels, s_labels.clamp_min(0),
                             t_labels.clamp_min(0), student_byte_offsets=s_bo,
                             teacher_byte_offsets=t_bo)
                out[f"{c}_uld_{strategy}_{'hybrid' if hybrid else 'plain'}"] = np.asarray(
                    float(value))
    pairs = json.loads((root / "pairs.json").read_text()) if (root / "pairs.json").is_file() else []
    from transformers import AutoTokenizer

    for p, (student_dir, teacher_dir) in enumerate(pairs):
        student = AutoTokenizer.from_pretrained(student_dir)
        teacher = AutoTokenizer.from_pretrained(teacher_dir)
        mapper = ULDLoss.__new__(ULDLoss)
        object.__setattr__(mapper, "student_tokenizer", student)
        object.__setattr__(mapper, "teacher_tokenizer", teacher)
        object.__setattr__(mapper, "device", None)
        ULDLoss._initialize_vocabulary_mapping(mapper)
        items = sorted(mapper._vocab_mapping.items())
        out[f"pair{p}_teacher_ids"] = np.asarray([t for t, _ in items])
        out[f"pair{p}_student_ids"] = np.asarray([s for _, s in items])
    np.savez(root / "trl.npz", **out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
