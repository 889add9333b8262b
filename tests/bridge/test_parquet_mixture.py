"""A mixture's tasks to verl Parquet and back: every row carries its own environment in
verl's ``data_source`` and in ``extra_info.miniverl``, and reads back into it; a row
whose ``data_source`` was changed is refused."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from miniverl.bridge import parquet
from miniverl.bridge.convert import convert_dataset
from miniverl.common.errors import ProvenanceError
from miniverl.student.environments import make_tasks
from tests.toy_kit import recipe_dict


def _mixture_recipe(tmp_path):
    data = recipe_dict("rl", tmp_path, teacher=None, sections={"rollout": {"group_size": 2}})
    del data["environment"]
    data["environments"] = [
        {"name": "calculator", "weight": 2, "train_tasks": 3, "eval_tasks": 2, "test_tasks": 1,
         "params": {"units": False}},
        {"name": "sqlite", "weight": 1, "train_tasks": 2, "eval_tasks": 1, "test_tasks": 1,
         "difficulty": "mixed", "split_seed": 4},
    ]
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_mixture_exports_each_row_tagged_and_imports_it_back(tmp_path):
    out = tmp_path / "mix.parquet"
    assert convert_dataset(_mixture_recipe(tmp_path), out, "verl") == 10
    rows = pq.read_table(out).to_pylist()
    assert [r["data_source"] for r in rows] == ["miniverl/calculator"] * 6 + ["miniverl/sqlite"] * 4
    back = parquet.read_verl_parquet(out)
    assert [(r.environment, r.params) for r in back] == (
        [("calculator", {"units": False})] * 6 + [("sqlite", {})] * 4)
    # Each environment's rows are its own tasks, every split, in split order.
    sqlite = [t.to_dict() for split, n in (("train", 2), ("eval", 1), ("test", 1))
              for t in make_tasks("sqlite", split, n, "mixed", 4)]
    assert [r.task for r in back[6:]] == sqlite
    # And the way back to a task set keeps each environment (one header per change).
    tasks, envs = parquet.read_tasks_jsonl(_roundtrip(tmp_path, out))
    assert [e.name for e in envs] == ["calculator"] * 6 + ["sqlite"] * 4


def _roundtrip(tmp_path, parquet_path):
    jsonl = tmp_path / "back.jsonl"
    convert_dataset(parquet_path, jsonl, "miniverl")
    return jsonl


def test_a_row_whose_data_source_was_changed_is_refused(tmp_path):
    out = tmp_path / "mix.parquet"
    convert_dataset(_mixture_recipe(tmp_path), out, "verl")
    table = pq.read_table(out)
    sources = table.column("data_source").to_pylist()
    sources[7] = "miniverl/calculator"
    edited = table.set_column(table.schema.get_field_index("data_source"), "data_source",
                              pa.array(sources, pa.string()))
    pq.write_table(edited, out)
    with pytest.raises(ProvenanceError, match="row 7: data_source 'miniverl/calculator' is not "
                                              "'miniverl/sqlite'"):
        parquet.read_verl_parquet(out)
