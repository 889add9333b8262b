"""ULD and the hybrid from xvocab replies (``loss.cross_vocab: uld | hybrid``,
docs/cross-tokenizer.md): the reply's rows onto the student's groups, the objective
against closed forms and against the ``cross_vocab.py`` functions that
``test_cross_vocab_trl.py`` checks against TRL 1.16, and chunks that never cut a group."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from miniverl.common.alignment import MODEL, Alignment
from miniverl.common.errors import ConfigError
from miniverl.common.recipe_sections import LossConfig
from miniverl.protocol.xvocab import groups_of_alignment
from miniverl.student.train.objectives import TeacherTargets
from miniverl.student.train.objectives.group_uld import GroupULD, group_chunks
from miniverl.student.train.objectives.table import objective_for_kind
from miniverl.student.train.teacher.cross_vocab import (
    VocabMap,
    exact_forward_kl_P,
    merge_group_probs,
    uld_distance_G,
)
from miniverl.student.train.teacher.xvocab import student_targets

SETTINGS = LossConfig(cross_vocab="uld", chunk_size=1024)
GROUP_ULD = GroupULD(SETTINGS)
GROUP_HYBRID = GroupULD(LossConfig(cross_vocab="hybrid"))


class _Traj:
    def __init__(self, tokens):
        self.tokens = list(tokens)


def _alignment(groups):
    g = np.asarray(groups, dtype=np.int64)
    return Alignment(g[:, 0], g[:, 1], g[:, 2], g[:, 3], g[:, 4], g[:, 5].astype(bool))


def _reply(alignment, teacher_ids, teacher_logp_TW):
    """A reply scoring every teacher token but the first with its whole vocabulary."""
    w = teacher_logp_TW.shape[1]
    rows = teacher_logp_TW[:-1]  # position p predicts token p + 1
    order = np.argsort(-rows, axis=1, kind="stable")
    return {"groups": groups_of_alignment(alignment),
            "teacher_ids": np.asarray(teacher_ids, np.int32),
            "positions": np.arange(len(teacher_ids) - 1, dtype=np.int32),
            "ids": order.astype(np.int32),
            "logprobs": np.take_along_axis(rows, order, 1).astype(np.float32),
            "tail_logmass": np.full(len(teacher_ids) - 1, -np.inf, np.float32),
            "target_logprobs": np.take_along_axis(
                rows, np.asarray(teacher_ids[1:])[:, None], 1)[:, 0].astype(np.float32),
            "k": w}


def test_group_chunks_hold_whole_groups():
    first = torch.tensor([1, 0, 0, 1, 1, 0, 1])  # groups [0,3) [3,4) [4,6) [6,7)
    assert group_chunks(first, 1) == [(0, 3), (3, 4), (4, 6), (6, 7)]
    assert group_chunks(first, 4) == [(0, 4), (4, 7)]
    assert group_chunks(first, 100) == [(0, 7)]


def test_uld_closed_form_on_a_hand_made_group():
    # One group of two student positions over a vocabulary of 3, logits chosen by hand.
    logits = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 0.0]])
    sampled = torch.tensor([2, 0])  # the group's tokens after each position
    teacher = torch.tensor([[0.5, 0.2]])  # the teacher's merged top-2
    targets = TeacherTargets(sampled, group_first_P=torch.tensor([1, 0]),
                             group_exact_P=torch.tensor([0, 0]),
                             topk_ids_P_K=torch.zeros(2, 2, dtype=torch.long),
                             topk_logprobs_P_K=torch.cat([teacher, teacher]).log(),
                             tail_logmass_P=torch.tensor([0.3, 0.3]).log())
    loss, metrics = GROUP_ULD.loss(logits, lambda h: h, targets)
    p0 = np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()
    p1 = np.exp([1.0, 0.0, 0.0]) / np.exp([1.0, 0.0, 0.0]).sum()
    merged = np.sort(p0 * p1[0])[::-1]  # observed: row 0 times P(token at 1)
    # The top-2 against the teacher's, and the student's third entry (its mass outside
    # its top 2) against the teacher's tail of 0.3.
    expected = abs(merged[0] - 0.5) + abs(merged[1] - 0.2) + abs(merged[2] - 0.3)
    assert abs(float(loss) - expected / 2) < 1e-6  # over the step's two positions
    assert abs(metrics["divergence_sum"] - expected) < 1e-6


def test_hybrid_exact_group_is_the_forward_kl_on_the_projected_topk():
    torch.manual_seed(0)
    logits = torch.randn(1, 5)
    ids = torch.tensor([[3, 1, 0]])
    lps = torch.tensor([[-0.5, -1.5, float("-inf")]])  # the third has no student twin
    targets = TeacherTargets(torch.tensor([3]), group_first_P=torch.tensor([1]),
                             group_exact_P=torch.tensor([1]), topk_ids_P_K=ids,
                             topk_logprobs_P_K=lps, tail_logmass_P=torch.tensor([-2.0]))
    loss, _ = GROUP_HYBRID.loss(logits, lambda h: h, targets)
    torch.testing.assert_close(loss, exact_forward_kl_P(logits, ids, lps)[0])
    # Closed form: both sides renormalised over ids 3 and 1.
    s = torch.log_softmax(logits[0], -1)[[3, 1]]
    s, t = s - s.logsumexp(0), torch.tensor([-0.5, -1.5]) - torch.tensor([-0.5, -1.5]).logsumexp(0)
    torch.testing.assert_close(loss, (t.exp() * (t - s)).sum())


def _random_case(seed):
    """Student tokens 0..8 and teacher tokens 0..6 over groups of several shapes; the
    teacher scores with its whole vocabulary (k = W), so ULD from the top-k is the full
    ULD of cross_vocab.uld_distance_G (checked against TRL)."""
    rng = np.random.default_rng(seed)
    a = _alignment([[0, 1, 0, 1, MODEL, 1], [1, 4, 1, 3, MODEL, 1], [4, 5, 3, 4, MODEL, 1],
                    [5, 7, 4, 5, MODEL, 1], [7, 9, 5, 7, MODEL, 1]])
    v, w = 6, 9
    s_tokens = rng.integers(0, v, 9)
    t_tokens = rng.integers(0, w, 7)
    t_logits = rng.normal(size=(7, w))
    t_logp = t_logits - np.log(np.exp(t_logits).sum(1, keepdims=True))
    return a, s_tokens, t_tokens, t_logp, v, w


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_uld_from_a_reply_is_the_full_uld_of_the_merged_groups(seed):
    a, s_tokens, t_tokens, t_logp, v, w = _random_case(seed)
    reply = _reply(a, t_tokens, t_logp)
    positions, arrays = student_targets(_Traj(s_tokens), np.arange(8), reply, "uld")
    np.testing.assert_array_equal(positions, np.arange(8))  # groups 1..4 (0 has no position)
    torch.manual_seed(seed)
    logits = torch.randn(8, v, dtype=torch.float64, requires_grad=True)
    sampled = torch.as_tensor(s_tokens[1:])
    targets = TeacherTargets.from_arrays(arrays, sampled, kind="xvocab")
    loss, metrics = GROUP_ULD.loss(logits, lambda h: h, targets)
    # The same from the TRL-checked functions: both sides' full rows merged over each
    # group (observed), sorted L1 between them.
    s_starts, s_ends = torch.tensor([0, 3, 4, 6]), torch.tensor([3, 4, 6, 8])
    t_starts, t_ends = torch.tensor([0, 2, 3, 4]), torch.tensor([2, 3, 4, 6])
    student = merge_group_probs(torch.softmax(logits, -1), sampled, s_starts, s_ends)
    t_probs = torch.as_tensor(np.exp(t_logp[:-1]))  # rows of teacher tokens 1..6
    teacher = merge_group_probs(t_probs, torch.as_tensor(t_tokens[1:]), t_starts, t_ends)
    ref = uld_distance_G(student, teacher).sum()
    torch.testing.assert_close(loss * 8, ref.to(loss.dtype), rtol=2e-5, atol=2e-6)
    assert abs(metrics["divergence_sum"] - float(ref.detach())) < 1e-4
    # A chunk boundary inside a group changes nothing: chunk_size 1 and 2 cut none.
    grad = torch.autograd.grad(loss, logits)[0]
    for chunk in (1, 2, 3):
        small = GroupULD(LossConfig(cross_vocab="uld", chunk_size=chunk))
        other, _ = small.loss(logits, lambda h: h, targets)
        torch.testing.assert_close(other, loss)
        torch.testing.assert_close(torch.autograd.grad(other, logits)[0], grad)


def test_hybrid_targets_mark_exact_pairs_and_project_their_topk():
    a, s_tokens, t_tokens, t_logp, v, w = _random_case(3)
    # Student id i <-> teacher id i + 2 for i < 4 (teacher 0, 1, 6..8 have no twin).
    s_to_t = np.array([2, 3, 4, 5, -1, -1])
    t_to_s = np.full(w, -1)
    t_to_s[[2, 3, 4, 5]] = [0, 1, 2, 3]
    vmap = VocabMap("s", "t", s_to_t, t_to_s)
    s_tokens[4], t_tokens[3] = 1, 3  # group 2 (student 4, teacher 3): an exact pair
    s_tokens[1], t_tokens[1] = 0, 2  # group 1 has three tokens: never exact
    reply = _reply(a, t_tokens, t_logp)
    positions, arrays = student_targets(_Traj(s_tokens), np.arange(8), reply, "hybrid", vmap)
    np.testing.assert_array_equal(arrays["group_exact"], [0, 0, 0, 1, 0, 0, 0, 0])
    ids, lps = arrays["ids"][3], arrays["logprobs"][3]
    row = t_logp[2]  # the teacher position predicting teacher token 3
    for sid, lp, tid in zip(ids, lps, reply["ids"][2], strict=True):
        if t_to_s[tid] < 0:
            assert lp == -np.inf
        else:
            assert sid == t_to_s[tid] and abs(lp - row[tid]) < 1e-6
    # The exact group's loss is the forward KL; the others are ULD as without the map.
    torch.manual_seed(3)
    logits = torch.randn(8, v, dtype=torch.float64)
    sampled = torch.as_tensor(s_tokens[1:])
    hybrid = TeacherTargets.from_arrays(arrays, sampled, kind="xvocab")
    h_loss, _ = GROUP_HYBRID.loss(logits, lambda h: h, hybrid)
    _, uld_arrays = student_targets(_Traj(s_tokens), np.arange(8), reply, "uld")
    uld = TeacherTargets.from_arrays(uld_arrays, sampled, kind="xvocab")
    one = torch.tensor([0, 0, 0, 1, 0, 0, 0, 0])
    u_loss_no3, _ = GROUP_ULD.loss(logits[one == 0], lambda h: h, TeacherTargets(
        sampled[one == 0], group_first_P=uld.group_first_P[one == 0],
        group_exact_P=uld.group_exact_P[one == 0], topk_ids_P_K=uld.topk_ids_P_K[one == 0],
        topk_logprobs_P_K=uld.topk_logprobs_P_K[one == 0],
        tail_logmass_P=uld.tail_logmass_P[one == 0]))
    kl = exact_forward_kl_P(logits[3:4], torch.as_tensor(ids[None]).long(),
                            torch.as_tensor(lps[None]))[0]
    torch.testing.assert_close(h_loss * 8, u_loss_no3 * 7 + kl.to(h_loss.dtype),
                               rtol=1e-5, atol=1e-6)


def test_hybrid_needs_the_map_and_the_table_refuses_what_cannot_work():
    a, s_tokens, t_tokens, t_logp, _, _ = _random_case(0)
    with pytest.raises(ConfigError, match="vocabulary map"):
        student_targets(_Traj(s_tokens), np.arange(8), _reply(a, t_tokens, t_logp), "hybrid")
    uld, hybrid = LossConfig(cross_vocab="uld"), LossConfig(cross_vocab="hybrid")
    assert objective_for_kind(uld, "xvocab") == GroupULD(uld)
    assert objective_for_kind(hybrid, "xvocab") == GroupULD(hybrid)
    assert objective_for_kind(hybrid, "xvocab").name == GROUP_HYBRID.name
    # What cannot work is the recipe's rule, refused when the recipe loads (the table
    # trusts it): uld trains on the teacher's top-k with the full estimator.
    from miniverl.common.recipe import Recipe

    with pytest.raises((ConfigError, ValueError), match="estimator: full"):
        Recipe.model_validate(_recipe({"cross_vocab": "uld", "estimator": "sampled_token",
                                       "divergence": "reverse_kl"}))


def _recipe(loss, tokenizer="other"):
    return {"run": {"name": "t", "mode": "opd"}, "student": {"model": {"toy": {}}},
            "teacher": {"model": {"toy": {}}, "tokenizer": tokenizer}, "loss": loss}


FULL = {"cross_vocab": "hybrid"}  # estimator: full, divergence: forward_kl (the defaults)


def test_recipe_cross_vocab_is_hashed_only_when_set_and_picks_the_objective():
    from miniverl.common.recipe import Recipe, recipe_digest

    sampled = {"estimator": "sampled_token", "divergence": "reverse_kl"}
    unset = recipe_digest(Recipe.model_validate(_recipe(sampled)))
    assert recipe_digest(Recipe.model_validate(_recipe({**sampled, "cross_vocab":
                                                        "sampled_token"}))) != unset
    for value, objective in (("uld", GROUP_ULD), ("hybrid", GROUP_HYBRID)):
        recipe = Recipe.model_validate(_recipe({"cross_vocab": value}))
        assert objective_for_kind(recipe.loss, "xvocab").name == objective.name


@pytest.mark.parametrize(("loss", "tokenizer", "words"), [
    (FULL, "same", "set teacher.tokenizer: other or drop loss.cross_vocab"),
    ({**FULL, "estimator": "sampled_token", "divergence": "reverse_kl"}, "other",
     "set estimator: full and divergence: forward_kl"),
    ({"cross_vocab": "uld", "divergence": "jsd"}, "other", "divergence: forward_kl"),
    ({**FULL, "aggregation": "sequence"}, "other", "drop loss.aggregation"),
    ({"cross_vocab": "sampled_token"}, "other", "estimator: sampled_token"),
])
def test_recipe_cross_vocab_combinations_that_cannot_work_are_refused(loss, tokenizer, words):
    from miniverl.common.recipe import Recipe

    with pytest.raises((ConfigError, ValueError), match=words):
        Recipe.model_validate(_recipe(loss, tokenizer))


def _state(cross_vocab, path=None, link=None):
    from types import SimpleNamespace as NS

    model = NS(path=path, describe=lambda: path or "toy(hidden=64, layers=2, heads=4)")
    return NS(kind="xvocab", recipe=NS(loss=LossConfig(cross_vocab=cross_vocab),
                                       teacher=NS(model=model, tokenizer="other")),
              teacher=NS(link=link))


def test_hybrid_needs_the_teachers_tokenizer_directory_and_keeps_its_teacher():
    from types import SimpleNamespace as NS

    from miniverl.common.errors import TokenizerMismatch
    from miniverl.student.train.teacher.connect import require_xvocab, teacher_vocab_map

    assert teacher_vocab_map(_state("uld"), None) is None  # ULD needs no map
    with pytest.raises(ConfigError, match="give the teacher's model directory"):
        teacher_vocab_map(_state("hybrid"), None)
    vmap = VocabMap("s", "sha256:" + "a" * 64, np.zeros(1, np.int64), np.zeros(1, np.int64))
    hello = NS(tokenizer_fp="sha256:" + "b" * 64, teacher=NS(name="other"),
               kinds=NS(xvocab={"k_max": 8}))
    with pytest.raises(TokenizerMismatch, match="maps the vocabulary of tokenizer"):
        require_xvocab(_state("hybrid", link=NS(vocab_map=vmap)), NS(hello=hello))
    hello.tokenizer_fp = vmap.teacher_fingerprint
    require_xvocab(_state("hybrid", link=NS(vocab_map=vmap)), NS(hello=hello))
    # A route of several teachers: its own section's model.path and its own link's map
    # (the run has no teacher: section, and its link is the routed one).
    routed = _state("hybrid", link=NS())
    routed.recipe.teacher = None
    section = NS(model=NS(path=None, describe=lambda: "toy(hidden=64)"), tokenizer="other")
    with pytest.raises(ConfigError, match="its model.path, but that teacher's model is toy"):
        teacher_vocab_map(routed, None, section)
    hello.tokenizer_fp = "sha256:" + "c" * 64
    with pytest.raises(TokenizerMismatch, match="maps the vocabulary of tokenizer"):
        require_xvocab(routed, NS(hello=hello), section, NS(vocab_map=vmap))
    require_xvocab(routed, NS(hello=hello), NS(tokenizer=None), NS(vocab_map=vmap))  # same


def test_a_routes_vocabulary_map_is_read_from_its_own_section_and_named_in_its_event(tmp_path):
    from types import SimpleNamespace as NS

    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.common.toy import build_toy_tokenizer
    from miniverl.student.train.teacher.connect import teacher_vocab_map
    from tests.common.cross_tokenizer_kit import byte_fallback_tokenizer

    teacher_tok = byte_fallback_tokenizer()
    teacher_tok.save_pretrained(tmp_path / "nav")
    said = []
    state = NS(recipe=NS(loss=NS(cross_vocab="hybrid"), teacher=None),
               policy=NS(tokenizer=build_toy_tokenizer()),
               run=NS(event=lambda name, **fields: said.append((name, fields))))
    section = NS(model=NS(path=str(tmp_path / "nav")), tokenizer="other")
    hello = NS(tokenizer_fp=fingerprint_tokenizer(teacher_tok), teacher=NS(name="nav"))
    vmap = teacher_vocab_map(state, NS(hello=hello), section, "nav")
    assert vmap.teacher_fingerprint == hello.tokenizer_fp
    [(name, fields)] = said
    assert name == "vocab_map" and fields["route"] == "nav"
    assert fields["teacher"] == hello.tokenizer_fp and fields["mapped"] > 0


def test_hybrid_gradients_are_finite_with_unmapped_entries_and_an_empty_batch_backwards():
    torch.manual_seed(4)
    hidden = torch.randn(3, 4, requires_grad=True)
    head = torch.nn.Linear(4, 5)
    inf = float("-inf")
    targets = TeacherTargets(
        torch.tensor([3, 1, 2]), group_first_P=torch.tensor([1, 1, 0]),
        group_exact_P=torch.tensor([1, 0, 0]),
        topk_ids_P_K=torch.tensor([[3, 0, 0], [0, 0, 0], [0, 0, 0]]),
        topk_logprobs_P_K=torch.tensor([[-0.2, inf, inf], [-0.5, -1.0, -3.0], [0.0, 0.0, 0.0]]),
        tail_logmass_P=torch.tensor([-1.0, -1.2, inf]))
    loss, _ = GroupULD(LossConfig(cross_vocab="hybrid", chunk_size=1)).loss(hidden, head, targets)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(hidden.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters())
    empty = TeacherTargets(torch.zeros(0, dtype=torch.long))
    zero, metrics = GROUP_ULD.loss(torch.zeros(0, 4, requires_grad=True), head, empty)
    zero.backward()
    assert float(zero.detach()) == 0.0 and metrics["positions"] == 0.0
