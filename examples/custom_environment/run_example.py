"""Register the ``lettercount`` plugin and run oracle episodes through reset/step/verify.

Run from the repository root (miniverl installed, the plugin need not be)::

    python examples/custom_environment/run_example.py

When the plugin is installed (``pip install -e examples/custom_environment``) the
entry point already provides it and the explicit ``register`` call is skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

from miniverl.student.environments import (
    ToolCall,
    get_environment,
    list_environments,
    make_tasks,
    register,
)


def main(n: int = 5) -> float:
    if "lettercount" not in list_environments():
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from lettercount_env import LetterCountEnv

        register("lettercount", LetterCountEnv)
    solved = total = 0
    for split in ("train", "eval", "test"):
        for task in make_tasks("lettercount", split, n, "mixed", split_seed=0):
            env = get_environment("lettercount")
            env.reset(task)
            for action in env.oracle_actions(task):
                if isinstance(action, ToolCall):
                    print(f"  {action.name}({action.arguments}) -> {env.step(action.name, action.arguments)}")
                else:
                    result = env.verify(task, action.text)
                    solved, total = solved + result.success, total + 1
                    print(f"[{split}/{task.difficulty}] {task.prompt} -> {action.text} ({result.reason})")
    env = get_environment("lettercount")
    env.reset(task)
    print("a malformed call:", env.step("count", {"text": 3}))
    print(f"oracle solved {solved}/{total}")
    return solved / total


if __name__ == "__main__":
    sys.exit(0 if main() == 1.0 else 1)
