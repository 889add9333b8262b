"""Oracle trajectories: every environment, split and difficulty verifies, with exact spans."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from miniverl.common.toy import build_toy_tokenizer  # noqa: E402
from miniverl.common.trajectory import SpanType  # noqa: E402
from miniverl.student.environments import (  # noqa: E402
    DIFFICULTIES,
    SPLITS,
    ToolCall,
    get_environment,
    list_environments,
    make_tasks,
)
from miniverl.student.rollout.oracle import oracle_trajectory  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


# SFT and the toy teacher learn from these traces: a wrong trace would teach wrong answers.
@pytest.mark.parametrize("env_name", ["calculator", "jsonnav", "sqlite"])
def test_oracle_traces_verify_on_every_split_and_difficulty(tok, env_name):
    assert env_name in list_environments()
    for split in SPLITS:
        for difficulty in DIFFICULTIES:
            for task in make_tasks(env_name, split, 4, difficulty, split_seed=0):
                traj = oracle_trajectory(env_name, task, tok, "fp")
                assert traj.verifier.success and traj.source == "oracle"
                assert traj.spans[-1].type == SpanType.ASSISTANT_FINAL
                assert (traj.split, traj.difficulty) == (split, difficulty)


def test_oracle_spans_match_the_template_rendering(tok):
    task = make_tasks("sqlite", "train", 1, "hard", split_seed=0)[0]
    traj = oracle_trajectory("sqlite", task, tok, "fp")
    env = get_environment("sqlite")
    calls = [a for a in env.oracle_actions(task) if isinstance(a, ToolCall)]
    types = [s.type for s in traj.spans]
    assert types[:2] == [SpanType.SYSTEM, SpanType.USER]
    assert types.count(SpanType.ASSISTANT_TOOL_CALL) == len(calls)
    assert types.count(SpanType.TOOL_RESULT) == len(calls)
    assert traj.tool_calls.total == len(calls)
    rendered = tok.apply_chat_template(traj.messages, tools=env.tool_specs(), tokenize=False)
    assert tok.decode(traj.tokens) + "\n" == rendered
    for ids in traj.model_ids():
        assert tok.convert_ids_to_tokens(ids[-1]) == "<|im_end|>"


def test_a_conversation_rendered_again_comes_from_the_first_render(tok, monkeypatch):
    # A one-call calculator trace asks for 8 renders and 3 of them repeat one: the
    # template runs 5 times, and the trace is the one rendering everything anew gives.
    task = make_tasks("calculator", "train", 1, "easy", split_seed=0)[0]
    calls = []
    real = type(tok).apply_chat_template

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(tok), "apply_chat_template", counted)
    traj = oracle_trajectory("calculator", task, tok, "fp")
    assert len(calls) == 5 and traj.tool_calls.total == 1
    env = get_environment("calculator")
    rendered = real(tok, traj.messages, tools=env.tool_specs(), tokenize=False)
    assert tok.decode(traj.tokens) + "\n" == rendered


@pytest.mark.parametrize("env_name", ["calculator", "jsonnav", "sqlite"])
def test_a_privileged_oracle_trace_is_the_view_the_teacher_scores(tok, env_name):
    # rollout.view: privileged_context prepares a privileged teacher on these traces; they
    # must be token for token what the teacher is sent when it scores (rollout/privileged).
    from miniverl.student.environments import get_environment
    from miniverl.student.rollout.privileged import build_teacher_view

    env = get_environment(env_name)
    for task in make_tasks(env_name, "train", 4, "easy", split_seed=0):
        plain = oracle_trajectory(env_name, task, tok, "fp")
        priv = oracle_trajectory(env_name, task, tok, "fp", privileged=True)
        assert priv.verifier.success
        view = build_teacher_view(plain, tok, tokenizer_fp="fp", tools=env.tool_specs(),
                                  privileged=env.privileged_context(task))
        assert priv.tokens == view.tokens.tolist()
        assert env.privileged_context(task) in priv.messages[0]["content"]
        cut = plain.spans[0].end
        assert priv.tokens[priv.spans[0].end:] == plain.tokens[cut:]


# docs/training.md ("The shared system block") and the toy recipes' comments give these
# sizes: the share of an episode the shared-prefix forward runs once per batch.
@pytest.mark.parametrize(("units", "system_tokens", "episode_tokens"),
                         [(False, 136, range(260, 281)), (True, 256, range(380, 401))])
def test_the_toy_calculator_system_block_size(tok, units, system_tokens, episode_tokens):
    for task in make_tasks("calculator", "train", 8, "easy", split_seed=0):
        traj = oracle_trajectory("calculator", task, tok, "fp", {"units": units})
        assert traj.spans[0].type == SpanType.SYSTEM
        assert traj.spans[0].end - traj.spans[0].start == system_tokens
        assert len(traj.tokens) in episode_tokens
