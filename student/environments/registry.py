"""Find environments by name and make deterministic, disjoint task splits.

Three environments are built in (``calculator``, ``jsonnav``, ``sqlite``). More come
from :func:`register` (in-process) or from installed packages that declare an entry
point in the ``miniverl.environments`` group, e.g. in ``pyproject.toml``::

    [project.entry-points."miniverl.environments"]
    lettercount = "my_package:LetterCountEnv"

Entry points are listed on first need and loaded only when their name is asked for.
A factory is any callable taking the environment's parameters as keywords and
returning a fresh instance (a class works).

Splits are disjoint by prompt: a prompt belongs to the split chosen by a hash of its
text (60% train, 20% eval, 20% test), independently of ``split_seed``, so no test
prompt ever appears in training whatever the seeds. This module is torch-free.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from importlib import metadata
from typing import Any

from miniverl.common.errors import ConfigError

from .base import DIFFICULTIES, SPLITS, Task
from .calculator import CalculatorEnv
from .jsonnav import JsonNavEnv
from .sqlite_env import SqliteEnv

ENTRY_POINT_GROUP = "miniverl.environments"
_NAME_RE = re.compile(r"^[a-z][a-z0-9_\-]{0,63}$")
_REQUIRED_METHODS = (
    "system_prompt", "tool_specs", "generate_task", "reset", "step", "verify",
    "oracle_actions", "privileged_context",
)  # fmt: skip

_BUILTINS: dict[str, Callable[..., Any]] = {
    "calculator": CalculatorEnv,
    "jsonnav": JsonNavEnv,
    "sqlite": SqliteEnv,
}
_factories: dict[str, Callable[..., Any]] = dict(_BUILTINS)
_plugins: dict[str, metadata.EntryPoint] | None = None


def register(name: str, factory: Callable[..., Any], *, replace: bool = False) -> None:
    """Make ``get_environment(name)`` call ``factory(**params)``.

    Registering a name again replaces it; replacing a built-in needs ``replace=True``.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(
            f"environment name {name!r} is invalid; use lower-case letters, digits, '_' or '-' "
            "starting with a letter (at most 64 characters)"
        )
    if not callable(factory):
        raise ConfigError(f"environment {name!r}: factory {factory!r} is not callable")
    if name in _BUILTINS and not replace and factory is not _BUILTINS[name]:
        raise ConfigError(
            f"environment {name!r} is built in; pass replace=True to override it or pick another name"
        )
    _factories[name] = factory


def unregister(name: str) -> None:
    """Forget a registered environment (built-ins come back with their own factory)."""
    _factories.pop(name, None)
    if name in _BUILTINS:
        _factories[name] = _BUILTINS[name]


def _discover() -> dict[str, metadata.EntryPoint]:
    global _plugins
    if _plugins is None:
        found: dict[str, metadata.EntryPoint] = {}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            found.setdefault(ep.name, ep)
        _plugins = found
    return _plugins


def refresh_plugins() -> None:
    """Forget the entry points listed so far; the next lookup lists them again."""
    global _plugins
    _plugins = None


def list_environments() -> list[str]:
    """Registered, built-in and installed (entry point) environment names, sorted."""
    return sorted(set(_factories) | set(_discover()))


def _factory(name: str) -> Callable[..., Any]:
    if name in _factories:
        return _factories[name]
    plugins = _discover() if isinstance(name, str) else {}
    if name not in plugins:
        raise ConfigError(
            f"unknown environment {name!r}; known: {', '.join(list_environments())}. Register one "
            "with miniverl.student.environments.register(name, factory) or install a package "
            f"with a '{ENTRY_POINT_GROUP}' entry point"
        )
    ep = plugins[name]
    try:
        factory = ep.load()
    except Exception as exc:
        raise ConfigError(
            f"environment plugin {name!r} ({ep.value}) failed to load: {exc!r}; "
            "check that its package is installed and importable"
        ) from exc
    register(name, factory)
    return factory


def get_environment(name: str, **params: Any):
    """A fresh environment instance; ``params`` are the recipe's ``environment.params``."""
    factory = _factory(name)
    try:
        env = factory(**params)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"environment {name!r} rejected params {params!r:.200}: {exc}; "
            "fix environment.params in the recipe"
        ) from exc
    missing = [m for m in _REQUIRED_METHODS if not callable(getattr(env, m, None))]
    if missing:
        raise ConfigError(
            f"environment {name!r} ({type(env).__name__}) lacks {', '.join(missing)}; "
            "subclass miniverl.student.environments.Environment"
        )
    return env


def split_of(prompt: str) -> str:
    """The split a prompt belongs to, from a hash of its text alone."""
    bucket = int(hashlib.sha256(f"miniverl-split:{prompt}".encode()).hexdigest()[:8], 16) % 10
    return "train" if bucket < 6 else "eval" if bucket < 8 else "test"


def _derived_seed(split_seed: int, split: str, difficulty: str, counter: int) -> int:
    text = f"{split_seed}:{split}:{difficulty}:{counter}"
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def make_tasks(
    env_name: str,
    split: str,
    n: int,
    difficulty: str,
    split_seed: int,
    params: dict[str, Any] | None = None,
) -> list[Task]:
    """``n`` distinct tasks of ``split``; ``difficulty="mixed"`` cycles easy/medium/hard.

    Deterministic in all arguments. Candidates are generated from seeds derived from
    ``split_seed`` and kept when their prompt hashes to ``split`` and is new.
    """
    if split not in SPLITS:
        raise ConfigError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    if difficulty not in (*DIFFICULTIES, "mixed"):
        raise ConfigError(
            f"difficulty {difficulty!r} is not one of {', '.join(DIFFICULTIES)} or mixed"
        )
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ConfigError(f"task count {n!r} must be a non-negative integer")
    env = get_environment(env_name, **(params or {}))
    tasks: list[Task] = []
    seen: set[str] = set()
    # Give up when new prompts stop coming, not after a fixed huge count: a small
    # prompt space would otherwise spin for minutes before saying so.
    budget, patience, misses = 100 * n + 2000, 3000, 0
    for counter in range(budget):
        if len(tasks) == n or misses > patience:
            break
        level = DIFFICULTIES[len(tasks) % 3] if difficulty == "mixed" else difficulty
        seed = _derived_seed(split_seed, split, level, counter)
        task = env.generate_task(seed, split, level)
        if task.prompt in seen or split_of(task.prompt) != split:
            misses += 1
            continue
        misses = 0
        seen.add(task.prompt)
        tasks.append(task)
    if len(tasks) < n:
        raise ConfigError(
            f"environment {env_name!r} produced only {len(tasks)} distinct {difficulty} prompts "
            f"for split {split!r} after {counter + 1} tries, {n} asked; lower the task count or use "
            "difficulty mixed"
        )
    return tasks
