"""OPD from a teacher with another tokenizer, over a real ZeroMQ socket (xvocab).

The student is the toy (byte tokenizer); the teacher a toy-shaped Qwen3 model over the
byte-fallback BPE of ``tests/common/cross_tokenizer_kit.py`` (another vocabulary, another
fingerprint, the same chat template), served by the real ``TeacherServer`` bound to an
ipc socket in this process (the ``other_teacher`` fixture, ``conftest.py``). The recipe opts in with ``teacher.tokenizer: other``; the
trainer announces xvocab, sends each trajectory's episode, and trains with the group
sampled-token estimator, or with ``loss.cross_vocab: hybrid`` (exact pairs and ULD from
the teacher's top-k; docs/cross-tokenizer.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.common.cross_tokenizer_kit import byte_fallback_tokenizer
from tests.student.train.trainer_kit import LossRecorder
from tests.toy_kit import make_recipe, metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

torch.set_num_threads(1)


def test_opd_from_a_teacher_with_another_tokenizer(tmp_path, other_teacher, monkeypatch):
    from miniverl.student.train.trainer import Trainer

    endpoint, teacher_fp = other_teacher
    # A few SFT steps on oracle traces first: a random byte-level student writes bytes
    # that are not UTF-8, which no rendering holds, so nothing of it could be aligned.
    recipe = make_recipe("opd", tmp_path / "run", cycles=3, sft_warmup_steps=60,
                         sft_warmup_lr=1e-2, sections={
        "teacher": {"tokenizer": "other"},
        "loss": {"estimator": "sampled_token", "divergence": "reverse_kl"},
    })
    trainer = Trainer(recipe, teacher_endpoint=endpoint, show_progress=False,
                      write_report=False)
    recorder = LossRecorder(trainer).install(monkeypatch)
    import miniverl.student.train.updates as steps_module

    recorded, moved = steps_module.distill_step, []

    def snapshot(policy, *args, **kw):  # did each OPD update move the weights?
        if kw["objective"].kind == "none":  # an SFT step (the warm-up)
            return recorded(policy, *args, **kw)
        before = [p.detach().clone() for p in policy.model.parameters()]
        out = recorded(policy, *args, **kw)
        moved.append(any(not torch.equal(a, p) for a, p in zip(before, policy.model.parameters(),
                                                                 strict=True)))
        return out

    monkeypatch.setattr(steps_module, "distill_step", snapshot)
    with trainer:
        result = trainer.train()
        requests = trainer.state.teacher.link.xvocab
    assert result.status == "completed" and len(recorder.calls) == 3  # the OPD updates
    assert trainer.state.teacher.identity["name"] == "byte-fallback-teacher"
    assert trainer.state.teacher.client.hello.tokenizer_fp == teacher_fp
    assert requests.sent > 0
    assert (result.counters["xvocab_sent"], result.counters["xvocab_unaligned"]) == (
        requests.sent, requests.unaligned)
    trained = [(traj, pos, arrays) for call in recorder.calls
               for traj, pos, arrays, _, _ in call["scored"] if len(pos)]
    assert trained, f"no aligned positions ({requests.sent} sent, {requests.unaligned} not)"
    for _traj, positions, arrays in trained:
        assert arrays["target_logprobs"].shape == positions.shape
        assert np.isfinite(arrays["target_logprobs"]).all() and arrays["group_first"][0] == 1
    rows = metrics(result.run_dir)  # the warm-up's SFT steps, then the OPD updates
    assert len(rows) >= 3 and all(np.isfinite(r["loss"]) for r in rows)
    assert all(r["stale_dropped"] == 0 for r in rows)
    assert moved == [True, True, True]


def test_opd_with_the_hybrid_target_over_the_socket(tmp_path, other_teacher, monkeypatch):
    """``loss.cross_vocab: hybrid``: exact pairs by forward KL, ULD on the other groups,
    from the teacher's top-k; the student reads the teacher's tokenizer from
    ``teacher.model.path`` for the vocabulary map and reports its coverage."""
    from miniverl.common.rundir import RunDir
    from miniverl.student.train.trainer import Trainer

    endpoint, teacher_fp = other_teacher
    tok_dir = tmp_path / "teacher_tokenizer"
    byte_fallback_tokenizer().save_pretrained(tok_dir)
    recipe = make_recipe("opd", tmp_path / "run", cycles=3, sft_warmup_steps=60,
                         sft_warmup_lr=1e-2, sections={
        "teacher": {"tokenizer": "other", "model": {"path": str(tok_dir)}},
        "loss": {"cross_vocab": "hybrid", "top_k": 8},
    })
    trainer = Trainer(recipe, teacher_endpoint=endpoint, show_progress=False,
                      write_report=False)
    recorder = LossRecorder(trainer).install(monkeypatch)
    import miniverl.student.train.updates as steps_module

    recorded, moved = steps_module.distill_step, []

    def snapshot(policy, *args, **kw):
        if kw["objective"].kind == "none":  # an SFT step (the warm-up)
            return recorded(policy, *args, **kw)
        before = [p.detach().clone() for p in policy.model.parameters()]
        out = recorded(policy, *args, **kw)
        moved.append(any(not torch.equal(a, p) for a, p in zip(before, policy.model.parameters(),
                                                                 strict=True)))
        return out

    monkeypatch.setattr(steps_module, "distill_step", snapshot)
    with trainer:
        result = trainer.train()
    assert result.status == "completed" and len(recorder.calls) == 3
    assert trainer.state.teacher.client.hello.tokenizer_fp == teacher_fp
    [event] = [e for e in RunDir(result.run_dir).events() if e["event"] == "vocab_map"]
    assert event["teacher"] == teacher_fp and event["mapped"] > 0
    assert 0 < event["student_share"] <= 1 and 0 < event["teacher_share"] <= 1
    counters = result.counters
    # Toy byte student, byte-fallback teacher: both kinds of group are trained.
    assert counters["xvocab_exact_groups"] > 0 and counters["xvocab_uld_groups"] > 0
    trained = [arrays for call in recorder.calls
               for _traj, pos, arrays, _, _ in call["scored"] if len(pos)]
    assert trained
    for arrays in trained:
        first = arrays["group_first"].astype(bool)
        assert arrays["logprobs"].shape == (first.shape[0], 8)
        rows = arrays["logprobs"][first]
        assert np.isfinite(rows.max(axis=1)).all()  # every group's row holds some mass
    rows = metrics(result.run_dir)
    assert len(rows) >= 3 and all(np.isfinite(r["loss"]) for r in rows)
    assert moved == [True, True, True]
