"""The student's side of xvocab (docs/cross-tokenizer.md): a reply over the teacher's
positions onto the trajectory's selected positions, and the group sampled-token
estimator against closed forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from miniverl.common.alignment import MODEL, TEMPLATE, Alignment
from miniverl.common.recipe_sections import LossConfig
from miniverl.protocol.xvocab import groups_of_alignment
from miniverl.student.train.objectives import TeacherTargets
from miniverl.student.train.objectives.formulas import sampled_token_reverse_kl_P
from miniverl.student.train.objectives.group_sampled_token import GroupSampledToken
from miniverl.student.train.teacher.xvocab import student_targets


class _Traj:
    def __init__(self, n):
        self.tokens = list(range(n))


def _alignment(groups):
    g = np.asarray(groups, dtype=np.int64)
    return Alignment(g[:, 0], g[:, 1], g[:, 2], g[:, 3], g[:, 4], g[:, 5].astype(bool))


def _reply(alignment, teacher_lp_T):
    n_teacher = len(teacher_lp_T)
    positions = np.arange(n_teacher - 1, dtype=np.int32)  # every teacher token but the first
    return {"groups": groups_of_alignment(alignment),
            "teacher_ids": np.zeros(n_teacher, np.int32), "positions": positions,
            "target_logprobs": np.asarray(teacher_lp_T[1:], np.float32)}


def test_whole_selected_trainable_groups_are_kept_with_their_teacher_bytes_logprob():
    # Student tokens 0..7, teacher tokens 0..4. Group 0 is template (not trained); group
    # 1 = student tokens 1-3 / teacher 1-2; group 2 = student 4-5 / teacher 3; group 3 =
    # student 6-7 / teacher 4.
    a = _alignment([[0, 1, 0, 1, TEMPLATE, 0], [1, 4, 1, 3, MODEL, 1],
                    [4, 6, 3, 4, MODEL, 1], [6, 8, 4, 5, MODEL, 1]])
    teacher_lp = np.array([0.0, -0.5, -0.25, -1.0, -2.0])
    # Positions 0..5 selected (position p predicts token p + 1); token 7's position 6 is not.
    positions, arrays = student_targets(_Traj(8), np.arange(6), _reply(a, teacher_lp))
    np.testing.assert_array_equal(positions, [0, 1, 2, 3, 4])  # groups 1 and 2 whole
    np.testing.assert_allclose(arrays["target_logprobs"], [-0.75] * 3 + [-1.0] * 2)
    np.testing.assert_array_equal(arrays["group_first"], [1, 0, 0, 1, 0])


def test_one_token_groups_are_the_same_tokenizer_estimator():
    torch.manual_seed(0)
    hidden = torch.randn(5, 8, requires_grad=True)
    head = torch.nn.Linear(8, 11)
    sampled = torch.randint(0, 11, (5,))
    teacher = -torch.rand(5)
    targets = TeacherTargets(sampled, target_logprobs_P=teacher,
                             group_first_P=torch.ones(5, dtype=torch.int32))
    settings = LossConfig(estimator="sampled_token", divergence="reverse_kl", chunk_size=2)
    loss, metrics = GroupSampledToken(settings).loss(hidden, head, targets)
    ref_loss, ref_est = sampled_token_reverse_kl_P(head(hidden), sampled, teacher)
    torch.testing.assert_close(loss, ref_loss.mean())
    assert abs(metrics["divergence_sum"] - float(ref_est.sum())) < 1e-5


def test_a_group_gets_the_advantage_of_its_bytes_even_across_chunks():
    torch.manual_seed(1)
    hidden = torch.randn(4, 6, requires_grad=True)
    head = torch.nn.Linear(6, 7)
    sampled = torch.randint(0, 7, (4,))
    # Two groups: positions 0-2 (cut by chunk_size=2) and position 3.
    t_bytes = torch.tensor([-3.0, -3.0, -3.0, -0.5])
    targets = TeacherTargets(sampled, target_logprobs_P=t_bytes,
                             group_first_P=torch.tensor([1, 0, 0, 1]))
    settings = LossConfig(estimator="sampled_token", divergence="reverse_kl", chunk_size=2)
    loss, metrics = GroupSampledToken(settings).loss(hidden, head, targets)
    logp = torch.log_softmax(head(hidden), -1).gather(-1, sampled[:, None]).squeeze(-1)
    s_bytes = torch.stack([logp[:3].sum(), logp[3]])
    adv = (torch.tensor([-3.0, -0.5]) - s_bytes).detach()
    expected = -(adv[0] * logp[:3].sum() + adv[1] * logp[3]) / 4
    torch.testing.assert_close(loss, expected)
    assert abs(metrics["divergence_sum"] - float(-adv.sum())) < 1e-5
    loss.backward()  # the gradient flows through every position of the group
    assert hidden.grad is not None and bool((hidden.grad.abs().sum(-1) > 0).all())


@pytest.mark.slow  # starts a trainer
def test_a_teacher_that_does_not_serve_xvocab_is_refused_before_any_rollout(tmp_path, toy):
    from miniverl.common.errors import TokenizerMismatch
    from miniverl.student.train.trainer import Trainer
    from tests.toy_kit import make_recipe

    recipe = make_recipe("opd", tmp_path, cycles=1, sections={
        "teacher": {"tokenizer": "other"},
        "loss": {"estimator": "sampled_token", "divergence": "reverse_kl"}})
    trainer = Trainer(recipe, client=toy.fake_client(), show_progress=False,
                      write_report=False, checkpoints=False)
    with trainer, pytest.raises(TokenizerMismatch, match="does not serve them"):
        trainer.train()
    assert trainer.state.cycle == 0 and trainer.version == 0


def test_a_request_renders_the_tool_schemas_the_episode_was_played_with():
    # calculator with units: false shows one tool; a request rendered with the default
    # environment's two would not be the episode's tokens, and every episode of such a
    # run would be counted unaligned and trained on nowhere.
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.common.toy import build_toy_tokenizer
    from miniverl.student.environments import make_tasks
    from miniverl.student.rollout.oracle import oracle_trajectories
    from miniverl.student.train.teacher.xvocab import XvocabRequests

    tok = build_toy_tokenizer()
    params = {"units": False}
    tasks = make_tasks("calculator", "train", 3, "easy", 0, params)
    trajs = oracle_trajectories("calculator", tasks, tok, fingerprint_tokenizer(tok), params)
    played = XvocabRequests(tok, {"calculator": params})
    assert all(played(t) is not None for t in trajs) and (played.sent, played.unaligned) == (3, 0)
    default = XvocabRequests(tok)
    assert all(default(t) is None for t in trajs) and default.unaligned == 3
    # A mixture (several teachers of another tokenizer): each episode is rendered with its
    # own environment's params, not another member's.
    nav = oracle_trajectories("jsonnav", make_tasks("jsonnav", "train", 2, "easy", 0, {}), tok,
                              fingerprint_tokenizer(tok), {})
    mixture = XvocabRequests(tok, {"calculator": params, "jsonnav": {}})
    assert all(mixture(t) is not None for t in [*trajs, *nav]) and mixture.unaligned == 0
    others = XvocabRequests(tok, {"jsonnav": params})  # calculator's params given to jsonnav
    assert [others(t) is None for t in trajs] == [True] * 3
