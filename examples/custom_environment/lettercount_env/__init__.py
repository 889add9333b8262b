"""``lettercount``: an example miniverl environment plugin.

Tasks ask how often a letter appears in a made-up word; the ``count`` tool answers
for one letter at a time. It shows the whole plugin contract in one small file:
tool schemas, deterministic task generation, a tool that reports bad input as
``error:`` text (the base class adds argument checks), a verifier and oracle actions.
It is not part of miniverl; it is installed on its own (see README.md).
"""

from __future__ import annotations

import random
from typing import Any

from miniverl.common.trajectory import VerifierResult
from miniverl.student.environments import (
    Environment,
    FinalAnswer,
    Task,
    ToolCall,
    numeric_result,
    tool_spec,
)

_SYLLABLES = [
    "ba", "na", "to", "mi", "ra", "lo", "pe", "su", "ki", "de",
    "fo", "la", "ne", "ri", "sa", "mo", "tu", "ka", "li", "po",
]


class LetterCountEnv(Environment):
    """Count letters with the ``count`` tool; ``max_syllables`` makes words longer."""

    name = "lettercount"

    def __init__(self, max_syllables: int = 4) -> None:
        super().__init__()
        if not 2 <= int(max_syllables) <= 8:
            raise ValueError(f"max_syllables={max_syllables} must be between 2 and 8")
        self.max_syllables = int(max_syllables)

    def system_prompt(self) -> str:
        return "Use the count tool. Reply with only the final number."

    def tool_specs(self) -> list[dict]:
        return [
            tool_spec(
                "count",
                "Count how often a letter appears in a text.",
                {"text": {"type": "string"}, "letter": {"type": "string"}},
            )
        ]

    def run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        letter = arguments["letter"].strip().lower()
        if len(letter) != 1:
            return f"error: letter must be one character, got {arguments['letter']!r:.40}"
        return str(arguments["text"].lower().count(letter))

    def generate_task(self, seed: int, split: str, difficulty: str) -> Task:
        rng = random.Random(f"lettercount:{int(seed)}:{difficulty}")
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, self.max_syllables)))
        letters = sorted(set(word))
        if difficulty == "hard":
            pair = rng.sample(letters, 2)
            prompt = f"How many times do the letters {pair[0]} and {pair[1]} appear in {word}?"
        else:
            pair = [rng.choice(letters)]
            if difficulty == "medium":
                word = f"{word} {rng.choice(_SYLLABLES)}{rng.choice(_SYLLABLES)}"
            prompt = f"How many times does the letter {pair[0]} appear in {word}?"
        answer = str(sum(word.count(c) for c in pair))
        data = {"word": word, "letters": pair}
        return self.make_task(seed, split, difficulty, prompt, answer, data)

    def check_answer(self, task: Task, answer: str) -> VerifierResult:
        return numeric_result(task.answer, answer)

    def oracle_actions(self, task: Task) -> list:
        calls = [ToolCall("count", {"text": task.data["word"], "letter": c}) for c in task.data["letters"]]
        return [*calls, FinalAnswer(task.answer)]
