"""``miniverl convert-dataset``: task sets to verl Parquet and back.

Inputs by suffix: ``.jsonl``/``.json`` is a miniverl task set (one ``Task.to_dict()`` per
line after a header line naming the environment and its params, or ``--environment`` for
a file without one), ``.yaml``/``.yml`` is a recipe whose environment section (or each
environment of its mixture, every row tagged with its own) generates the train, eval and
test tasks, ``.parquet`` is a verl file written by miniverl.
``--to verl`` writes Parquet rows (see ``parquet.py``); ``--to miniverl`` writes the task
set back as JSONL (headers included, so environment params survive), checking every row's
hashes first. The output is written beside its final name and renamed. This module
dispatches; the row format lives in ``parquet.py``.
"""

from __future__ import annotations

from pathlib import Path

from miniverl.bridge import parquet
from miniverl.common.atomic import publishing
from miniverl.common.errors import ConfigError
from miniverl.common.recipe import load_recipe
from miniverl.student.environments import SPLITS, make_tasks
from miniverl.student.environments.mixture import split_size

TARGETS = ("verl", "miniverl")


def _tasks_from_recipe(path: Path) -> tuple[list[dict], list[parquet.EnvFacts]]:
    """Every split's tasks of a recipe's environment; a mixture's, environment after
    environment, each row tagged with its own (``data_source``)."""
    recipe = load_recipe(path)
    tasks, envs = [], []
    for env_cfg in recipe.environments or [recipe.environment]:
        facts = parquet.env_facts(env_cfg.name, env_cfg.params)
        for split in SPLITS:
            made = make_tasks(env_cfg.name, split, split_size(env_cfg, split),
                              env_cfg.difficulty, env_cfg.split_seed, env_cfg.params)
            tasks += [t.to_dict() for t in made]
            envs += [facts] * len(made)
    return tasks, envs


def convert_dataset(src: Path, dst: Path, to: str, environment: str | None = None) -> int:
    """Convert ``src`` into ``dst`` in the ``to`` format; returns the number of rows/tasks."""
    src, dst = Path(src), Path(dst)
    if to not in TARGETS:
        raise ConfigError(f"--to {to!r} is not one of {', '.join(TARGETS)}")
    if not src.is_file():
        raise ConfigError(
            f"input {src} does not exist; pass a .jsonl task set, a recipe or a .parquet file"
        )
    # A failed conversion leaves neither a half-written output nor its temp file.
    with publishing(dst) as tmp:
        n = _convert(src, tmp, to, environment)
    return n


def _convert(src: Path, tmp: Path, to: str, environment: str | None) -> int:
    suffix = src.suffix.lower()
    if to == "verl":
        if suffix in (".jsonl", ".json"):
            tasks, env = parquet.read_tasks_jsonl(src, environment)
        elif suffix in (".yaml", ".yml"):
            tasks, env = _tasks_from_recipe(src)
        else:
            raise ConfigError(
                f"{src.name}: --to verl reads a .jsonl task set or a .yaml recipe, not {suffix or 'no suffix'}"
            )
        n = parquet.write_verl_parquet(tmp, tasks, env)
    else:
        if suffix != ".parquet":
            raise ConfigError(
                f"{src.name}: --to miniverl reads a verl .parquet file written by miniverl"
            )
        n = parquet.write_tasks_jsonl(tmp, parquet.read_verl_parquet(src))
    return n
