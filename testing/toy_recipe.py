"""The few-second toy recipe: two toy model shapes and a recipe dict on them.

miniverl's own tests (``tests/toy_kit.py``) and benchmarks (``benchmarks/
behaviour_hashes.py``, ``benchmarks/integrity_flips.py``) build their runs from this one
recipe, so a test and a benchmark train on the same models in the same way. Its values
are fixed on purpose: the benchmarks' recorded checkpoint hashes and the tests' timings
depend on them.

Not part of the kit's documented API (``docs/testing.md``), which tests clients and
teachers without a model: this module only builds a dict, validates nothing and imports
nothing from miniverl.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A 32-wide student and a wider 48-wide teacher, so there is something to distil.
STUDENT = {"hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 64, "seed": 0}
TEACHER = {"hidden": 48, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 96, "seed": 1}


def recipe_dict(
    mode: str,
    output_dir: Path | str,
    *,
    student: Mapping[str, int] = STUDENT,
    teacher: Mapping[str, int] | None = TEACHER,
    sections: Mapping[str, Mapping[str, Any] | None] | None = None,
    **train: Any,
) -> dict[str, Any]:
    """A tiny deterministic recipe as a dict: seconds on one CPU thread.

    Calculator tasks, four rollouts of at most two turns of twelve new tokens per cycle,
    three cycles. ``student``/``teacher`` are the toy shapes (no teacher section for sft
    or ``teacher=None``); ``train`` keywords update the train section; ``sections``
    maps a section name to the keys to update in it, or to ``None`` to leave it out
    (its defaults apply). Callers may still edit the dict before validating it.
    """
    recipe: dict[str, Any] = {
        "run": {"name": f"t-{mode}", "mode": mode, "seed": 0, "output_dir": str(output_dir),
                "deterministic": True},
        "student": {"model": {"toy": dict(student)}, "dtype": "float32", "device": "cpu",
                    "lora": None},
        "environment": {"name": "calculator", "difficulty": "easy", "train_tasks": 8,
                        "eval_tasks": 2, "test_tasks": 2},
        "rollout": {"max_turns": 2, "max_new_tokens_per_turn": 12, "max_total_tokens": 640,
                    "batch_size": 4},
        "loss": {"objective": "bucketed_topk_tail", "top_k": 8},
        "train": {"cycles": 3, "rollouts_per_cycle": 4, "lr": 1e-3, "eval_every": 0,
                  "save_every": 0, **train},
        "runtime": {"heartbeat_ms": 100, "request_timeout_s": 10, "unavailable_timeout_s": 20},
    }
    if mode != "sft" and teacher is not None:
        recipe["teacher"] = {"model": {"toy": dict(teacher)}, "dtype": "float32",
                             "device": "cpu"}
    for name, update in (sections or {}).items():
        if update is None:
            recipe.pop(name, None)
        else:
            recipe.setdefault(name, {}).update(update)
    return recipe
