"""Chat rendering into typed spans: how an episode's token ids get their provenance.

:class:`EpisodeBuilder` grows one episode's token sequence turn by turn:

- the opening context (system block with the tool specs, then the user prompt, then
  the ``<|im_start|>assistant\\n`` header) comes from the tokenizer's chat template;
- a model turn is appended *verbatim* (the ids the model sampled, or for oracle traces
  the template's own rendering of the assistant message) and typed
  ``assistant_text`` / ``assistant_tool_call`` / ``assistant_final``;
- tool results are appended as ``tool`` messages: the conversation is re-rendered by
  the template and only the text after the previous assistant turn's ``<|im_end|>``
  is tokenized, so the context span owns the ``\\n`` after it, the tool response and
  the next ``<|im_start|>assistant\\n`` header.

Tool calls are parsed in the Hermes format
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``). This module runs no
model and no environment; it needs only a Hugging Face tokenizer with a chat template.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from miniverl.common.errors import ProvenanceError
from miniverl.common.trajectory import Span, SpanType

IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_CALL_RE = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@dataclass
class ParsedCall:
    """One ``<tool_call>`` block: a name and arguments, or the reason it did not parse."""

    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None

    def key(self) -> str:
        """Canonical text of the call, used to detect repeated calls."""
        return json.dumps([self.name, self.arguments], sort_keys=True, ensure_ascii=False)


@dataclass
class ParsedTurn:
    """What one assistant turn said."""

    text: str  # decoded with special tokens, stop token excluded
    content: str  # text before the first <tool_call>, stripped
    calls: list[ParsedCall] = field(default_factory=list)
    complete: bool = True  # ended with a stop token (not cut by a length limit)

    @property
    def is_final(self) -> bool:
        return self.complete and not self.calls

    @property
    def answer(self) -> str:
        """The final answer text: content without any ``<think>`` block."""
        return self.content.split("</think>")[-1].strip()


def parse_tool_calls(text: str) -> tuple[str, list[ParsedCall]]:
    """Split assistant text into (content before the first call, parsed calls).

    A block that is not closed, not JSON, or lacks a string ``name`` / object
    ``arguments`` becomes a :class:`ParsedCall` with ``error`` set; the rollout counts it
    and answers it with an error tool result.
    """
    first = text.find(TOOL_CALL_START)
    if first < 0:
        return text.strip(), []
    return text[:first].strip(), [_parse_call(match.group(1), match.group(2))
                                  for match in _CALL_RE.finditer(text, first)]


def _parse_call(body: str, closer: str) -> ParsedCall:
    """One ``<tool_call>`` block's ``body``; ``closer`` is empty when it was not closed."""
    if not closer:
        return ParsedCall(None, None, "the <tool_call> block is not closed")
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return ParsedCall(None, None, f"the tool call is not valid JSON ({exc.msg})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ParsedCall(None, None, 'the tool call needs a string "name"')
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = None
    if not isinstance(args, dict):
        return ParsedCall(obj["name"], None, '"arguments" must be a JSON object')
    return ParsedCall(obj["name"], args)


def parse_error_result(call: ParsedCall) -> str:
    """The tool result the model reads after a malformed call (a learning signal)."""
    return (
        f"error: {call.error}; call a tool as "
        '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
    )


def stop_token_ids(tokenizer) -> list[int]:
    """Ids that end an assistant turn: ``<|im_end|>`` (and ``<|endoftext|>`` if present)."""
    ids = []
    for token in (IM_END, ENDOFTEXT):
        idx = tokenizer.convert_tokens_to_ids(token)
        if isinstance(idx, int) and idx != tokenizer.unk_token_id and idx >= 0:
            ids.append(idx)
    if not ids:
        raise ProvenanceError(
            f"tokenizer has no {IM_END} token; miniverl needs a ChatML (Qwen-style) tokenizer"
        )
    return ids


def _call_message(content: str, calls: list[ParsedCall]) -> dict[str, Any]:
    """The assistant message of a turn with well-formed tool ``calls``."""
    return {"role": "assistant", "content": content, "tool_calls": [
        {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls]}


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def _nth_end(text: str, marker: str, n: int) -> int:
    """Index just after the ``n``-th occurrence (1-based) of ``marker``, or -1."""
    pos = -1
    for _ in range(n):
        pos = text.find(marker, pos + 1)
        if pos < 0:
            return -1
    return pos + len(marker)


class EpisodeBuilder:
    """Token ids, typed spans and messages of one episode, grown turn by turn."""

    def __init__(self, tokenizer, system: str, user: str, tools: list[dict] | None):
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.stop_ids = set(stop_token_ids(tokenizer))
        self.tool_call_id = tokenizer.convert_tokens_to_ids(TOOL_CALL_START)
        self.messages: list[dict[str, Any]] = []
        if system:
            self.messages.append({"role": "system", "content": system})
        self.messages.append({"role": "user", "content": user})
        self.tokens: list[int] = []
        self.spans: list[Span] = []
        # How often the template re-rendered an earlier part of the conversation
        # differently (e.g. Qwen3 drops an empty <think> block from older turns).
        # The stored ids never change; only new context is appended.
        self.rerender_mismatches = 0
        self._rendered: dict[tuple[bool, str], str] = {}

        full = self.render(self.messages, add_generation_prompt=True)
        head = self._render_system_only() if system else ""
        if head and full.startswith(head) and head.endswith("\n"):
            self._append(SpanType.SYSTEM, _encode(tokenizer, head))
            self._append(SpanType.USER, _encode(tokenizer, full[len(head) :]))
        else:
            self._append(SpanType.USER, _encode(tokenizer, full))

    # -- rendering -----------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        # A turn re-renders what the last one rendered (an oracle trace asks for the
        # same conversation three times of its eight): the template is a pure function
        # of its input, so the text is kept under the exact input that made it.
        key = (add_generation_prompt, json.dumps(messages, sort_keys=True, default=str))
        text = self._rendered.get(key)
        if text is None:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=self.tools,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
            self._rendered = {**dict(list(self._rendered.items())[-3:]), key: text}
        return text

    def _render_system_only(self) -> str:
        # Some templates refuse a conversation without a user turn; then the whole
        # opening context is one user span, which is still context.
        try:
            return self.render(self.messages[:1], add_generation_prompt=False)
        except Exception:
            return ""

    def _append(self, span_type: SpanType, ids: list[int]) -> None:
        if not ids:
            return
        start = len(self.tokens)
        self.tokens.extend(ids)
        self.spans.append(Span(type=span_type, start=start, end=len(self.tokens)))

    # -- model turns ---------------------------------------------------------------

    def assistant_ids(self, content: str, tool_calls: list[dict[str, Any]] | None = None) -> list[int]:
        """The template's rendering of an assistant message, as a model turn's ids.

        Used for oracle traces: the text after the ``<|im_start|>assistant\\n`` header up
        to and including the ``<|im_end|>`` that closes the message.
        """
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in tool_calls
            ]
        prompt = self.render(self.messages, add_generation_prompt=True)
        full = self.render([*self.messages, message], add_generation_prompt=False)
        if not full.startswith(prompt):
            raise ProvenanceError(
                "the chat template renders an assistant message that does not extend the "
                "generation prompt; miniverl needs a template with the prefix property"
            )
        rest = full[len(prompt) :]
        end = rest.find(IM_END)
        if end < 0:
            raise ProvenanceError(f"the chat template does not close assistant turns with {IM_END}")
        return _encode(self.tokenizer, rest[: end + len(IM_END)])

    def add_model_turn(self, ids: list[int]) -> ParsedTurn:
        """Append sampled ids verbatim as model spans; parse what they say."""
        ids = [int(i) for i in ids]
        complete = bool(ids) and ids[-1] in self.stop_ids
        body = ids[:-1] if complete else ids
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        content, calls = parse_tool_calls(text)
        if calls and self.tool_call_id in ids:
            cut = ids.index(self.tool_call_id)
            self._append(SpanType.ASSISTANT_TEXT, ids[:cut])
            self._append(SpanType.ASSISTANT_TOOL_CALL, ids[cut:])
        elif calls:
            # "<tool_call>" spelled out in ordinary tokens: still a call turn.
            self._append(SpanType.ASSISTANT_TOOL_CALL, ids)
        elif complete:
            self._append(SpanType.ASSISTANT_FINAL, ids)
        else:
            # Cut by a length limit without a call: model text, but not a final answer.
            self._append(SpanType.ASSISTANT_TEXT, ids)
        # The template renders the well-formed calls; a turn without any is its text.
        good = [c for c in calls if c.error is None]
        self.messages.append(_call_message(content, good) if good
                             else {"role": "assistant", "content": text})
        return ParsedTurn(text=text, content=content, calls=calls, complete=complete)

    # -- context turns -------------------------------------------------------------

    def add_tool_results(self, results: list[str], max_tokens: int | None = None) -> bool:
        """Append ``tool`` messages plus the next assistant header as one context span.

        Returns False (and changes nothing) if the episode would reach ``max_tokens``.
        """
        before = self.render(self.messages, add_generation_prompt=False)
        n_ends = before.count(IM_END)
        tool_msgs = [{"role": "tool", "content": r} for r in results]
        after = self.render([*self.messages, *tool_msgs], add_generation_prompt=True)
        cut_before = _nth_end(before, IM_END, n_ends)
        cut_after = _nth_end(after, IM_END, n_ends)
        if cut_before < 0 or cut_after < 0:
            raise ProvenanceError(f"the chat template does not close assistant turns with {IM_END}")
        if after[:cut_after] != before[:cut_before]:
            self.rerender_mismatches += 1
        ids = _encode(self.tokenizer, after[cut_after:])
        if max_tokens is not None and len(self.tokens) + len(ids) >= max_tokens:
            return False
        self.messages.extend(tool_msgs)
        self._append(SpanType.TOOL_RESULT, ids)
        return True
