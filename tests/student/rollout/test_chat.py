"""Chat rendering into spans: headers belong to context, turns are stored verbatim."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from miniverl.common.toy import build_toy_tokenizer  # noqa: E402
from miniverl.common.trajectory import SpanType, Trajectory  # noqa: E402
from miniverl.student.rollout.chat import EpisodeBuilder, parse_tool_calls  # noqa: E402
from tests.toy_kit import CALCULATOR_TOOLS  # noqa: E402

TOOLS = CALCULATOR_TOOLS
HEADER = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


def _text(tok, b: EpisodeBuilder, span) -> str:
    return tok.decode(b.tokens[span.start : span.end])


def test_parse_valid_and_malformed_calls():
    content, calls = parse_tool_calls(
        'Let me see.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n'
        "</tool_call>\n<tool_call>{not json}</tool_call>"
    )
    assert content == "Let me see."
    assert (calls[0].name, calls[0].arguments, calls[0].error) == (
        "calculator", {"expression": "1+1"}, None
    )
    assert "not valid JSON" in calls[1].error
    assert parse_tool_calls("42")[1] == []
    assert "not closed" in parse_tool_calls('<tool_call>{"name": "x"')[1][0].error
    assert "name" in parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')[1][0].error
    stringly = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert stringly[1][0].arguments == {"a": 1}
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": [1]}</tool_call>')[1][0].error


def test_opening_context_owns_the_assistant_header(tok):
    b = EpisodeBuilder(tok, "Be brief.", "What is 2+3?", TOOLS)
    assert [s.type for s in b.spans] == [SpanType.SYSTEM, SpanType.USER]
    assert _text(tok, b, b.spans[0]).startswith("<|im_start|>system\nBe brief.")
    assert _text(tok, b, b.spans[1]).endswith("What is 2+3?<|im_end|>\n" + HEADER)
    assert tok.decode(b.tokens) == b.render(b.messages, add_generation_prompt=True)


def test_tool_episode_spans_and_verbatim_turns(tok):
    b = EpisodeBuilder(tok, "Be brief.", "What is 2+3?", TOOLS)
    call_ids = b.assistant_ids("", [{"name": "calculator", "arguments": {"expression": "2+3"}}])
    assert tok.convert_ids_to_tokens(call_ids[0]) == "<tool_call>"
    assert tok.convert_ids_to_tokens(call_ids[-1]) == "<|im_end|>"
    turn = b.add_model_turn(call_ids)
    assert turn.calls[0].arguments == {"expression": "2+3"} and not turn.is_final
    assert b.add_tool_results(["5"])
    final_ids = b.assistant_ids("5")
    turn = b.add_model_turn(final_ids)
    assert turn.is_final and turn.answer == "5"
    traj = Trajectory(
        id="t", tokens=b.tokens, spans=b.spans, policy_version=0, tokenizer_fp="fp",
        environment="calculator", task_id="x",
    )
    types = [s.type for s in traj.spans]
    assert types == [
        SpanType.SYSTEM, SpanType.USER, SpanType.ASSISTANT_TOOL_CALL,
        SpanType.TOOL_RESULT, SpanType.ASSISTANT_FINAL,
    ]
    assert traj.model_ids() == [call_ids, final_ids]
    tool_span = traj.spans[3]
    # The "\n" after the sampled <|im_end|> and the next header are context.
    assert _text(tok, b, tool_span) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" + HEADER
    )
    assert not traj.loss_mask()[tool_span.start : tool_span.end].any()
    # For a template with the prefix property, the episode is exactly the template's text.
    assert tok.decode(b.tokens) + "\n" == b.render(b.messages, add_generation_prompt=False)
    assert b.rerender_mismatches == 0


def test_text_before_a_call_is_assistant_text(tok):
    b = EpisodeBuilder(tok, "", "Hi", TOOLS)
    ids = tok.encode(
        'I will compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}'
        "\n</tool_call><|im_end|>",
        add_special_tokens=False,
    )
    b.add_model_turn(ids)
    assert [s.type for s in b.spans] == [
        SpanType.USER, SpanType.ASSISTANT_TEXT, SpanType.ASSISTANT_TOOL_CALL
    ]
    assert _text(tok, b, b.spans[1]) == "I will compute.\n"
    assert b.messages[-1]["content"] == "I will compute."


def test_a_turn_cut_by_length_is_text_not_final(tok):
    b = EpisodeBuilder(tok, "", "Hi", TOOLS)
    turn = b.add_model_turn(tok.encode("12", add_special_tokens=False))
    assert not turn.complete and not turn.is_final
    assert b.spans[-1].type == SpanType.ASSISTANT_TEXT


def test_tool_results_refused_past_the_token_budget(tok):
    b = EpisodeBuilder(tok, "", "Hi", TOOLS)
    b.add_model_turn(b.assistant_ids("", [{"name": "calculator", "arguments": {"expression": "1"}}]))
    n_tokens, n_msgs = len(b.tokens), len(b.messages)
    assert not b.add_tool_results(["x" * 50], max_tokens=n_tokens + 10)
    assert (len(b.tokens), len(b.messages)) == (n_tokens, n_msgs)


def test_several_calls_in_one_turn_share_one_tool_block(tok):
    b = EpisodeBuilder(tok, "", "Hi", TOOLS)
    calls = [{"name": "calculator", "arguments": {"expression": e}} for e in ("1", "2")]
    turn = b.add_model_turn(b.assistant_ids("", calls))
    assert [c.arguments["expression"] for c in turn.calls] == ["1", "2"]
    b.add_tool_results(["1", "2"])
    assert _text(tok, b, b.spans[-1]).count("<tool_response>") == 2
    assert _text(tok, b, b.spans[-1]).count("<|im_start|>user") == 1


def test_a_call_spelled_in_ordinary_tokens_is_still_a_call_turn(tok):
    b = EpisodeBuilder(tok, "", "Hi", TOOLS)
    ids = tok.encode("<tool_call", add_special_tokens=False) + tok.encode(
        '>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call><|im_end|>',
        add_special_tokens=False,
    )
    assert tok.convert_tokens_to_ids("<tool_call>") not in ids
    turn = b.add_model_turn(ids)
    assert turn.calls[0].name == "calculator" and not turn.is_final
    assert b.spans[-1].type == SpanType.ASSISTANT_TOOL_CALL
    assert b.tokens[b.spans[-1].start :] == ids
