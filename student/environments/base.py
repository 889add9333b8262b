"""The environment contract: tasks, oracle actions and a small base class with the guards.

An environment generates tasks deterministically from a seed, runs tool calls for one
episode at a time (``reset`` then ``step``) and verifies final answers. Two promises
hold for every environment built on :class:`Environment`:

- ``step`` never raises. An unknown tool, a missing or mistyped argument, a string
  argument over ``max_argument_chars`` (10,000), or a tool that fails comes back as a
  short text starting with ``"error:"``; the model reads it as a tool result and can
  learn from it. Results are cut at ``max_result_chars`` (2,000). Each built-in tool
  also bounds its own work so one call ends well within a second.
- ``verify`` never raises and maps any string to a bounded
  :class:`~miniverl.common.trajectory.VerifierResult` (score in [0, 1], reason at
  most 500 characters).

A subclass declares its tools in ``tool_specs`` (OpenAI/Qwen function-call JSON
schema) and implements ``generate_task``, ``run_tool``, ``check_answer`` and
``oracle_actions``; argument validation, truncation and error capture live here.

This module does not tokenize, render chat messages or know about models; it is
torch-free (the bridge and verl reward functions import it).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import VerifierResult

SPLITS = ("train", "eval", "test")
DIFFICULTIES = ("easy", "medium", "hard")
MAX_REASON_CHARS = 500
MAX_RESULT_CHARS = 2000
MAX_ARGUMENT_CHARS = 10_000
_ERROR_CHARS = 300


@dataclass(frozen=True)
class ToolCall:
    """One oracle step: call tool ``name`` with JSON-safe ``arguments``."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class FinalAnswer:
    """The oracle's last step: answer with ``text`` (a turn without a tool call)."""

    text: str


Action = ToolCall | FinalAnswer


@dataclass
class Task:
    """One generated task. ``data`` is everything the environment needs (JSON-safe)."""

    id: str
    split: str
    difficulty: str
    prompt: str
    answer: str
    data: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Task:
        if not isinstance(obj, dict):
            raise ConfigError(f"task must be a JSON object, got {type(obj).__name__}")
        names = ("id", "split", "difficulty", "prompt", "answer")
        missing = [n for n in (*names, "data", "seed") if n not in obj]
        unknown = sorted(set(obj) - {*names, "data", "seed"})
        if missing or unknown:
            raise ConfigError(
                f"task {obj.get('id')!r}: missing fields {missing}, unknown fields {unknown}; "
                "a task has id, split, difficulty, prompt, answer, data, seed"
            )
        for n in names:
            if not isinstance(obj[n], str):
                raise ConfigError(f"task field {n!r} must be a string, got {obj[n]!r:.80}")
        if not isinstance(obj["data"], dict):
            raise ConfigError(f"task {obj['id']!r}: field 'data' must be an object")
        if not isinstance(obj["seed"], int) or isinstance(obj["seed"], bool):
            raise ConfigError(f"task {obj['id']!r}: field 'seed' must be an integer")
        return cls(**{k: obj[k] for k in (*names, "data", "seed")})


def task_id(env_name: str, split: str, prompt: str, seed: int = 0) -> str:
    """A stable id: the environment, the split and a hash of the prompt and seed.

    The seed is in the hash because one prompt can come with different data (two
    documents can both hold ``items.k875.stock``); ids key caches, so they must differ.
    """
    digest = hashlib.sha256(f"{seed}:{prompt}".encode()).hexdigest()[:12]
    return f"{env_name}-{split}-{digest}"


def tool_spec(name: str, description: str, properties: dict[str, dict], required=None) -> dict:
    """A function schema in the OpenAI/Qwen shape; every property is required by default."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties) if required is None else list(required),
            },
        },
    }


def format_number(value: float | int) -> str:
    """Canonical text for a number: integers without a dot, others with 10 significant digits."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}"


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, marking the cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 15)] + " ...[truncated]"


_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def last_number(text: str) -> float | None:
    """The last number written in ``text`` ("1,250" counts as 1250), or None."""
    found = _NUMBER_RE.findall(_THOUSANDS_RE.sub("", text))
    if not found:
        return None
    value = float(found[-1])
    return value if math.isfinite(value) else None


def numeric_result(expected: str, answer: str, rel_tol: float = 1e-6) -> VerifierResult:
    """Compare the last number of ``answer`` with ``expected`` (exact for integers)."""
    target = float(expected)
    got = last_number(answer)
    if got is None:
        return VerifierResult(success=False, score=0.0, reason="no number in the answer")
    if target.is_integer() and abs(target) < 1e15:
        ok = got == target
    else:
        ok = math.isclose(got, target, rel_tol=rel_tol, abs_tol=1e-9)
    if ok:
        return VerifierResult(success=True, score=1.0, reason=f"{format_number(got)} is correct")
    return VerifierResult(
        success=False, score=0.0, reason=clip(f"answered {format_number(got)}, expected {expected}", 200)
    )


def normalize_text(text: str) -> str:
    """Whitespace collapsed, outer quotes and a trailing period removed, lower case."""
    text = " ".join(text.split()).strip()
    for _ in range(3):
        text = text.strip().rstrip(".").strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
            text = text[1:-1]
    return text.strip().lower()


def _type_ok(value: Any, json_type: str) -> bool:
    if json_type == "string":
        return isinstance(value, str)
    if json_type == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if json_type == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if json_type == "boolean":
        return isinstance(value, bool)
    if json_type == "array":
        return isinstance(value, list)
    if json_type == "object":
        return isinstance(value, dict)
    return True


class Environment:
    """Base class with the guards; subclasses add tasks, tools and a verifier.

    Instances hold the state of one episode; ask the registry for a fresh one per
    episode (``get_environment(name)``).
    """

    name = "environment"
    max_result_chars = MAX_RESULT_CHARS
    # A longer string argument is refused before ``run_tool``, so no tool pays for
    # parsing, splitting or quoting megabytes a model (or a fuzzer) sent.
    max_argument_chars = MAX_ARGUMENT_CHARS

    def __init__(self) -> None:
        self.task: Task | None = None

    # -- to implement -------------------------------------------------------------
    def system_prompt(self) -> str:
        return "Use the tools to find the answer, then reply with the answer only."

    def tool_specs(self) -> list[dict]:
        raise NotImplementedError

    def generate_task(self, seed: int, split: str, difficulty: str) -> Task:
        raise NotImplementedError

    def run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run a validated call; may raise, ``step`` turns any exception into error text."""
        raise NotImplementedError

    def check_answer(self, task: Task, answer: str) -> VerifierResult:
        raise NotImplementedError

    def oracle_actions(self, task: Task) -> list[Action]:
        raise NotImplementedError

    def privileged_context(self, task: Task) -> str:
        return f"The answer is {task.answer}."

    def on_reset(self, task: Task) -> None:
        """Build per-episode state (a database, a document); the default keeps none."""

    # -- provided -----------------------------------------------------------------
    def make_task(
        self, seed: int, split: str, difficulty: str, prompt: str, answer: str, data: dict
    ) -> Task:
        return Task(
            id=task_id(self.name, split, prompt, int(seed)),
            split=split,
            difficulty=difficulty,
            prompt=prompt,
            answer=answer,
            data=data,
            seed=int(seed),
        )

    def reset(self, task: Task) -> None:
        self.task = task
        self.on_reset(task)

    def step(self, tool_name: Any, arguments: Any) -> str:
        try:
            problem = self._check_call(tool_name, arguments)
            if problem:
                return problem
            result = self.run_tool(tool_name, arguments)
            if not isinstance(result, str):
                result = str(result)
        except RecursionError:
            return "error: the input is nested too deeply"
        except Exception as exc:  # a tool failure is a learning signal, never a crash
            message = str(exc) or type(exc).__name__
            return clip(f"error: {message}", _ERROR_CHARS)
        return clip(result, self.max_result_chars)

    def verify(self, task: Task, answer: Any) -> VerifierResult:
        if not isinstance(answer, str):
            return VerifierResult(success=False, score=0.0, reason="the answer is not a string")
        try:
            result = self.check_answer(task, answer)
            return VerifierResult(
                success=bool(result.success),
                score=min(1.0, max(0.0, float(result.score))) if math.isfinite(result.score) else 0.0,
                reason=clip(str(result.reason), MAX_REASON_CHARS),
            )
        except Exception as exc:  # a verifier bug must not kill a rollout; it scores 0
            return VerifierResult(
                success=False, score=0.0, reason=clip(f"verifier error: {exc!r}", MAX_REASON_CHARS)
            )

    def _check_call(self, tool_name: Any, arguments: Any) -> str | None:
        specs = {s["function"]["name"]: s["function"] for s in self.tool_specs()}
        if not isinstance(tool_name, str) or tool_name not in specs:
            return clip(
                f"error: unknown tool {str(tool_name)!r}; available: {', '.join(specs)}", _ERROR_CHARS
            )
        if not isinstance(arguments, dict):
            return f"error: arguments for {tool_name} must be a JSON object"
        params = specs[tool_name].get("parameters", {})
        props = params.get("properties", {})
        unexpected = [k for k in arguments if k not in props]
        if unexpected:
            return clip(
                f"error: unexpected argument {str(unexpected[0])!r} for {tool_name}; "
                f"expected {', '.join(props) or 'none'}",
                _ERROR_CHARS,
            )
        missing = [k for k in params.get("required", []) if k not in arguments]
        if missing:
            return f"error: missing argument {missing[0]!r} for {tool_name}"
        for key, value in arguments.items():
            json_type = props[key].get("type", "")
            if not _type_ok(value, json_type):
                return f"error: argument {key!r} of {tool_name} must be a {json_type}"
            if isinstance(value, str) and len(value) > self.max_argument_chars:
                return (
                    f"error: argument {key!r} of {tool_name} has {len(value):,} characters; "
                    f"the limit is {self.max_argument_chars:,}"
                )
        if self.task is None:
            return "error: no task is loaded; call reset(task) first"
        return None
