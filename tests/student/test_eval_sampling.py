"""Sampled evaluation (``eval.samples``) and the state-coverage figure.

A user reading "success at T=1" relies on it being the mean over N fixed draws per task
(and on the greedy figure beside it staying what it was); a user reading "unseen
states" relies on it counting exactly the turn-start prefixes no reference episode has.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from miniverl.common.recipe import Recipe  # noqa: E402
from miniverl.common.toy import build_toy_model, build_toy_tokenizer  # noqa: E402
from miniverl.common.trajectory import (  # noqa: E402
    Span,
    SpanType,
    Trajectory,
    VerifierResult,
    read_trajectories,
)
from miniverl.student.coverage import reference_source, state_coverage, turn_starts  # noqa: E402
from miniverl.student.eval import evaluate  # noqa: E402
from miniverl.student.eval_sampling import (  # noqa: E402
    SAMPLE_STRIDE,
    SAMPLED_SEED_BASE,
    sampled_summary,
)
from tests.toy_kit import FOUR_HEAD  # noqa: E402

torch.set_num_threads(1)
S, U, T, A, C = (SpanType.SYSTEM, SpanType.USER, SpanType.TOOL_RESULT,
                 SpanType.ASSISTANT_TEXT, SpanType.ASSISTANT_TOOL_CALL)


def episode(parts: list[tuple[SpanType, list[int]]], *, task: str = "t0", success: bool = False,
            difficulty: str = "easy") -> Trajectory:
    """A hand-made trajectory from ``(span type, token ids)`` parts."""
    tokens, spans = [], []
    for kind, ids in parts:
        spans.append(Span(type=kind, start=len(tokens), end=len(tokens) + len(ids)))
        tokens += ids
    return Trajectory(id=f"{task}/{len(tokens)}/{tokens[-1]}", tokens=tokens, spans=spans,
                      policy_version=0, tokenizer_fp="sha256:x", environment="calculator",
                      task_id=task, difficulty=difficulty,
                      verifier=VerifierResult(success=success, score=float(success)))


def test_mean_success_over_n_samples_per_task_and_pass_at_n():
    trajs = [episode([(S, [1]), (A, [2])], task=task, success=ok)
             for task, ok in [("a", True), ("a", False), ("a", True), ("a", False),
                              ("b", False), ("b", False), ("b", True), ("b", False)]]
    got = sampled_summary(trajs, samples=4, temperature=1.0)
    assert got["success"] == pytest.approx(3 / 8)  # (2/4 + 1/4) / 2
    assert got["any_success"] == 1.0 and got["n"] == 2 and got["episodes"] == 8
    assert got["by_difficulty"] == {"easy": {"success": 3 / 8, "n": 2}}


def test_turn_start_states_no_reference_episode_contains():
    # Two turns each: the prompt [1, 2], then after a tool call and its result.
    ref = episode([(S, [1]), (U, [2]), (C, [3, 4]), (T, [5]), (A, [6])])
    assert turn_starts(ref) == [2, 5]
    same = episode([(S, [1]), (U, [2]), (C, [3, 4]), (T, [5]), (A, [7, 8])])
    strayed = episode([(S, [1]), (U, [2]), (C, [3, 9]), (T, [5]), (A, [6])])
    other_task = episode([(S, [1]), (U, [7]), (A, [6])])
    got = state_coverage([same, strayed, other_task], [ref])
    # same: both states seen; strayed: its prompt seen, its second state not; other: not.
    assert got == {"states": 5, "unseen": 2, "unseen_share": 0.4, "reference_episodes": 1}
    assert state_coverage([], [ref])["unseen_share"] is None
    # A prefix of a reference that does not end at one of its turn starts is no state of it.
    mid = episode([(S, [1]), (U, [2, 3]), (A, [4])])
    assert state_coverage([mid], [ref])["unseen"] == 1


def _recipe(mode: str = "sft", **eval_cfg) -> Recipe:
    data = {
        "run": {"name": "t", "mode": mode},
        "student": {"model": {"toy": FOUR_HEAD}, "lora": None},
        "environment": {"name": "calculator", "eval_tasks": 2},
        "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 6, "max_total_tokens": 512},
        "eval": eval_cfg,
    }
    if mode != "sft":
        data["teacher"] = {"model": {"toy": FOUR_HEAD}}
    return Recipe.model_validate(data)


def test_sampled_eval_beside_an_unchanged_greedy_eval(tmp_path):
    tok = build_toy_tokenizer()
    model = build_toy_model(FOUR_HEAD, tok)
    plain = evaluate(model, tok, _recipe(), policy_version=1)
    summary = evaluate(model, tok, _recipe(samples=3, temperature=0.7), policy_version=1,
                       out_dir=tmp_path)
    assert [t.tokens for t in summary.trajectories] == [t.tokens for t in plain.trajectories]
    assert plain.sampled is None and "sampled" not in plain.to_dict()
    sampled = summary.sampled_trajectories
    assert len(sampled) == 6 and summary.sampled["samples"] == 3
    assert summary.sampled["temperature"] == 0.7 and summary.sampled["n"] == 2
    assert [t.seed for t in sampled] == [SAMPLED_SEED_BASE + j * SAMPLE_STRIDE + i
                                         for j in range(3) for i in range(2)]
    assert summary.sampled["success"] == sum(t.verifier.success for t in sampled) / 6
    data = json.loads((tmp_path / "eval-v1.summary.json").read_text())
    assert data["sampled"]["episodes"] == 6
    kept = read_trajectories(tmp_path / "eval-v1.sampled.trajectories.jsonl")
    assert [t.tokens for t in kept] == [t.tokens for t in sampled]
    # Unset temperature samples at 1.0.
    assert evaluate(model, tok, _recipe(samples=1), policy_version=1).sampled["temperature"] == 1.0


def test_coverage_is_reported_where_the_fixed_set_is_a_function_of_the_task():
    tok = build_toy_tokenizer()
    model = build_toy_model(FOUR_HEAD, tok)
    summary = evaluate(model, tok, _recipe(samples=1), policy_version=0)
    cov = summary.coverage
    assert cov["source"] == "oracle" and cov["reference_episodes"] == 2
    # The prompt is the oracle's own first state; what an untrained toy says next is not.
    assert cov["states"] >= 2 and cov["unseen"] == cov["states"] - 2
    assert summary.sampled["coverage"]["states"] >= 2
    assert evaluate(model, tok, _recipe("opd"), policy_version=0).coverage is None
    assert reference_source(_recipe("opd")) is None


def test_a_seqkd_runs_coverage_reference_is_the_teachers_own_play_kept_once(tmp_path,
                                                                             monkeypatch):
    import miniverl.student.coverage as coverage_module

    recipe = _recipe()
    recipe = recipe.model_copy(update={
        "teacher": _recipe("opd").teacher,
        "train": recipe.train.model_copy(update={"fixed_set": "teacher"}),
    })
    tok = build_toy_tokenizer()
    model = build_toy_model(FOUR_HEAD, tok)
    played = []
    real = coverage_module.play_as_teacher

    def playing(recipe, tasks, *args, **kw):
        played.append(tasks)
        return real(recipe, tasks, *args, **kw)

    monkeypatch.setattr(coverage_module, "play_as_teacher", playing)
    first = evaluate(model, tok, recipe, policy_version=0, out_dir=tmp_path)
    kept = read_trajectories(tmp_path / "eval.teacher.trajectories.jsonl")
    assert first.coverage["source"] == "teacher" and len(kept) == 2 == len(played[0])
    assert {t.source for t in kept} == {"teacher"}
    # Each task's prompt is the first state of the teacher's episode of it too.
    assert first.coverage["states"] - first.coverage["unseen"] >= 2
    again = evaluate(model, tok, recipe, policy_version=1, out_dir=tmp_path)
    assert len(played) == 1 and again.coverage == first.coverage
