"""Measure a teacher's competence: the greedy held-out eval that makes a qualification record.

A teacher is only worth distilling from if it can do the task itself.
:func:`measure` plays the environment's held-out split with the *teacher's* model
(greedy, through :func:`~miniverl.student.eval.evaluate`: the rollout code does not
care whose weights it runs) and :func:`record_from_eval` turns the summary into a
**qualification record** (``common/qualification.py`` says what one holds, where records
live and how the gate, ``teacher.min_success``, matches one to a live teacher; its names
are re-exported here for the student's callers).

This module does not load teacher weights (``miniverl qualify-teacher`` does, with the
teacher server's loader; ``student/qualify_remote.py`` measures a running teacher over
the wire) and does not talk to a teacher.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from miniverl.common.clock import utc_now
from miniverl.common.errors import ConfigError
from miniverl.common.qualification import (  # noqa: F401  (re-exported for the student's callers)
    IDENTITY_KEYS,
    RECORD_FILE,
    RECORD_KIND,
    TeacherNotQualified,
    describe_teacher,
    environment_signature,
    find_record,
    model_dir_digest,
    privileged_view,
    qualifications_dir,
    record_key,
    require_qualified,
    save_record,
)
from miniverl.common.toy import cache_root

HELD_OUT = ("eval", "test")


def check_split(split: str) -> None:
    """A teacher qualifies on a held-out split only."""
    if split not in HELD_OUT:
        raise ConfigError(
            f"--split {split!r}: a teacher qualifies on a held-out split; use eval or test"
        )


def check_one_environment(recipe: Any) -> None:
    """A qualification record is one environment's success: a mixture has none."""
    if recipe.environments is not None:
        raise ConfigError(
            "a teacher qualifies on one environment, and this recipe names a mixture "
            "(environments:); qualify it with a recipe of each environment (environment:)")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("miniverl")
    except PackageNotFoundError:
        return "unknown"


def measure(
    model: Any,
    tokenizer: Any,
    recipe: Any,
    *,
    identity: dict[str, Any],
    model_dir: str | Path,
    split: str = "eval",
    max_tasks: int | None = None,
    tokenizer_fp: str | None = None,
) -> dict[str, Any]:
    """Greedy success of ``model`` (the teacher) on ``split``; returns the record.

    A ``privileged_context`` teacher plays the split in its privileged view, the one it
    scores with (``environment_signature`` records the view)."""
    import torch

    # Eval loads the rollout runner and torch, which only measuring needs; the CLI
    # reads and records qualifications through this module without them (start-up).
    from miniverl.student.eval import evaluate

    check_split(split)
    check_one_environment(recipe)
    greedy = recipe.model_copy(update={"eval": recipe.eval.model_copy(update={"greedy": True})})
    model.eval()
    with torch.no_grad():
        summary = evaluate(model, tokenizer, greedy, split=split, policy_version=0,
                           tokenizer_fp=tokenizer_fp, max_tasks=max_tasks,
                           privileged=privileged_view(recipe))
    return record_from_eval(summary.to_dict(), recipe, identity=identity, model_dir=model_dir,
                            tokenizer_fp=tokenizer_fp)


def stored_dir(model_dir: str | Path) -> str:
    """How a record names the weights: relative to the cache when they are in it (a
    prepared or converted model), else relative to the working directory; never an
    absolute path of this machine (the digest beside it identifies the weights)."""
    path, cache = Path(model_dir).expanduser().resolve(), cache_root().resolve()
    return (path.relative_to(cache).as_posix() if path.is_relative_to(cache)
            else Path(os.path.relpath(path)).as_posix())


def record_from_eval(
    summary: dict[str, Any],
    recipe: Any,
    *,
    identity: dict[str, Any],
    model_dir: str | Path | None,
    tokenizer_fp: str | None,
) -> dict[str, Any]:
    """The qualification record of a greedy eval (``EvalSummary.to_dict()``) of a teacher.

    ``model_dir`` None: the teacher's weights are not visible from here (a teacher on
    another machine, or a hub id); the record then matches by the model string alone.
    """
    return {
        "kind": RECORD_KIND,
        "teacher": {k: identity.get(k) for k in IDENTITY_KEYS},
        "model_dir": stored_dir(model_dir) if model_dir else None,
        "model_dir_sha256": model_dir_digest(model_dir) if model_dir else None,
        "tokenizer_fp": tokenizer_fp,
        "environment": environment_signature(recipe),
        "split": summary["split"],
        "n": summary["n"],
        "success": summary["success"],
        "by_difficulty": summary["by_difficulty"],
        "stop_reasons": summary["stop_reasons"],
        "mean_tool_calls": summary.get("mean_tool_calls", 0.0),
        # Environments with injected faults: the breakdown, and the recovery rate the
        # teacher.min_recovery gate reads (None when no eval episode saw a tool error).
        **({"faults": summary["faults"], "recovery": summary["faults"]["recovery"]["rate"]}
           if summary.get("faults") else {}),
        "date": utc_now(timespec="seconds"),
        "miniverl_version": _version(),
    }
