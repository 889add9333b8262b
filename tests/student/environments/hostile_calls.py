"""Hostile tool calls for the built-in environments: named bombs and a seeded fuzz.

Shared by ``test_env_tool_bounds.py`` and ``benchmarks/tool_bounds.py``. Each call is
``(env_name, tool, arguments)``; :func:`run_call` runs one on a live environment and
times it. This module is a generator of inputs, not a test: it asserts nothing.
"""

from __future__ import annotations

import random
import time
from typing import Any

from miniverl.student.environments import get_environment, make_tasks

ENVIRONMENTS = ("sqlite", "calculator", "jsonnav")

_A = "replace(hex(zeroblob(4900)),'0','a')"  # 9,800 'a's, just under the value cap
_GLOB_CLASSES = "'*'||replace(hex(zeroblob(8)),'0','[a-z]')||'b'"
_LIKE = "'%'||substr(replace(hex(zeroblob(50)),'0','a'),1,98)||'b'"


def _per_row(expr: str, columns: str, n: int) -> str:
    """A recursive CTE whose every row evaluates ``expr`` ``n`` times in straight-line code."""
    terms = "+".join([expr] * n)
    return f"WITH RECURSIVE t(a,p,n) AS (SELECT {columns}, 0 UNION ALL SELECT a,p,n+1 FROM t) SELECT {terms} AS s FROM t"


SQL_BOMBS: dict[str, str] = {
    "printf %.*c 2e9 (43 s before)": "SELECT length(printf('%.*c',2000000000,'x'))",
    "printf width digits": "SELECT length(printf('%2000000000d', 1))",
    "printf * width from text": "SELECT length(printf('%.*c', '2000000000x', 'x'))",
    "format alias": "SELECT length(format('%.*c',2000000000,'x'))",
    "printf computed format": "SELECT length(printf('%.' || 2000000000 || 'c', 'x'))",
    "zeroblob 2e9": "SELECT length(zeroblob(2000000000))",
    "randomblob 2e9": "SELECT length(randomblob(2000000000))",
    "randomblob 1e6": "SELECT length(hex(randomblob(1000000)))",
    "replace expansion": (
        "SELECT length(replace(replace(replace(replace(hex(zeroblob(1000)),'0','0000000000'),"
        "'0','0000000000'),'0','0000000000'),'0','0000000000'))"
    ),
    "recursive CTE": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT SUM(x) FROM c",
    "recursive CTE of strings": (
        "WITH RECURSIVE c(s) AS (SELECT 'x' UNION ALL SELECT s || 'x' FROM c) SELECT length(s) FROM c ORDER BY 1 DESC"
    ),
    "six-way cross join": "SELECT COUNT(*) FROM orders a, orders b, orders c, orders d, orders e, orders f",
    "huge sort": (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c ORDER BY zeroblob(4900)||x"
    ),
    "GLOB classes x300 per row": _per_row("(a GLOB p)", f"{_A}, {_GLOB_CLASSES}", 300),
    "LIKE x300 per row": _per_row("(a LIKE p)", f"{_A}, {_LIKE}", 300),
    "instr x300 per row": _per_row("instr(a,p)", f"substr({_A},1,6000), substr({_A},1,3000)||'b'", 300),
    "count distinct big keys": (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(DISTINCT zeroblob(4900)||x) FROM c"
    ),
    "wide result": "WITH t(a) AS (SELECT " + _A + ") SELECT * FROM " + ",".join(f"t t{i}" for i in range(60)),
    "SQL over 4,000 chars": "SELECT " + "+".join(["1"] * 2500),
}

CALC_BOMBS: dict[str, str] = {
    "9**9**9": "9**9**9",
    "10**10**10": "10**10**10",
    "tower with ^": "9^9^9^9",
    "small base, negative exponent": "1e-300 ** -64",
    "factorial syntax": "100!",
    "overflowing product": "1e308 * 10",
    "200-digit number": "9" * 200,
    "deep unary nesting": "-" * 199 + "1",
    "deep parentheses": "(" * 99 + "1" + ")" * 99,
    "many parts": "1+" * 99 + "1",
    "long expression": "1+" * 100_000 + "1",
    "round digits": "round(1, 10**9)",
}

JSONNAV_BOMBS: dict[str, tuple[str, dict[str, Any]]] = {
    "long path": ("get", {"path": "people." * 50_000}),
    "many parts": ("get", {"path": ".".join(["0"] * 150)}),
    "huge index": ("get", {"path": "people." + "9" * 250}),
    "unicode digit index": ("get", {"path": "people.²"}),
    "long find key": ("find", {"key": "k" * 1_000_000}),
}


def named_bombs() -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(label, env_name, tool, arguments)`` for every named bomb."""
    calls = [(label, "sqlite", "query", {"sql": sql}) for label, sql in SQL_BOMBS.items()]
    calls += [(label, "calculator", "calculator", {"expression": e}) for label, e in CALC_BOMBS.items()]
    calls += [
        ("convert huge value", "calculator", "convert", {"value": 10**5000, "from_unit": "km", "to_unit": "mm"}),
        ("convert long unit", "calculator", "convert", {"value": 1, "from_unit": "k" * 9_000, "to_unit": "m"}),
    ]
    calls += [(label, "jsonnav", tool, args) for label, (tool, args) in JSONNAV_BOMBS.items()]
    return calls


_NUMBERS = ["0", "1", "-1", "7", "255", "1000", "4900", "99999", "1000000", "2147483647", "2147483648",
            "9223372036854775807", "-9223372036854775808", "1e308", "0.5", "'2000000000'", "NULL"]  # fmt: skip
_SQL_VALUES = ["name", "city", "amount", "'x'", "'%a%'", "'[a-z]*'", "x'00ff'", "hex(zeroblob(100))", _A]
_SQL_FUNCS = [
    "printf('%{w}c', {v})", "printf('%.{w}c', {v})", "printf('%.*c', {n}, {v})", "format('%{w}s', {v})",
    "zeroblob({n})", "randomblob({n})", "hex(randomblob({n}))", "replace({v}, 'a', {v})", "upper({v})",
    "instr({v}, {v})", "({v} LIKE {v})", "({v} GLOB {v})", "trim({v}, {v})", "substr({v}, {n}, {n})",
    "length({v})", "quote({v})", "json_array({v}, {v})", "json_extract({v}, '$.a')", "abs({n})",
    "char({n})", "unicode({v})", "group_concat({v})", "{v} || {v}", "{n} * {n}", "{n} / {n}", "{n} % {n}",
]  # fmt: skip
_SQL_SHAPES = [
    "SELECT {e}", "SELECT {e} FROM customers", "SELECT {e} FROM orders a, orders b",
    "SELECT {e} FROM orders a, orders b, orders c", "SELECT {e} FROM customers ORDER BY {e}",
    "SELECT DISTINCT {e} FROM orders", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c "
    "LIMIT {n}) SELECT {e} FROM c", "SELECT {e}; DROP TABLE orders", "{e}", "DELETE FROM orders WHERE {e}",
    "PRAGMA {e}", "ATTACH {e} AS x",
]  # fmt: skip
_CALC_TOKENS = ["1", "9", "0", "0.5", "1e15", "1e-300", "1e308", "10**15", "64", "65", "-", "+", "*", "/",
                "//", "%", "**", "^", "(", ")", "sqrt(", "round(", "max(", "abs(", ",", "x", "'a'", "!",
                "__import__", "lambda", "[", "]", "1_000", "0x10", "1j", "nan", "inf"]  # fmt: skip
_UNITS = ["km", "m", "cm", "mm", "kg", "g", "mg", "h", "min", "s", "ms", "c", "f", "k", "°C", "", "KM ", "x"]
_JSON_PARTS = ["people", "items", "cities", "name", "age", "city", "0", "-1", "00", "1e3", "²", "",
               "__class__", "price", "country", "population", "p" + "9" * 40]  # fmt: skip
_NOISE = ["", "\x00", "\ud800", "🙂" * 3, "'", '"', ";", "--", "/*", "\n", " " * 50, "%" * 20]


def _sql_expr(rng: random.Random, depth: int = 0) -> str:
    fn = rng.choice(_SQL_FUNCS)
    parts = {
        "w": rng.choice(["1", "10", "999", "1000", "1001", "99999", "2000000000", "4294967297"]),
        "n": rng.choice(_NUMBERS),
    }
    out = ""
    for i, piece in enumerate(fn.split("{")):
        if i == 0:
            out += piece
            continue
        key, rest = piece[0], piece[2:]
        if key == "v":  # each value drawn anew, sometimes a nested call
            nested = depth < 2 and rng.random() < 0.3
            out += (_sql_expr(rng, depth + 1) if nested else rng.choice(_SQL_VALUES)) + rest
        else:
            out += parts[key] + rest
    return out


def _sql_call(rng: random.Random) -> dict[str, Any]:
    shape = rng.choice(_SQL_SHAPES)
    sql = shape.replace("{e}", _sql_expr(rng)).replace("{n}", str(rng.choice([10, 1000, 100000])))
    if rng.random() < 0.1:
        sql += rng.choice(_NOISE)
    return {"sql": sql}


def _calc_call(rng: random.Random) -> tuple[str, dict[str, Any]]:
    if rng.random() < 0.2:
        value = rng.choice([0, -1, 1.5, 1e15, 1e16, 1e308, -1e308, 10**30, 2**63, 1e-320])
        return "convert", {"value": value, "from_unit": rng.choice(_UNITS), "to_unit": rng.choice(_UNITS)}
    size = rng.choice([1, 3, 8, 20, 60, 120])
    expr = " ".join(rng.choice(_CALC_TOKENS) for _ in range(size))
    if rng.random() < 0.05:
        expr = expr * rng.choice([10, 1000])
    return "calculator", {"expression": expr}


def _jsonnav_call(rng: random.Random) -> tuple[str, dict[str, Any]]:
    tool = rng.choice(["get", "keys", "find"])
    path = ".".join(rng.choice(_JSON_PARTS) for _ in range(rng.choice([0, 1, 2, 3, 5, 40])))
    if rng.random() < 0.05:
        path = path * 5_000
    if tool == "find":
        return tool, {"key": rng.choice(_JSON_PARTS + _NOISE)}
    return tool, {"path": path + rng.choice(["", "", "", *_NOISE])}


def _malformed(rng: random.Random, env_name: str) -> tuple[str, Any]:
    tool = {"sqlite": "query", "calculator": "calculator", "jsonnav": "get"}[env_name]
    return rng.choice([
        (tool, None), (tool, []), (tool, {"sql": 1, "expression": 1, "path": 1}), (tool, {"nope": 1}),
        ("no_such_tool", {}), (None, {}), (tool * 10_000, {}), (tool, {"x" * 10_000: 1}),
        (tool, {"sql": ["SELECT 1"]}), (tool, {"expression": None}), (tool, {"path": {"a": 1}}),
    ])  # fmt: skip


def fuzz_calls(n: int, seed: int = 0) -> list[tuple[str, str, Any]]:
    """``n`` seeded hostile calls ``(env_name, tool, arguments)``, round-robin over environments."""
    rng = random.Random(f"hostile-calls:{seed}")
    calls = []
    for i in range(n):
        env_name = ENVIRONMENTS[i % len(ENVIRONMENTS)]
        if rng.random() < 0.1:
            tool, args = _malformed(rng, env_name)
        elif env_name == "sqlite":
            tool, args = "query", _sql_call(rng)
        elif env_name == "calculator":
            tool, args = _calc_call(rng)
        else:
            tool, args = _jsonnav_call(rng)
        calls.append((env_name, tool, args))
    return calls


def live_environments() -> dict[str, Any]:
    """One reset instance of each built-in environment, on a fixed train task."""
    envs = {}
    for name in ENVIRONMENTS:
        env = get_environment(name)
        env.reset(make_tasks(name, "train", 1, "hard", split_seed=0)[0])
        envs[name] = env
    return envs


def run_call(env: Any, tool: Any, arguments: Any) -> tuple[float, str]:
    """Seconds taken and the result of ``env.step(tool, arguments)``."""
    start = time.perf_counter()
    result = env.step(tool, arguments)
    return time.perf_counter() - start, result
