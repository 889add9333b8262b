"""The sqlite tools are read-only and bounded: writes and runaway queries are refused."""

from __future__ import annotations

import time

import pytest

from miniverl.student.environments import get_environment, make_tasks


@pytest.fixture
def env():
    e = get_environment("sqlite")
    e.reset(make_tasks("sqlite", "train", 1, "easy", 0)[0])
    return e


def _count(env) -> str:
    return env.step("query", {"sql": "SELECT COUNT(*) FROM orders"})


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO customers VALUES (99, 'x', 'y')",
        "UPDATE orders SET amount = 0",
        "DELETE FROM orders",
        "DROP TABLE orders",
        "CREATE TABLE t (a)",
        "CREATE TEMP TABLE t (a)",
        "ALTER TABLE orders ADD COLUMN b",
        "ATTACH DATABASE 'evil.db' AS evil",
        "PRAGMA query_only = OFF",
        "PRAGMA writable_schema = ON",
        "PRAGMA table_info(orders)",
        "BEGIN",
        "VACUUM",
        "REPLACE INTO orders VALUES (1, 1, 1)",
        "SELECT 1; DELETE FROM orders",
        "WITH x AS (SELECT 1) DELETE FROM orders",
    ],
)
def test_writes_and_pragmas_are_refused(env, sql, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an ATTACH that slipped through would create a file here
    before = _count(env)
    out = env.step("query", {"sql": sql})
    assert out.startswith("error:"), out
    assert _count(env) == before
    assert not list(tmp_path.iterdir())


def test_runaway_queries_stop(env):
    # A model can write an infinite recursive CTE; it must end quickly as an error text.
    t0 = time.monotonic()
    out = env.step(
        "query",
        {"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT SUM(x) FROM c"},
    )
    # Whichever limit comes first (VM steps or the 0.25 s clock) depends on the machine.
    assert out.startswith("error: sql: query stopped:"), out
    out = env.step(
        "query", {"sql": "SELECT COUNT(*) FROM orders a, orders b, orders c, orders d, orders e, orders f"}
    )
    assert out.startswith("error: sql: query stopped:"), out
    assert time.monotonic() - t0 < 10
    assert _count(env).startswith("COUNT(*)")  # the connection still works


def test_results_are_bounded(env):
    out = env.step(
        "query",
        {"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"},
    )
    assert "more than 50 rows" in out and len(out.splitlines()) == 52
    out = env.step("query", {"sql": "SELECT group_concat(name, '------------------') FROM customers, orders"})
    assert len(out) <= env.max_result_chars
    assert env.step("query", {"sql": "SELECT randomblob(100000000)"}).startswith("error:")
    assert env.step("query", {"sql": "SELECT zeroblob(10)"}) == "zeroblob(10)\n<10 bytes>"


def test_schema_and_errors(env):
    assert "CREATE TABLE customers" in env.step("schema", {})
    assert env.step("schema", {"x": 1}).startswith("error: unexpected argument")
    assert env.step("query", {"sql": "SELEKT 1"}).startswith("error: sql:")
    assert env.step("query", {"sql": "SELECT * FROM nope"}).startswith("error: sql:")
    assert env.step("query", {"sql": ""}) == "(no result)"
    assert env.step("query", {"sql": 5}).startswith("error: argument 'sql'")
    assert env.step("query", {"sql": "SELECT 1 + 1 AS two"}) == "two\n2"


def test_each_reset_gets_a_fresh_database():
    tasks = make_tasks("sqlite", "train", 2, "easy", 0)
    env = get_environment("sqlite")
    env.reset(tasks[0])
    first = env.step("query", {"sql": "SELECT * FROM customers"})
    env.reset(tasks[1])
    assert env.step("query", {"sql": "SELECT * FROM customers"}) != first


def test_step_before_reset_is_an_error():
    assert get_environment("sqlite").step("schema", {}).startswith("error: no task")
