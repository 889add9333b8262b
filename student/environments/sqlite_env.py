"""The ``sqlite`` environment: numeric questions over in-memory customers/orders tables.

Each task carries its rows in ``task.data`` (``customers``: ``[id, name, city]``,
``orders``: ``[id, customer_id, amount]``); ``reset`` loads them into a fresh
in-memory database. Tools: ``schema()`` returns the ``CREATE TABLE`` statements and
``query(sql)`` runs one statement.

Queries are read-only and bounded in time and size, because the SQL comes from a
model: an authorizer allows only SELECT, a progress handler stops a statement after
0.5 s or 2M VM steps, values are capped at 10,000 bytes, ``printf`` widths at 1,000,
and at most 50 rows and 2,000 characters come back. How and why lives in
``sqlite_guard.py``; this module holds the tasks, the tools and the verifier.

The verifier compares the last number of the answer with the ground truth.
This module is torch-free.
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any

from miniverl.common.trajectory import VerifierResult

from .base import Environment, FinalAnswer, Task, ToolCall, format_number, numeric_result, tool_spec
from .jsonnav import _CITIES, _FIRST, _LAST
from .sqlite_guard import MAX_ROWS, locked_connection, require_setlimit, run_query

__all__ = ["MAX_ROWS", "SCHEMA", "SqliteEnv", "open_database", "run_query"]

SCHEMA = (
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);\n"
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL "
    "REFERENCES customers(id), amount INTEGER NOT NULL);"
)


def open_database(customers: list[list], orders: list[list]) -> sqlite3.Connection:
    """A fresh in-memory database holding the rows, locked down for model-written SQL."""
    return locked_connection(SCHEMA, {"customers": customers, "orders": orders})


class SqliteEnv(Environment):
    """Answer numeric questions with SQL over customers and orders."""

    name = "sqlite"

    def __init__(self) -> None:
        require_setlimit()  # fail at construction, not mid-episode, on Python < 3.11
        super().__init__()
        self._conn: sqlite3.Connection | None = None

    def system_prompt(self) -> str:
        return "Use the schema and query tools (SQLite). Reply with only the final number."

    def tool_specs(self) -> list[dict]:
        return [
            tool_spec("schema", "Show the database tables.", {}),
            tool_spec("query", "Run one read-only SQL query.", {"sql": {"type": "string"}}),
        ]

    def on_reset(self, task: Task) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = open_database(task.data["customers"], task.data["orders"])

    def run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if name == "schema":
            return SCHEMA
        try:
            return run_query(self._conn, arguments["sql"])
        except sqlite3.Warning as exc:  # "You can only execute one statement at a time."
            raise ValueError(str(exc)) from None
        except (sqlite3.Error, OverflowError) as exc:
            raise ValueError(f"sql: {exc}") from None

    def check_answer(self, task: Task, answer: str) -> VerifierResult:
        return numeric_result(task.answer, answer)

    def oracle_actions(self, task: Task) -> list:
        return [
            ToolCall("schema", {}),
            ToolCall("query", {"sql": task.data["sql"]}),
            FinalAnswer(task.answer),
        ]

    def privileged_context(self, task: Task) -> str:
        return f"SQL: {task.data['sql']} The answer is {task.answer}."

    def generate_task(self, seed: int, split: str, difficulty: str) -> Task:
        rng = random.Random(f"sqlite:{int(seed)}:{difficulty}")
        cities = rng.sample(sorted(_CITIES), 3)
        names = rng.sample([f"{f} {last}" for f in _FIRST for last in _LAST], rng.randint(5, 8))
        customers = [[i + 1, n, rng.choice(cities)] for i, n in enumerate(names)]
        orders = []
        for cust in customers:
            for _ in range(rng.randint(1, 4)):
                orders.append([0, cust[0], rng.randint(5, 200)])
        rng.shuffle(orders)
        for i, order in enumerate(orders):
            order[0] = i + 1
        who = rng.choice(customers)
        name = who[1]
        if difficulty == "easy":
            prompt = f"How many orders did {name} place?"
            sql = (
                "SELECT COUNT(*) FROM orders JOIN customers ON orders.customer_id = customers.id "
                f"WHERE customers.name = '{name}'"
            )
        elif difficulty == "medium":
            if rng.random() < 0.5:
                prompt = f"What is the total amount of orders by {name}?"
                sql = (
                    "SELECT SUM(amount) FROM orders JOIN customers ON orders.customer_id = "
                    f"customers.id WHERE customers.name = '{name}'"
                )
            else:
                prompt = f"What is the largest order amount of {name}?"
                sql = (
                    "SELECT MAX(amount) FROM orders JOIN customers ON orders.customer_id = "
                    f"customers.id WHERE customers.name = '{name}'"
                )
        elif difficulty == "hard":
            city, threshold = who[2], 5 * rng.randint(2, 38)
            kind = rng.random()
            join = "FROM orders JOIN customers ON orders.customer_id = customers.id"
            if kind < 0.25:
                prompt = f"How many orders over {threshold} were placed by customers in {city}?"
                sql = f"SELECT COUNT(*) {join} WHERE customers.city = '{city}' AND amount > {threshold}"
            elif kind < 0.5:
                prompt = f"What is the total amount of orders over {threshold} from customers in {city}?"
                sql = (
                    f"SELECT COALESCE(SUM(amount), 0) {join} WHERE customers.city = '{city}' "
                    f"AND amount > {threshold}"
                )
            else:
                other = rng.choice([c for c in customers if c is not who])[1]
                prompt = f"What is the difference between the total order amounts of {name} and {other}?"
                sql = (
                    f"SELECT ABS((SELECT SUM(amount) {join} WHERE customers.name = '{name}') - "
                    f"(SELECT SUM(amount) {join} WHERE customers.name = '{other}'))"
                )
        else:
            raise ValueError(f"difficulty {difficulty!r} is not easy, medium or hard")
        conn = open_database(customers, orders)
        try:
            answer = format_number(conn.execute(sql).fetchone()[0])
        finally:
            conn.close()
        data = {"customers": customers, "orders": orders, "sql": sql}
        return self.make_task(seed, split, difficulty, prompt, answer, data)
