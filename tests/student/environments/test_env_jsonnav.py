"""jsonnav tools read the task's document and report bad paths as error text."""

from __future__ import annotations

import json

from miniverl.student.environments import get_environment, make_tasks


def test_tools_on_a_document():
    task = make_tasks("jsonnav", "train", 1, "hard", 0)[0]
    env = get_environment("jsonnav")
    env.reset(task)
    doc = task.data["document"]
    assert json.loads(env.step("keys", {"path": ""})) == ["people", "items", "cities"]
    pid = next(iter(doc["people"]))
    assert json.loads(env.step("get", {"path": f"people.{pid}"})) == doc["people"][pid]
    assert json.loads(env.step("get", {"path": f"people.{pid}.age"})) == doc["people"][pid]["age"]
    paths = json.loads(env.step("find", {"key": "population"}))
    assert len(paths) == 3 and all(p.startswith("cities.") for p in paths)
    assert env.step("find", {"key": "zzz"}).startswith("no path ends with")
    assert env.step("get", {"path": "people.nobody"}).startswith("error: no key 'nobody'")
    assert env.step("keys", {"path": f"people.{pid}.age"}).startswith("error:")
    assert env.step("get", {"path": f"people.{pid}.age.x"}).startswith("error:")
    assert env.step("get", {"path": ["people"]}).startswith("error: argument 'path'")
    assert env.step("get", {}).startswith("error: missing argument 'path'")
    assert env.step("fetch", {"path": ""}).startswith("error: unknown tool 'fetch'")
