"""Tasks to verl Parquet rows and back, losslessly.

A verl row carries what verl's ``RLHFDataset``, tool agent and reward manager read:
``data_source`` (``miniverl/<environment>``), ``prompt`` (system + user messages),
``ability``, ``reward_model {style: "rule", ground_truth}`` and ``extra_info {split, index,
need_tools_kwargs, tools_kwargs, miniverl}``. The ``miniverl`` struct holds the task
itself as a JSON string plus hashes, so the way back never guesses.

Two verl 0.8.0 loader traps shape the schema: an empty struct breaks the Parquet reader,
and a struct key present in some rows only becomes ``None`` in the others. So the schema
is built explicitly, every row gets every tool key, and the parts that vary (task data,
environment params) travel as JSON strings. Nothing is truncated here; verl's own
``data.truncation: error`` is what the exported overrides set.

This module converts; it does not pick splits or write bundles (see ``bundle.py``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from miniverl.common.errors import ConfigError, ProvenanceError, require
from miniverl.common.hashing import canonical_json, prefixed, sha256_json, sha256_text
from miniverl.student.environments import Task, get_environment

ROW_FORMAT = 1
DATA_SOURCE_PREFIX = "miniverl/"
ABILITY = "tool_use"
# A task set (JSONL) names its environment in header lines; task lines stay Task.to_dict().
TASK_SET_KEY = "miniverl_task_set"
TASK_SET_FORMAT = 1
TASK_SET_KEYS = (TASK_SET_KEY, "environment", "params")


def _pa():
    return require("pyarrow", "bridge")


# ---------------------------------------------------------------------------- tasks


def task_to_dict(task: object) -> dict:
    """A Task (or an already plain dict) as the dict its JSONL line holds."""
    if isinstance(task, dict):
        return dict(task)
    to_dict = getattr(task, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    if dataclasses.is_dataclass(task):
        return dataclasses.asdict(task)
    raise ConfigError(f"cannot convert {type(task).__name__} to a task dict; pass a Task")


def _header(obj: dict, where: str) -> tuple[str, dict]:
    """``(environment, params)`` of a task-set header line; ConfigError if malformed."""
    if set(obj) != set(TASK_SET_KEYS) or obj[TASK_SET_KEY] != TASK_SET_FORMAT:
        raise ConfigError(
            f"{where}: a task-set header has exactly {list(TASK_SET_KEYS)} with "
            f"{TASK_SET_KEY}: {TASK_SET_FORMAT} (got {sorted(obj)}); fix the header line"
        )
    name, params = obj["environment"], obj["params"]
    if not isinstance(name, str) or not name or not isinstance(params, dict):
        raise ConfigError(
            f"{where}: header environment must be a name and params an object "
            f"(got {name!r:.60}, {params!r:.60}); fix the header line"
        )
    return name, params


def read_tasks_jsonl(
    path: Path, environment: str | None = None
) -> tuple[list[dict], list[EnvFacts]]:
    """Task dicts from a JSONL task set, and the environment (with params) of each.

    A header line ``{"miniverl_task_set": 1, "environment": NAME, "params": {...}}`` sets
    the environment of the task lines after it; task lines before any header need
    ``environment`` (its default params). ``environment`` must agree with every header.
    """
    tasks: list[dict] = []
    envs: list[EnvFacts] = []
    facts: dict[str, EnvFacts] = {}
    current: tuple[str, dict] | None = (environment, {}) if environment else None
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}); pass a JSONL task set"
        ) from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            task = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{where}: not JSON ({exc.msg}); expected one task per line"
            ) from None
        if isinstance(task, dict) and TASK_SET_KEY in task:
            current = _header(task, where)
            if environment and current[0] != environment:
                raise ConfigError(
                    f"{where}: --environment {environment} but the header says "
                    f"{current[0]}; drop --environment (the file names its environment)"
                )
            continue
        try:
            Task.from_dict(task)  # types too: an int prompt must not become a verl row
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}; write tasks with Task.to_dict()") from None
        if current is None:
            raise ConfigError(
                f"{where}: no environment for this task; pass --environment NAME or put a "
                f'header line {{"{TASK_SET_KEY}": {TASK_SET_FORMAT}, "environment": NAME, '
                '"params": {}} before it'
            )
        key = current[0] + canonical_json(current[1])
        if key not in facts:
            try:
                facts[key] = env_facts(*current)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        tasks.append(task)
        envs.append(facts[key])
    if current is None:
        raise ConfigError(
            f"{path} holds no tasks and names no environment; pass --environment NAME"
        )
    return tasks, envs


def write_tasks_jsonl(path: Path, rows: Iterable[tuple[dict, str, dict]]) -> int:
    """Write ``(task, environment, params)`` rows as a task set; returns the task count.

    A header line precedes the first task and every change of environment or params,
    so the file names everything the tasks need (falsy params included).
    """
    n = 0
    last = None
    with open(path, "w", encoding="utf-8") as fh:
        for task, environment, params in rows:
            if (environment, params) != last:
                header = {TASK_SET_KEY: TASK_SET_FORMAT, "environment": environment,
                          "params": params}
                fh.write(json.dumps(header, ensure_ascii=False) + "\n")
                last = (environment, params)
            fh.write(json.dumps(task, ensure_ascii=False) + "\n")
            n += 1
    return n


# ----------------------------------------------------------------------- environment


@dataclasses.dataclass(frozen=True)
class EnvFacts:
    """What a row needs from an environment: its name, params, system prompt and tools."""

    name: str
    params: dict
    system_prompt: str
    tool_specs: list

    @property
    def tool_names(self) -> list[str]:
        return [spec.get("function", spec).get("name", "") for spec in self.tool_specs]


def env_facts(name: str, params: dict | None = None) -> EnvFacts:
    """Ask the environment registry for the facts a row carries."""
    params = dict(params or {})
    try:
        env = get_environment(name, **params)
    except KeyError as exc:
        raise ConfigError(
            f"unknown environment {name!r}; pass --environment with a registered name"
        ) from exc
    return EnvFacts(name, params, env.system_prompt(), list(env.tool_specs()))


# ------------------------------------------------------------------------------ rows


def task_to_row(task: dict, index: int, env: EnvFacts, all_tools: list[str],
                tool_selection: bool = False) -> dict:
    """One verl row for one task dict; ``all_tools`` is the tool-key union of the file.
    ``tool_selection``: the row also names its own environment's tools, in order
    (``extra_info.tool_selection``), which verl's tool agent shows it instead of every
    tool of ``tool_config.yaml`` (a bundle of a mixture)."""
    task = task_to_dict(task)
    # Key order kept (not canonical_json): converting back writes the same bytes.
    task_json = json.dumps(task, ensure_ascii=False, separators=(",", ":"))
    params_json = canonical_json(env.params)
    row_tools = set(env.tool_names)
    extra: dict = {
        "split": str(task["split"]),
        "index": int(index),
        "need_tools_kwargs": bool(all_tools),
    }
    if all_tools:
        # Every row carries every tool key (see the module docstring); a tool this row's
        # environment lacks gets an empty environment name, which the tool refuses.
        extra["tools_kwargs"] = {
            tool: {
                "create_kwargs": {
                    "environment": env.name if tool in row_tools else "",
                    "params_json": params_json,
                    "task_json": task_json,
                }
            }
            for tool in all_tools
        }
    if tool_selection:
        extra["tool_selection"] = list(env.tool_names)
    messages = [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": str(task["prompt"])},
    ]
    extra["miniverl"] = {
        "format": ROW_FORMAT,
        "environment": env.name,
        "params_json": params_json,
        "task_id": str(task["id"]),
        "difficulty": str(task.get("difficulty", "")),
        "task_json": task_json,
        "task_sha256": prefixed(sha256_text(task_json)),
        "prompt_sha256": prefixed(sha256_json(messages)),
        "tools_sha256": prefixed(sha256_json(env.tool_specs)),
    }
    return {
        "data_source": DATA_SOURCE_PREFIX + env.name,
        "prompt": messages,
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": str(task["answer"])},
        "extra_info": extra,
    }


def verl_schema(all_tools: list[str], tool_selection: bool = False):
    """The explicit Arrow schema of a verl file whose rows know ``all_tools`` (and, with
    ``tool_selection``, name their own tools)."""
    pa = _pa()
    miniverl = pa.struct(
        [
            ("format", pa.int64()),
            ("environment", pa.string()),
            ("params_json", pa.string()),
            ("task_id", pa.string()),
            ("difficulty", pa.string()),
            ("task_json", pa.string()),
            ("task_sha256", pa.string()),
            ("prompt_sha256", pa.string()),
            ("tools_sha256", pa.string()),
        ]
    )
    extra_fields = [
        ("split", pa.string()),
        ("index", pa.int64()),
        ("need_tools_kwargs", pa.bool_()),
    ]
    if all_tools:
        create = pa.struct(
            [("environment", pa.string()), ("params_json", pa.string()), ("task_json", pa.string())]
        )
        tool_struct = pa.struct([("create_kwargs", create)])
        extra_fields.append(("tools_kwargs", pa.struct([(t, tool_struct) for t in all_tools])))
    if tool_selection:
        extra_fields.append(("tool_selection", pa.list_(pa.string())))
    extra_fields.append(("miniverl", miniverl))
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            ("extra_info", pa.struct(extra_fields)),
        ]
    )


def tasks_to_table(tasks: Iterable[dict], envs: list[EnvFacts] | EnvFacts,
                   all_tools: list[str] | None = None, tool_selection: bool = False):
    """An Arrow table of verl rows. ``envs`` is one environment, or one per task;
    ``all_tools`` the file's tool keys in order (default: the sorted union);
    ``tool_selection`` as in :func:`task_to_row`."""
    tasks = [task_to_dict(t) for t in tasks]
    per_task = envs if isinstance(envs, list) else [envs] * len(tasks)
    if len(per_task) != len(tasks):
        raise ConfigError(
            f"got {len(per_task)} environments for {len(tasks)} tasks; pass one per task"
        )
    if all_tools is None:
        all_tools = sorted({name for env in per_task for name in env.tool_names})
    rows = [
        task_to_row(t, i, env, all_tools, tool_selection)
        for i, (t, env) in enumerate(zip(tasks, per_task, strict=True))
    ]
    return _pa().Table.from_pylist(rows, schema=verl_schema(all_tools, tool_selection))


def write_verl_parquet(path: Path, tasks: Iterable[dict], envs: list[EnvFacts] | EnvFacts) -> int:
    table = tasks_to_table(tasks, envs)
    import pyarrow.parquet as pq

    pq.write_table(table, path)
    return table.num_rows


# ------------------------------------------------------------------------- way back


def row_to_task(row: dict, where: str) -> dict:
    """The task dict a verl row was made from; ``ProvenanceError`` if the row was edited."""
    try:
        return _row_to_task(row, where)
    except ProvenanceError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        # A column of another type (a string where a struct belongs, ...): not our row.
        raise ProvenanceError(
            f"{where}: a column has the wrong type or shape ({type(exc).__name__}); only "
            "files written by `miniverl convert-dataset --to verl` or `export-verl` convert back"
        ) from None


def _row_to_task(row: dict, where: str) -> dict:
    info = (row.get("extra_info") or {}).get("miniverl")
    if not info:
        raise ProvenanceError(
            f"{where}: no extra_info.miniverl block; only files written by "
            "`miniverl convert-dataset --to verl` or `export-verl` convert back"
        )
    task_json = info.get("task_json") or ""
    if prefixed(sha256_text(task_json)) != info.get("task_sha256"):
        raise ProvenanceError(f"{where}: task_json does not match task_sha256; the row was edited")
    task = json.loads(task_json)
    prompt = row.get("prompt") or []
    shown = [{"role": m.get("role"), "content": m.get("content")} for m in prompt]
    if prefixed(sha256_json(shown)) != info.get("prompt_sha256"):
        raise ProvenanceError(f"{where}: prompt does not match prompt_sha256; the row was edited")
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if truth != str(task.get("answer")):
        raise ProvenanceError(f"{where}: reward_model.ground_truth differs from the task's answer")
    return task


class VerlRow(NamedTuple):
    """One row read back: the task dict and the environment (with params) that made it."""

    task: dict
    environment: str
    params: dict


def read_verl_parquet(path: Path) -> list[VerlRow]:
    """Every row of a verl file written by miniverl, as a :class:`VerlRow`."""
    import pyarrow.parquet as pq

    pa = _pa()
    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"{path} is not a readable Parquet file ({first}); pass a .parquet file written "
            "by `miniverl convert-dataset --to verl` or `export-verl`"
        ) from None
    out = []
    for i, row in enumerate(rows):
        where = f"{path}: row {i}"
        task = row_to_task(row, where)
        info = row["extra_info"]["miniverl"]
        environment = info.get("environment")
        if not isinstance(environment, str) or not environment:
            raise ProvenanceError(f"{where}: extra_info.miniverl.environment is missing")
        # The tag verl groups its metrics by must still name the row's environment.
        if row.get("data_source") != DATA_SOURCE_PREFIX + environment:
            raise ProvenanceError(
                f"{where}: data_source {row.get('data_source')!r} is not "
                f"{DATA_SOURCE_PREFIX + environment!r} (its extra_info.miniverl.environment); "
                "the row was edited: export it again")
        try:
            params = json.loads(info.get("params_json") or "")
        except (TypeError, json.JSONDecodeError):
            params = None
        if not isinstance(params, dict):
            raise ProvenanceError(
                f"{where}: extra_info.miniverl.params_json is not a JSON object; the row was edited"
            )
        out.append(VerlRow(task, environment, params))
    return out
