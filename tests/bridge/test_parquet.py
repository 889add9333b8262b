"""Parquet both ways: lossless, never truncated, one schema for every row."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miniverl.bridge import parquet
from miniverl.bridge.convert import convert_dataset
from miniverl.common.errors import ConfigError, ProvenanceError
from miniverl.student.environments import make_tasks

# Real tasks never hold lone surrogates (they cannot be encoded as UTF-8 at all).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
JSON_LEAF = st.none() | st.booleans() | st.integers(-(2**62), 2**62) | TEXT
JSON = st.recursive(
    JSON_LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
TASKS = st.builds(
    dict,
    id=TEXT.filter(bool),
    split=st.sampled_from(["train", "eval", "test"]),
    difficulty=st.sampled_from(["easy", "medium", "hard"]),
    prompt=TEXT,
    answer=TEXT,
    data=st.dictionaries(TEXT, JSON, max_size=4),
    seed=st.integers(0, 2**62),
)


def _env(name="calculator"):
    return parquet.env_facts(name)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks=st.lists(TASKS, min_size=1, max_size=5))
@pytest.mark.slow
def test_round_trip_is_lossless(tmp_path_factory, tasks):
    # A user converting to verl and back gets byte-identical task dicts.
    path = tmp_path_factory.mktemp("rt") / "x.parquet"
    parquet.write_verl_parquet(path, tasks, _env())
    back = [row.task for row in parquet.read_verl_parquet(path)]
    assert back == tasks


def test_never_truncates_long_prompts(tmp_path):
    task = make_tasks("calculator", "train", 1, "easy", 0)[0].to_dict()
    task["prompt"] = "x" * 300_000
    path = tmp_path / "long.parquet"
    parquet.write_verl_parquet(path, [task], _env())
    row = pq.read_table(path).to_pylist()[0]
    assert row["prompt"][1]["content"] == task["prompt"]
    assert parquet.read_verl_parquet(path)[0].task == task


def test_mixed_environments_share_one_schema_and_every_tool_key(tmp_path):
    # verl's loader turns a struct key missing from some rows into None and breaks on
    # empty structs: every row must carry every tool key, none empty.
    calc = make_tasks("calculator", "train", 2, "easy", 0)
    nav = make_tasks("jsonnav", "train", 2, "easy", 0)
    envs = [_env("calculator")] * 2 + [_env("jsonnav")] * 2
    path = tmp_path / "mixed.parquet"
    parquet.write_verl_parquet(path, calc + nav, envs)
    table = pq.read_table(path)
    assert table.schema.remove_metadata().equals(
        parquet.verl_schema(sorted(set(envs[0].tool_names + envs[2].tool_names)))
    )
    for row in table.to_pylist():
        kwargs = row["extra_info"]["tools_kwargs"]
        assert set(kwargs) == set(envs[0].tool_names) | set(envs[2].tool_names)
        assert all(v is not None and v["create_kwargs"]["task_json"] for v in kwargs.values())
    assert [row.environment for row in parquet.read_verl_parquet(path)] == [
        "calculator",
        "calculator",
        "jsonnav",
        "jsonnav",
    ]


def test_verl_row_fields():
    task = make_tasks("calculator", "eval", 1, "medium", 0)[0]
    row = parquet.task_to_row(task, 7, _env(), _env().tool_names)
    assert row["data_source"] == "miniverl/calculator"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["reward_model"] == {"style": "rule", "ground_truth": task.answer}
    info = row["extra_info"]
    assert info["split"] == "eval" and info["index"] == 7
    assert info["miniverl"]["task_id"] == task.id and info["miniverl"]["difficulty"] == "medium"
    assert json.loads(info["miniverl"]["task_json"]) == task.to_dict()


@pytest.mark.parametrize("field", ["prompt", "ground_truth", "task_json"])
def test_edited_row_is_refused(tmp_path, field):
    task = make_tasks("calculator", "train", 1, "easy", 0)[0]
    row = parquet.task_to_row(task, 0, _env(), _env().tool_names)
    if field == "prompt":
        row["prompt"][1]["content"] += " (edited)"
    elif field == "ground_truth":
        row["reward_model"]["ground_truth"] = "0"
    else:
        row["extra_info"]["miniverl"]["task_json"] = row["extra_info"]["miniverl"][
            "task_json"
        ].replace("{", "{ ", 1)
    with pytest.raises(ProvenanceError):
        parquet.row_to_task(row, "row 0")


def test_convert_dataset_both_ways(tmp_path):
    # A task set without a header converts with --environment; the way back names it.
    tasks = make_tasks("sqlite", "test", 3, "mixed", 0)
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    assert convert_dataset(jsonl, tmp_path / "t.parquet", "verl", environment="sqlite") == 3
    assert convert_dataset(tmp_path / "t.parquet", tmp_path / "back.jsonl", "miniverl") == 3
    header, *lines = (tmp_path / "back.jsonl").read_text().splitlines(keepends=True)
    assert json.loads(header) == {"miniverl_task_set": 1, "environment": "sqlite", "params": {}}
    assert "".join(lines) == jsonl.read_text()


@pytest.mark.parametrize(
    ("environment", "params"),
    [("calculator", {"units": False}), ("calculator", {}), ("calculator", {"units": True})],
)
def test_jsonl_parquet_jsonl_keeps_every_field(tmp_path, environment, params):
    # The documented "losslessly": a task set written by miniverl comes back byte for byte,
    # environment params included, falsy ones too ({"units": false} once came back as {}).
    tasks = make_tasks(environment, "train", 4, "mixed", 0, params)
    src = tmp_path / "tasks.jsonl"
    parquet.write_tasks_jsonl(src, ((t.to_dict(), environment, params) for t in tasks))
    assert convert_dataset(src, tmp_path / "t.parquet", "verl") == 4
    rows = parquet.read_verl_parquet(tmp_path / "t.parquet")
    assert [(r.task, r.environment, r.params) for r in rows] == [
        (t.to_dict(), environment, params) for t in tasks
    ]
    assert convert_dataset(tmp_path / "t.parquet", tmp_path / "back.jsonl", "miniverl") == 4
    assert (tmp_path / "back.jsonl").read_bytes() == src.read_bytes()
    header, *lines = [json.loads(x) for x in src.read_text().splitlines()]
    assert header == {"miniverl_task_set": 1, "environment": environment, "params": params}
    assert lines == [t.to_dict() for t in tasks]
    # The rows' tools follow the params: units=False has no convert tool.
    tools = set(pq.read_table(tmp_path / "t.parquet").to_pylist()[0]["extra_info"]["tools_kwargs"])
    assert ("convert" in tools) == params.get("units", True)


def test_recipe_params_survive_parquet_and_back(tmp_path):
    import yaml

    from tests.bridge.conftest import RECIPE

    data = {**RECIPE, "environment": {**RECIPE["environment"], "params": {"units": False}}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    convert_dataset(tmp_path / "r.yaml", tmp_path / "all.parquet", "verl")
    convert_dataset(tmp_path / "all.parquet", tmp_path / "back.jsonl", "miniverl")
    convert_dataset(tmp_path / "back.jsonl", tmp_path / "again.parquet", "verl")
    first = pq.read_table(tmp_path / "all.parquet").to_pylist()
    assert pq.read_table(tmp_path / "again.parquet").to_pylist() == first
    assert {json.loads(r["extra_info"]["miniverl"]["params_json"])["units"] for r in first} == {
        False
    }


def test_mixed_task_set_gets_one_header_per_environment(tmp_path):
    calc = [(t.to_dict(), "calculator", {"units": False}) for t in make_tasks(
        "calculator", "train", 2, "easy", 0, {"units": False})]
    nav = [(t.to_dict(), "jsonnav", {}) for t in make_tasks("jsonnav", "train", 2, "easy", 0)]
    src = tmp_path / "mixed.jsonl"
    parquet.write_tasks_jsonl(src, calc + nav)
    assert sum("miniverl_task_set" in line for line in src.read_text().splitlines()) == 2
    convert_dataset(src, tmp_path / "m.parquet", "verl")
    convert_dataset(tmp_path / "m.parquet", tmp_path / "back.jsonl", "miniverl")
    assert (tmp_path / "back.jsonl").read_bytes() == src.read_bytes()


@pytest.mark.parametrize(
    ("lines", "environment", "match"),
    [
        (['{"miniverl_task_set": 1, "environment": "calculator"}'], None, "exactly"),
        (['{"miniverl_task_set": 2, "environment": "calculator", "params": {}}'], None, "exactly"),
        (['{"miniverl_task_set": 1, "environment": "calculator", "params": []}'], None, "object"),
        (['{"miniverl_task_set": 1, "environment": "nope", "params": {}}', "TASK"], None,
         ":2: unknown environment"),
        (['{"miniverl_task_set": 1, "environment": "calculator", "params": {"bogus": 1}}',
          "TASK"], None, "rejected params"),
        (['{"miniverl_task_set": 1, "environment": "calculator", "params": {}}'], "jsonnav",
         "drop --environment"),
        (["TASK"], None, "--environment"),
    ],
)
def test_bad_task_set_headers_are_refused(tmp_path, lines, environment, match):
    task = json.dumps(make_tasks("calculator", "train", 1, "easy", 0)[0].to_dict())
    src = tmp_path / "t.jsonl"
    src.write_text("".join(line.replace("TASK", task) + "\n" for line in lines))
    with pytest.raises(ConfigError, match=match):
        convert_dataset(src, tmp_path / "o.parquet", "verl", environment=environment)
    assert not (tmp_path / "o.parquet").exists()


def test_edited_params_are_refused(tmp_path):
    import pyarrow as pa

    task = make_tasks("calculator", "train", 1, "easy", 0)[0]
    row = parquet.task_to_row(task, 0, _env(), _env().tool_names)
    row["extra_info"]["miniverl"]["params_json"] = "[1]"
    pq.write_table(pa.Table.from_pylist([row], schema=parquet.verl_schema(_env().tool_names)),
                   tmp_path / "x.parquet")
    with pytest.raises(ProvenanceError, match="params_json"):
        parquet.read_verl_parquet(tmp_path / "x.parquet")


def test_convert_dataset_from_recipe(tmp_path):
    import yaml

    from tests.bridge.conftest import RECIPE

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    n = convert_dataset(recipe, tmp_path / "all.parquet", "verl")
    env = RECIPE["environment"]
    assert n == env["train_tasks"] + env["eval_tasks"] + env["test_tasks"]
    splits = [r["extra_info"]["split"] for r in pq.read_table(tmp_path / "all.parquet").to_pylist()]
    assert splits.count("eval") == env["eval_tasks"]


def test_convert_dataset_refusals(tmp_path):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("")
    with pytest.raises(ConfigError, match="--environment"):
        convert_dataset(jsonl, tmp_path / "o.parquet", "verl")
    with pytest.raises(ConfigError, match="--to"):
        convert_dataset(jsonl, tmp_path / "o.parquet", "hf")
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(
        __import__("pyarrow").table({"data_source": ["gsm8k"], "extra_info": [{"index": 0}]}),
        foreign,
    )
    with pytest.raises(ProvenanceError, match="extra_info.miniverl"):
        convert_dataset(foreign, tmp_path / "o.jsonl", "miniverl")
