"""Privileged-context views: the teacher scores the student's very tokens, shifted.

Users rely on two properties: every student prediction position maps to a teacher
position whose target is the same token id (on every environment), and anything that
breaks that alignment is refused with an error instead of being trained on.
"""

from __future__ import annotations

import numpy as np
import pytest
from qwen_kit import SKIP_REASON, qwen3_dir

pytest.importorskip("transformers")

from miniverl.common.errors import ProvenanceError, TokenizerMismatch  # noqa: E402
from miniverl.common.tokenizer_id import fingerprint_tokenizer  # noqa: E402
from miniverl.common.toy import TOY_CHAT_TEMPLATE, build_toy_tokenizer  # noqa: E402
from miniverl.common.trajectory import SpanType  # noqa: E402
from miniverl.student.environments import get_environment, make_tasks  # noqa: E402
from miniverl.student.rollout.oracle import oracle_trajectory  # noqa: E402
from miniverl.student.rollout.privileged import (  # noqa: E402
    PrivilegedViews,
    build_teacher_view,
    task_lookup,
)

ENVS = ("calculator", "jsonnav", "sqlite")


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


@pytest.fixture(scope="module")
def fp(tok):
    return fingerprint_tokenizer(tok)


def _view(tok, fp, env_name, task, traj):
    env = get_environment(env_name)
    return build_teacher_view(traj, tok, tokenizer_fp=fp, tools=env.tool_specs(),
                              privileged=env.privileged_context(task))


@pytest.mark.parametrize("env_name", ENVS)
@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_mapped_positions_target_the_same_ids(tok, fp, env_name, difficulty):
    # The property the loss relies on: teacher row i is the teacher's distribution over
    # the very token the student's position i predicts.
    for task in make_tasks(env_name, "train", 3, difficulty, 0):
        traj = oracle_trajectory(env_name, task, tok, fp)
        view = _view(tok, fp, env_name, task, traj)
        positions = np.array(traj.target_positions(), dtype=np.int32)
        mapped = view.map_positions(positions)
        student = np.asarray(traj.tokens)
        assert np.array_equal(view.tokens[mapped + 1], student[positions + 1])
        assert np.all(np.diff(mapped) > 0)  # reply rows stay in the student's order
        # The teacher really reads the privileged context, in its system segment only.
        privileged = get_environment(env_name).privileged_context(task)
        system = view.spans[0]
        assert privileged in tok.decode(view.tokens[system.start : system.end].tolist())
        assert len(view.tokens) > len(student)
        # Every later segment is the student's run of ids, shifted by one offset.
        shift = int(view.offsets[1])
        assert shift > 0 and np.all(view.offsets[1:] == shift)
        for s, t in zip(traj.spans[1:], view.spans[1:], strict=True):
            assert traj.tokens[s.start : s.end] == view.tokens[t.start : t.end].tolist()


def test_views_callable_maps_rollout_tasks_by_id(tok, fp):
    tasks = make_tasks("jsonnav", "train", 4, "easy", 0)
    views = PrivilegedViews(
        tok, tokenizer_fp=fp, env_name="jsonnav", env_params={},
        task_of=task_lookup("jsonnav", {}, "easy", 0, {"train": 4, "eval": 2}, known=tasks),
    )
    traj = oracle_trajectory("jsonnav", tasks[2], tok, fp)
    positions = np.array(traj.target_positions(), dtype=np.int32)
    tokens, mapped = views(traj, positions)
    assert np.array_equal(tokens[mapped + 1], np.asarray(traj.tokens)[positions + 1])
    # A task of another split is generated on demand.
    eval_task = make_tasks("jsonnav", "eval", 2, "easy", 0)[1]
    eval_traj = oracle_trajectory("jsonnav", eval_task, tok, fp)
    views(eval_traj, np.array(eval_traj.target_positions(), dtype=np.int32))
    unknown = eval_traj.model_copy(update={"task_id": "jsonnav-eval-nope"})
    with pytest.raises(ProvenanceError, match="not in the recipe's eval split"):
        views(unknown, np.array([len(unknown.tokens) - 2], dtype=np.int32))


def test_another_tokenizer_is_refused(tok, fp):
    task = make_tasks("calculator", "train", 1, "easy", 0)[0]
    traj = oracle_trajectory("calculator", task, tok, fp)
    with pytest.raises(TokenizerMismatch, match="tokenizer"):
        _view(tok, "sha256:" + "0" * 64, "calculator", task, traj)


def test_a_segment_whose_length_differs_is_refused(fp):
    # A template that prints the system message's length in the user block renders the
    # user segment differently once the system message grows.
    odd = build_toy_tokenizer()
    odd.chat_template = TOY_CHAT_TEMPLATE.replace(
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}",
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '[' + "
        "(sys | length | string) + ']<|im_end|>\\n' }}",
    )
    assert odd.chat_template != TOY_CHAT_TEMPLATE
    odd_fp = fingerprint_tokenizer(odd)
    task = make_tasks("calculator", "train", 1, "easy", 0)[0]
    traj = oracle_trajectory("calculator", task, odd, odd_fp)
    with pytest.raises(ProvenanceError, match=r"segment 1 \(user\) is \d+ tokens for the student"):
        _view(odd, odd_fp, "calculator", task, traj)


def test_a_target_id_that_differs_is_refused(tok, fp):
    # Stored messages that no longer re-render to the stored ids (same length, other
    # text) must never be aligned by length alone.
    task = make_tasks("sqlite", "train", 1, "easy", 0)[0]
    traj = oracle_trajectory("sqlite", task, tok, fp)
    messages = [dict(m) for m in traj.messages]
    tool = next(m for m in messages if m["role"] == "tool")
    tool["content"] = tool["content"][:-1] + ("X" if tool["content"][-1] != "X" else "Y")
    tampered = traj.model_copy(update={"messages": messages})
    with pytest.raises(ProvenanceError, match=r"segment \d+ \(tool_result\) differs at token"):
        _view(tok, fp, "sqlite", task, tampered)
    # And the map's own check: a view whose offsets are off by one is caught.
    view = _view(tok, fp, "sqlite", task, traj)
    view.offsets[1:] += 1
    with pytest.raises(ProvenanceError, match="not aligned"):
        view.map_positions(np.array(traj.target_positions(), dtype=np.int32))


def test_system_prompt_positions_cannot_be_mapped(tok, fp):
    task = make_tasks("calculator", "train", 1, "easy", 0)[0]
    traj = oracle_trajectory("calculator", task, tok, fp)
    view = _view(tok, fp, "calculator", task, traj)
    assert traj.spans[0].type == SpanType.SYSTEM
    with pytest.raises(ProvenanceError, match="system-prompt token"):
        view.map_positions(np.array([3], dtype=np.int32))
    with pytest.raises(ProvenanceError, match="predicts no token"):
        view.map_positions(np.array([len(traj.tokens) - 1], dtype=np.int32))


@pytest.fixture(scope="module")
def qwen():
    path = qwen3_dir()
    if path is None:
        pytest.skip(SKIP_REASON)
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    return tokenizer, fingerprint_tokenizer(tokenizer)


@pytest.mark.parametrize("env_name", ENVS)
@pytest.mark.slow
def test_alignment_holds_with_qwen3_chat_template(qwen, env_name):
    # The real template puts tool specs in the system block and re-renders history;
    # the alignment must hold there too, not only for the toy template.
    qwen, qfp = qwen
    task = make_tasks(env_name, "train", 1, "medium", 0)[0]
    traj = oracle_trajectory(env_name, task, qwen, qfp)
    view = _view(qwen, qfp, env_name, task, traj)
    positions = np.array(traj.target_positions(), dtype=np.int32)
    mapped = view.map_positions(positions)
    assert np.array_equal(view.tokens[mapped + 1], np.asarray(traj.tokens)[positions + 1])
