"""Tool environments: deterministic tasks, tools that never crash, verifiers that never raise.

Public API::

    from miniverl.student.environments import get_environment, make_tasks
    tasks = make_tasks("calculator", "train", 32, "easy", split_seed=0)
    env = get_environment("calculator")        # a fresh instance per episode
    env.reset(tasks[0])
    tasks[0].prompt                                     # -> "What is 32 + 85?"
    env.step("calculator", {"expression": "32 + 85"})   # -> "117"
    env.verify(tasks[0], "117")                         # -> VerifierResult(success=True, ...)

Built-ins: ``calculator``, ``jsonnav``, ``sqlite``. Plugins come from :func:`register`
or the ``miniverl.environments`` entry-point group. See docs/environments.md.

This package is torch-free: the bridge and verl reward functions import it. It does
not render chat messages or run models (that is ``miniverl.student.rollout.runner``).
"""

from .base import (
    DIFFICULTIES,
    SPLITS,
    Action,
    Environment,
    FinalAnswer,
    Task,
    ToolCall,
    format_number,
    last_number,
    normalize_text,
    numeric_result,
    tool_spec,
)
from .calculator import CalculatorEnv
from .jsonnav import JsonNavEnv
from .registry import (
    ENTRY_POINT_GROUP,
    get_environment,
    list_environments,
    make_tasks,
    refresh_plugins,
    register,
    split_of,
    unregister,
)
from .sqlite_env import SqliteEnv

__all__ = [
    "DIFFICULTIES",
    "ENTRY_POINT_GROUP",
    "SPLITS",
    "Action",
    "CalculatorEnv",
    "Environment",
    "FinalAnswer",
    "JsonNavEnv",
    "SqliteEnv",
    "Task",
    "ToolCall",
    "format_number",
    "get_environment",
    "last_number",
    "list_environments",
    "make_tasks",
    "normalize_text",
    "numeric_result",
    "refresh_plugins",
    "register",
    "split_of",
    "tool_spec",
    "unregister",
]
