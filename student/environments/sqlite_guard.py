"""Bounds for model-written SQL: every ``query`` call ends fast with a small result.

This module locks down one in-memory sqlite connection and runs one statement on it.
sqlite calls its progress handler only *between* VM operations, at loop jumps, so the
handler alone cannot stop one expensive built-in call, nor one row that calls such a
built-in hundreds of times in straight-line code. Time and size are bounded in layers:

- an authorizer allows only SELECT, column reads, function calls and recursive CTEs;
- ``setlimit`` caps any string or blob at :data:`MAX_VALUE_BYTES` (so ``zeroblob``,
  ``randomblob``, ``replace`` expansion and ``||`` stop early), the LIKE/GLOB pattern,
  the SQL text and the result columns. The value cap also caps the work of one
  ``instr``/``replace``/``LIKE``/``GLOB`` call, which grows with the product of its
  inputs (25 s for one ``instr`` at the old 1 MB cap); the slowest call left is ~8 ms;
- those slow built-ins are replaced by versions that check the deadline before each
  call and then run sqlite's own built-in on a helper connection (same results);
- ``printf``/``format`` also refuse a width or precision over :data:`MAX_PRINTF_WIDTH`
  first: sqlite 3.40 loops over a ``%.*c`` precision even after the length cap is
  hit, so ``printf('%.*c', 2000000000, 'x')`` took 27-43 s;
- a progress handler every :data:`PROGRESS_EVERY` opcodes stops the statement past
  :data:`QUERY_SECONDS` of wall clock or :data:`MAX_VM_STEPS` steps (runaway recursive
  CTEs, cross joins, sorts); a statement overshoots its deadline by milliseconds;
- rows are fetched one at a time, and fetching stops at :data:`MAX_ROWS` rows or
  :data:`~.base.MAX_RESULT_CHARS` characters.

What this module is not: the environment (tasks, tools, verifier: ``sqlite_env.py``)
or a sandbox for arbitrary SQL on a file database. ``Connection.setlimit`` needs
Python 3.11; on older Pythons :func:`locked_connection` refuses with a ConfigError rather
than run unbounded queries. This module is torch-free.
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
from typing import Any

from miniverl.common.errors import ConfigError

from .base import MAX_RESULT_CHARS, format_number

QUERY_SECONDS = 0.25  # wall clock per statement; honest queries here take ~1 ms
MAX_VM_STEPS = 2_000_000  # far above any honest query on these tables
PROGRESS_EVERY = 100  # opcodes between checks; a Python call each, so not too few
MAX_VALUE_BYTES = 10_000  # any string or blob; results are cut at 2,000 chars anyway
MAX_SQL_CHARS = 4_000  # 15x the longest oracle query; also caps calls per row
MAX_LIKE_PATTERN_BYTES = 100  # a GLOB of [a-z] classes costs ~value x pattern
MAX_COLUMNS = 100
MAX_PRINTF_WIDTH = 1_000
MAX_ROWS = 50

_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
# Recursive CTEs are allowed on purpose: the step and time limits, not the authorizer, end them.
_ALLOWED.add(getattr(sqlite3, "SQLITE_RECURSIVE", 33))
# Built-ins whose one call costs up to ~2-8 ms under the caps (work ~ product of their
# input sizes): a row of 300 GLOBs ran 5.7 s past a 0.5 s deadline before they were
# wrapped. Every other built-in measured under 0.2 ms per call and stays native.
_SLOW_BUILTINS = (
    ("like", 2), ("like", 3), ("glob", 2), ("instr", 2), ("replace", 3),
    ("trim", 2), ("ltrim", 2), ("rtrim", 2),
)  # fmt: skip
_HAS_SETLIMIT = hasattr(sqlite3.Connection, "setlimit")  # Python >= 3.11


def _authorizer(action: int, arg1, arg2, db_name, trigger) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


class Guard:
    """Per-connection state: why the running statement was stopped, and its budget."""

    def __init__(self) -> None:
        self.refusal: str | None = None
        self.deadline = math.inf  # no clock outside run_query (trusted SQL, e.g. task answers)
        self.calls = 0
        self.helper: sqlite3.Connection | None = None

    def start(self) -> None:
        self.refusal, self.calls = None, 0
        self.deadline = time.monotonic() + QUERY_SECONDS

    def check_clock(self) -> None:
        """Raise once the statement is past its deadline (called inside wrapped functions)."""
        if time.monotonic() > self.deadline:
            self.refusal = f"query stopped: over the {QUERY_SECONDS:g} s time limit"
            raise TimeoutError(self.refusal)

    def progress(self) -> int:
        """sqlite's progress callback: non-zero stops the statement."""
        self.calls += 1
        if self.calls * PROGRESS_EVERY > MAX_VM_STEPS:
            self.refusal = f"query stopped: too many steps (over {MAX_VM_STEPS:,} VM steps)"
            return 1
        if time.monotonic() > self.deadline:
            self.refusal = f"query stopped: over the {QUERY_SECONDS:g} s time limit"
            return 1
        return 0


class GuardedConnection(sqlite3.Connection):
    """A ``sqlite3.Connection`` carrying its :class:`Guard`; closing it closes the helper."""

    guard: Guard

    def close(self) -> None:
        helper = getattr(getattr(self, "guard", None), "helper", None)
        if helper is not None:
            helper.close()
        super().close()


# sqlite's printf grammar (printf.c): flags, width (digits or *), .precision, l/ll, type.
_SPEC_RE = re.compile(r"%([-+ #!0,]*)(\*|[1-9][0-9]*)?(?:\.(\*|[0-9]*))?(?:ll?)?(.?)", re.S)
_NUMERIC_PREFIX_RE = re.compile(r"\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_TAKES_ARG = set("dsgzqQwcoxXfeEGiupr")  # %% and %n take none; anything else stops sqlite


def _as_int(value: Any) -> float:
    """The magnitude sqlite would read as a ``*`` width (conservative: the larger reading)."""
    if value is None:
        return 0
    if isinstance(value, int | float):
        return abs(value)
    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    match = _NUMERIC_PREFIX_RE.match(text)
    return abs(float(match.group())) if match else 0


def printf_problem(fmt: Any, args: tuple) -> str | None:
    """Why sqlite's ``printf(fmt, *args)`` would be too costly, or None if it is bounded."""
    if fmt is None or isinstance(fmt, int | float):
        return None
    text = fmt.decode("utf-8", "replace") if isinstance(fmt, bytes) else str(fmt)
    next_arg = 0
    for match in _SPEC_RE.finditer(text):
        _flags, width, precision, kind = match.groups()
        for field in (width, precision):
            if field == "*":
                size = _as_int(args[next_arg]) if next_arg < len(args) else 0
                next_arg += 1
            else:
                size = int(field) if field else 0
            if size > MAX_PRINTF_WIDTH:
                return (
                    f"printf width or precision {format_number(size)} is over {MAX_PRINTF_WIDTH}; "
                    "results are cut at 2,000 characters anyway"
                )
        if kind in _TAKES_ARG:
            next_arg += 1
        elif kind not in ("%", "n"):
            return None  # sqlite stops formatting at an unknown type
    return None


def _delegate(guard: Guard, name: str, check=None):
    """``name`` with the deadline checked first, run by sqlite's own built-in on the helper."""

    def call(*args: Any) -> Any:
        guard.check_clock()
        problem = check(args) if check else None
        if problem:
            guard.refusal = problem
            raise ValueError(problem)
        try:
            sql = f"SELECT {name}({', '.join('?' * len(args))})"
            return guard.helper.execute(sql, args).fetchone()[0]
        except sqlite3.Error as exc:
            guard.refusal = f"{name}: {exc}"
            raise

    return call


def _printf_args_problem(args: tuple) -> str | None:
    return printf_problem(args[0], args[1:]) if args else None


def _set_limits(conn: sqlite3.Connection) -> None:
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_LIKE_PATTERN_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, MAX_COLUMNS)


def require_setlimit() -> None:
    """Refuse to run model-written SQL where sqlite's size limits cannot be set."""
    if not _HAS_SETLIMIT:
        raise ConfigError(
            "the sqlite environment needs Python 3.11 or newer: it bounds model-written "
            "queries with sqlite3.Connection.setlimit; run on Python >= 3.11 or pick another "
            "environment"
        )


def locked_connection(schema: str, rows: dict[str, list[list]]) -> GuardedConnection:
    """A fresh in-memory database: ``schema`` run, ``rows`` inserted per table, locked down."""
    require_setlimit()
    conn = sqlite3.connect(":memory:", check_same_thread=False, factory=GuardedConnection)
    conn.executescript(schema)
    for table, values in rows.items():
        if values:
            marks = ", ".join("?" * len(values[0]))
            conn.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
    conn.commit()
    conn.execute("PRAGMA query_only = ON")
    _set_limits(conn)
    guard = Guard()
    guard.helper = sqlite3.connect(":memory:", check_same_thread=False)
    _set_limits(guard.helper)
    conn.guard = guard
    # The closures hold the guard, not the connection: no reference cycle through sqlite.
    for name in ("printf", "format"):
        conn.create_function(name, -1, _delegate(guard, name, _printf_args_problem))
    for name, nargs in _SLOW_BUILTINS:
        conn.create_function(name, nargs, _delegate(guard, name))
    conn.set_authorizer(_authorizer)
    return conn


def run_query(conn: sqlite3.Connection, sql: str) -> str:
    """Run one read-only statement; raises ``sqlite3.Error`` on refusal or a limit."""
    guard = getattr(conn, "guard", None) or Guard()
    guard.start()
    conn.set_progress_handler(guard.progress, PROGRESS_EVERY)
    try:
        try:
            cursor = conn.execute(sql)
            header = [d[0] for d in cursor.description or []]
            lines = [" | ".join(header)]
            size, more = len(lines[0]), False
            while header and size <= MAX_RESULT_CHARS:
                row = cursor.fetchone()
                if row is None:
                    break
                if len(lines) > MAX_ROWS:
                    more = True
                    break
                lines.append(" | ".join(_cell(v) for v in row))
                size += len(lines[-1]) + 1
        except sqlite3.Error as exc:
            if guard.refusal:
                raise sqlite3.OperationalError(guard.refusal) from None
            if "not authorized" in str(exc):
                raise sqlite3.OperationalError("not authorized: only SELECT queries are allowed") from None
            raise
    finally:
        conn.set_progress_handler(None, 0)
        guard.deadline = math.inf
    if not header:
        return "(no result)"
    if more:
        lines.append(f"... more than {MAX_ROWS} rows; add LIMIT or aggregate")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int | float):
        return format_number(value)
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)[: MAX_RESULT_CHARS + 1]
