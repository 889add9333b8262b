"""Every tool call is bounded in time and size, whatever a model or an attacker sends.

The named bombs and the seeded fuzz live in ``hostile_calls.py`` (also run at scale by
``benchmarks/tool_bounds.py``). Time bounds here are 1 s per call: the real limits are
far lower (0.25 s for a sqlite statement, microseconds for the calculator), and 1 s
leaves room for a busy shared machine while still catching the 25-43 s calls these
tests were written against.
"""

from __future__ import annotations

import sqlite3

import pytest

from miniverl.common.errors import ConfigError
from miniverl.student.environments import (
    Environment,
    get_environment,
    make_tasks,
    sqlite_guard,
    tool_spec,
)
from miniverl.student.environments.base import FinalAnswer, ToolCall
from miniverl.student.environments.sqlite_env import open_database, run_query
from miniverl.student.environments.sqlite_guard import printf_problem
from tests.student.environments.hostile_calls import (
    ENVIRONMENTS,
    fuzz_calls,
    live_environments,
    named_bombs,
    run_call,
)

CALL_SECONDS = 1.0
BOMBS_THAT_ANSWER = {"wide result", "deep parentheses"}  # bounded, but a real answer


@pytest.fixture(scope="module")
def envs():
    return live_environments()


@pytest.mark.parametrize("label,env_name,tool,arguments", named_bombs(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_bomb_ends_within_a_second_as_a_tool_result(envs, label, env_name, tool, arguments):
    # A user relies on one tool call never stalling a rollout: it ends fast, does not
    # raise, and the model gets a short text back (an error naming the limit).
    env = envs[env_name]
    seconds, out = run_call(env, tool, arguments)
    assert seconds < CALL_SECONDS, f"{label}: {seconds:.2f} s"
    assert isinstance(out, str) and len(out) <= env.max_result_chars
    if label not in BOMBS_THAT_ANSWER:
        assert out.startswith("error:"), out
    if env_name == "sqlite":  # the episode goes on: the same connection still answers
        assert env.step("query", {"sql": "SELECT COUNT(*) AS n FROM customers"}).startswith("n\n")


def test_sqlite_errors_name_the_limit(envs):
    # A model can only learn to write a better query if the error says which rule it broke.
    env = envs["sqlite"]
    assert "printf width or precision 2000000000 is over 1000" in env.step(
        "query", {"sql": "SELECT printf('%.*c', 2000000000, 'x')"}
    )
    assert "string or blob too big" in env.step("query", {"sql": "SELECT zeroblob(2000000000)"})
    assert "string or blob too big" in env.step("query", {"sql": "SELECT randomblob(1000000)"})
    out = env.step("query", {"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT max(x) FROM c"})
    assert out.startswith("error: sql: query stopped:"), out
    assert "query string is too large" in env.step("query", {"sql": "SELECT " + "1+" * 2500 + "1"})


# Inputs of every storage class, for the equivalence test below.
_VALUES = [None, 0, -7, 2.5, "", "abc", "ABC", "a%b_c", "[a-c]*", "Ines Silva", "ça 🙂", b"\x00ab"]


@pytest.mark.parametrize(
    "name,nargs",
    [("like", 2), ("like", 3), ("glob", 2), ("instr", 2), ("replace", 3), ("trim", 2),
     ("ltrim", 2), ("rtrim", 2)],
)  # fmt: skip
def test_wrapped_builtins_answer_like_sqlites_own(name, nargs):
    # The bounds must not change an honest answer: the deadline-checked versions return
    # exactly what sqlite's built-ins return, for NULL, numbers, text and blobs.
    guarded = open_database([[1, "Ines Silva", "Ghent"]], [[1, 1, 10]])
    plain = sqlite3.connect(":memory:")
    sql = f"SELECT {name}({', '.join('?' * nargs)})"
    escapes = [None, "\\", "x"]  # like's third argument must be one character or NULL
    for i, first in enumerate(_VALUES):
        for second in _VALUES:
            args = [first, second] + ([escapes[i % 3]] if nargs == 3 else [])
            try:
                want = plain.execute(sql, args).fetchone()[0]
            except sqlite3.Error:
                continue
            assert guarded.execute(sql, args).fetchone()[0] == want, (name, args)
    guarded.close()


def test_printf_still_formats():
    # Honest formatting is unchanged: the checked printf hands the call to sqlite's own.
    conn = open_database([[1, "Ines Silva", "Ghent"]], [[1, 1, 10]])
    out = run_query(conn, "SELECT printf('%.2f|%5d|%-4s|%%|%.*c', 3.14159, 42, 'ab', 3, 'x') AS s, format('%,d', 1234567) AS f")
    assert out == "s | f\n3.14|   42|ab  |%|xxx | 1,234,567"
    assert run_query(conn, "SELECT printf(NULL) AS p, printf('%s') AS q") == "p | q\nNULL | "
    conn.close()


@pytest.mark.parametrize(
    "fmt,args,refused",
    [
        ("%.2f", (1.0,), False),
        ("%1000c", ("x",), False),
        ("%1001c", ("x",), True),
        ("%.*c", (2_000_000_000, "x"), True),
        ("%.*c", ("2000000000abc", "x"), True),  # sqlite reads the text's leading digits
        ("%.*c", (b"9999", "x"), True),
        ("%*.*c", (-5000, 3, "x"), True),  # a negative width is its absolute value
        ("%d %.*c", (5, 2_000_000_000, "x"), True),  # the * takes the second argument
        ("%%%.*c", (2_000_000_000, "x"), True),
        ("%%.*c", (2_000_000_000, "x"), False),  # %% is a literal: no spec follows
        ("%y%.*c", (2_000_000_000, "x"), False),  # sqlite stops at an unknown type
        (b"%.9999c", (), True),
        (None, (), False),
    ],
)
def test_printf_problem_reads_widths_as_sqlite_does(fmt, args, refused):
    # A width sqlite would honour must never slip through, or the 43 s call is back.
    assert (printf_problem(fmt, args) is not None) == refused


def test_sqlite_needs_python_311(monkeypatch):
    # On Python 3.10 (no Connection.setlimit) the environment refuses to start rather
    # than run model-written SQL without a size cap; the message says what to do.
    monkeypatch.setattr(sqlite_guard, "_HAS_SETLIMIT", False)
    with pytest.raises(ConfigError, match="Python 3.11"):
        get_environment("sqlite")


def test_calculator_and_jsonnav_bounds(envs):
    # The calculator checks a power's size before computing it; jsonnav caps paths.
    calc, nav = envs["calculator"], envs["jsonnav"]
    assert calc.step("calculator", {"expression": "0.5 ** -64"}) == "error: result exceeds 1e+15 in magnitude"
    assert calc.step("calculator", {"expression": "2 ** 40"}) == "1099511627776"
    assert calc.step("convert", {"value": 1e300, "from_unit": "km", "to_unit": "mm"}).startswith("error:")
    assert "longer than 300 characters" in nav.step("get", {"path": "a" * 301})
    assert nav.step("get", {"path": "people.²"}).startswith("error: no key")


class _EchoEnv(Environment):
    name = "echo"
    max_argument_chars = 50

    def tool_specs(self):
        return [tool_spec("echo", "Echo a text.", {"text": {"type": "string"}})]

    def run_tool(self, name, arguments):
        return arguments["text"]


def test_string_arguments_are_capped_per_environment():
    # Every environment refuses an over-long string argument before its tool runs;
    # a plugin that needs long inputs raises max_argument_chars.
    env = _EchoEnv()
    env.task = make_tasks("calculator", "train", 1, "easy", 0)[0]
    assert env.step("echo", {"text": "x" * 50}) == "x" * 50
    assert env.step("echo", {"text": "x" * 51}) == "error: argument 'text' of echo has 51 characters; the limit is 50"


def test_fuzzed_tool_calls_are_bounded_and_never_raise(envs):
    # 1,200 seeded hostile calls (400 per environment): none raises out of step, none
    # takes a second, every result is a string within the result cap; afterwards each
    # episode still works (its oracle verifies).
    calls = fuzz_calls(1_200, seed=18)
    assert len(calls) >= 1_000
    for env_name, tool, arguments in calls:
        env = envs[env_name]
        seconds, out = run_call(env, tool, arguments)
        assert seconds < CALL_SECONDS, (env_name, tool, str(arguments)[:200], seconds)
        assert isinstance(out, str) and len(out) <= env.max_result_chars, (env_name, tool)
    for name in ENVIRONMENTS:
        env = envs[name]
        task = env.task
        actions = env.oracle_actions(task)
        for action in actions:
            if isinstance(action, ToolCall):
                env.step(action.name, action.arguments)
        assert isinstance(actions[-1], FinalAnswer) and env.verify(task, actions[-1].text).success
