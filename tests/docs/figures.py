"""Figure annotations: a number in the docs names the committed record it comes from.

A figure in ``README.md`` or ``docs/*.md`` carries an HTML comment (invisible on the
rendered page) after the sentence or table that prints it::

    oracle-state KD recovers 69.7%, ...
    <!-- figure: 69.7% = benchmarks/results/recovery_bench_256.json#arms.oracle_kd.recovery.mean @ 1307d68 -->

- ``69.7%`` is the number as the page prints it. ``%`` says the record holds a fraction
  (0.697...); any other unit (``x``, ``s``) or none says it holds the number itself. The
  record's value, rounded to as many decimals as the page prints, must be the number.
- ``benchmarks/results/recovery_bench_256.json`` is the committed record, and after
  ``#`` the path to the value: keys joined by ``.``, a list index as a number, or
  ``[key=value,key2=value2]`` for the one element of a list that has those values;
  ``*100`` at the end scales it (a fraction printed as points: ``+96.4`` for 0.964).
- ``@ 1307d68`` is the commit that recorded the measurement: the record at that commit
  holds the same value (so a rerun that changes it fails until the page is updated).

The printed number must stand in the text above the annotation, in the same section
(since the last heading). :func:`page_figures` parses a page; :func:`figure_problems`
says what is wrong with one annotation (empty: it holds).

A results table that a script prints from its record carries one annotation instead,
under the table, naming the record, the commit and the command that prints it::

    | arm | cells ok | T=1 mean [95%] | ...
    | --- | --- | --- | ...
    | sft | 5/5 | 0.950 [0.945, 0.955] | ...

    <!-- table: benchmarks/results/distill_bench_v2.json @ 21759d3 by python benchmarks/distill_report.py --record benchmarks/results/distill_bench_v2.json --table updates=32 -->

- the record is a committed JSON under ``benchmarks/results/`` and the command (``python
  benchmarks/SCRIPT.py ARGS``, run from the repository root) names it among its
  arguments;
- :func:`table_problems` runs the command on the record at that commit (the record's
  path in its arguments replaced by a copy of ``git show COMMIT:RECORD``) and on the
  record as it stands, and each must print the page's table whole: the same header, the
  same rows in the same order (lines of the output that begin with ``|``). So every
  figure of the table is checked, and a rerun that changes one fails until the page is
  updated. Without history (a shallow clone) the record as it stands is read only.

A figure in a sentence keeps its own ``figure:`` annotation. :func:`page_tables` parses a
page's table annotations.

A table followed by figure annotations is a results table too: :func:`unannotated_table_figures`
names every measured-looking number in its rows (a decimal, a thousands separator, or a
unit: ``%``, ``s``, ``ms``, ``x``, ``MB``, ``MiB``) that no annotation of the table
prints; a table with a table annotation is checked whole instead. :func:`named_records`
lists the committed records a page's prose names.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
ANNOTATION = re.compile(
    r"<!--\s*figure:\s*(?P<shown>[^=]+?)\s*=\s*(?P<path>[^#\s]+)#(?P<pointer>\S+)"
    r"\s*@\s*(?P<commit>[0-9a-f]{7,40})\s*-->"
)
TABLE_ANNOTATION = re.compile(
    r"<!--\s*table:\s*(?P<path>\S+)\s*@\s*(?P<commit>[0-9a-f]{7,40})\s+by\s+"
    r"(?P<command>python\s.+?)\s*-->"
)
NUMBER = re.compile(r"^(?P<sign>[+\-\u2212]?)(?P<digits>\d[\d,]*(?:\.(?P<decimals>\d+))?)\s*(?P<unit>.*)$")
STEP = re.compile(r"\[(?P<where>[^\]]+)\]|(?P<name>[^.\[\]]+)")


class Figure(NamedTuple):
    """One annotation: where it stands, its four parts, and the section's text above it."""

    page: Path
    line: int
    shown: str  # the number as printed
    path: str  # the record
    pointer: str  # the value in it
    commit: str  # the commit that measured it
    above: str  # the section's text above the annotation, comments left out

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


def page_figures(page: Path) -> list[Figure]:
    """Every figure annotation of ``page``, with the text above it in its section."""
    figures = []
    section: list[str] = []
    in_code = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("#"):
            section = []
        for match in ANNOTATION.finditer(line):
            figures.append(Figure(page, number, match["shown"], match["path"],
                                  match["pointer"], match["commit"],
                                  "\n".join([*section, line[:match.start()]])))
        section.append(re.sub(r"<!--.*?-->", "", line))
    return figures


def resolve(record: Any, pointer: str) -> Any:
    """The value at ``pointer`` in ``record``; KeyError naming the step that fails."""
    value = record
    for step in STEP.finditer(pointer):
        if step["name"] is not None:
            name = step["name"]
            if isinstance(value, list) and name.isdigit() and int(name) < len(value):
                value = value[int(name)]
            elif isinstance(value, dict) and name in value:
                value = value[name]
            else:
                raise KeyError(f"no {name!r} at {pointer!r}")
        else:
            want = dict(cond.split("=", 1) for cond in step["where"].split(","))
            hits = [x for x in value if isinstance(x, dict)
                    and all(str(x.get(k)) == v for k, v in want.items())] \
                if isinstance(value, list) else []
            if len(hits) != 1:
                raise KeyError(f"{len(hits)} elements with {step['where']} at {pointer!r}")
            value = hits[0]
    return value


def matches(shown: str, value: Any) -> str | None:
    """Why the printed ``shown`` is not ``value`` rounded as printed (None: it is)."""
    number = NUMBER.match(shown.strip())
    if number is None:
        return f"{shown!r} is not a number with an optional unit"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"the record holds {value!r}, not a number"
    sign = "-" if number["sign"] in ("-", "\u2212") else ""  # the typeset minus too
    printed = float(sign + number["digits"].replace(",", ""))
    scale = 100.0 if number["unit"].strip() == "%" else 1.0
    decimals = len(number["decimals"] or "")
    if abs(value * scale - printed) > 0.5 * 10 ** -decimals + 1e-9:
        return f"the page prints {shown} but the record holds {value!r}"
    return None


@cache
def _record_at(commit: str, path: str) -> Any:
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        raise LookupError(shown.stderr.strip().splitlines()[-1] if shown.stderr else "git failed")
    return json.loads(shown.stdout)


def has_history() -> bool:
    """A git checkout with its history (a shallow clone or an export cannot check commits)."""
    probe = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                           capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout.strip() == "false"


def figure_problems(figure: Figure, *, check_commit: bool) -> list[str]:
    """What is wrong with one annotation: its record, its value, its sentence, its commit."""
    where = figure.where
    if not figure.path.startswith("benchmarks/results/") or not figure.path.endswith(".json"):
        return [f"{where}: {figure.path} is not a JSON under benchmarks/results/"]
    file = ROOT / figure.path
    if not file.is_file():
        return [f"{where}: {figure.path} does not exist"]
    pointer, _, factor = figure.pointer.partition("*")
    try:
        value = resolve(json.loads(file.read_text(encoding="utf-8")), pointer)
    except KeyError as exc:
        return [f"{where}: {figure.path}: {exc.args[0]}"]
    scaled = value * float(factor) if factor and isinstance(value, (int, float)) else value
    problems = []
    why = matches(figure.shown, scaled)
    if why:
        problems.append(f"{where}: {why} ({figure.path}#{figure.pointer})")
    if figure.shown not in figure.above:
        problems.append(f"{where}: {figure.shown!r} is not in the text above the annotation")
    if check_commit:
        try:
            then = resolve(_record_at(figure.commit, figure.path), pointer)
        except (LookupError, KeyError, ValueError) as exc:
            problems.append(f"{where}: {figure.path} at {figure.commit}: {exc}")
        else:
            if then != value:
                problems.append(f"{where}: {figure.path}#{figure.pointer} was {then!r} at "
                                f"{figure.commit} and is {value!r} now; name the commit that "
                                "measured the value printed")
    return problems


class TableNote(NamedTuple):
    """One table annotation: where it stands, its record, commit and command, and the
    table above it (its ``|`` lines, header and rule included)."""

    page: Path
    line: int
    path: str
    commit: str
    command: str
    rows: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{_name(self.page)}:{self.line}"


def page_tables(page: Path) -> list[TableNote]:
    """Every table annotation of ``page`` with the table right above it (one blank line
    may stand between them; no table: no rows). An example in a code block is not one."""
    lines = page.read_text(encoding="utf-8").splitlines()
    notes = []
    in_code = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else TABLE_ANNOTATION.search(line)
        if not match:
            continue
        end = i - 1
        if end >= 0 and not lines[end].strip():
            end -= 1
        start = end
        while start >= 0 and lines[start].startswith("|"):
            start -= 1
        notes.append(TableNote(page, i + 1, match["path"], match["commit"], match["command"],
                               tuple(lines[start + 1:end + 1])))
    return notes


@cache
def _text_at(commit: str, path: str) -> str:
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        raise LookupError(shown.stderr.strip().splitlines()[-1] if shown.stderr else "git failed")
    return shown.stdout


def printed_table(command: str, record: str, record_file: Path) -> list[str]:
    """The ``|`` lines ``command`` prints (from the repository root) with ``record_file``
    in place of ``record`` among its arguments; RuntimeError naming the failure."""
    words = shlex.split(command)
    words = [str(record_file) if w == record else w for w in words]
    done = subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exited {done.returncode}: {last}")
    return [line for line in done.stdout.splitlines() if line.startswith("|")]


def _first_difference(page_rows: list[str], printed: list[str]) -> str:
    for k, (mine, theirs) in enumerate(zip(page_rows, printed, strict=False)):  # lengths may differ
        if mine != theirs:
            return f"row {k + 1}: the page has {mine!r}, the command prints {theirs!r}"
    return f"the page has {len(page_rows)} lines, the command prints {len(printed)}"


def table_problems(note: TableNote, *, check_commit: bool) -> list[str]:
    """What is wrong with one table annotation: its record, its command, its table."""
    where = note.where
    if not note.path.startswith("benchmarks/results/") or not note.path.endswith(".json"):
        return [f"{where}: {note.path} is not a JSON under benchmarks/results/"]
    if not (ROOT / note.path).is_file():
        return [f"{where}: {note.path} does not exist"]
    words = shlex.split(note.command)
    script = words[1] if len(words) > 1 else ""
    if not script.startswith("benchmarks/") or not (ROOT / script).is_file():
        return [f"{where}: the command must run a script under benchmarks/ "
                f"(python benchmarks/X.py ...), got {note.command!r}"]
    if note.path not in words:
        return [f"{where}: the command does not name {note.path}; pass it the record "
                "(e.g. --record PATH) so the table can be printed from the record at the commit"]
    if not note.rows:
        return [f"{where}: no table right above the annotation"]
    sources = [("as it stands", ROOT / note.path)]
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        if check_commit:
            try:
                then = Path(tmp) / Path(note.path).name
                then.write_text(_text_at(note.commit, note.path), encoding="utf-8")
                sources.append((f"at {note.commit}", then))
            except LookupError as exc:
                problems.append(f"{where}: {note.path} at {note.commit}: {exc}")
        for label, file in sources:
            try:
                printed = printed_table(note.command, note.path, file)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                problems.append(f"{where}: {note.command} on {note.path} {label}: {exc}")
                continue
            if printed != list(note.rows):
                problems.append(f"{where}: the table is not what {note.command!r} prints from "
                                f"{note.path} {label} ({_first_difference(list(note.rows), printed)})")
    return problems


MEASURED = re.compile(r"(?<![\w.])[+\-\u2212]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+"
                      r"|\d+(?=\s?(?:%|ms\b|s\b|x\b|MB\b|MiB\b)))")
TABLE_RULE = re.compile(r"^\|[\s:|-]+\|$")
CODE_AND_LINKS = re.compile(r"`[^`]*`|\[[^\]]*\]\([^)]*\)")


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


def _digits(shown: str) -> str:
    return re.sub(r"[^\d.,]", "", shown).strip(",.")


def unannotated_table_figures(page: Path) -> list[str]:
    """Measured-looking numbers in a results table's rows that no annotation under it prints."""
    lines = page.read_text(encoding="utf-8").splitlines()
    figures = page_figures(page)
    missing, i = [], 0
    while i + 1 < len(lines):
        if not (lines[i].startswith("|") and TABLE_RULE.match(lines[i + 1].strip())):
            i += 1
            continue
        end = i + 2
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        after = end + 1 if end < len(lines) and not lines[end].strip() else end
        whole = after < len(lines) and TABLE_ANNOTATION.search(lines[after])
        while after < len(lines) and ANNOTATION.search(lines[after]):
            after += 1
        printed = set() if whole else {_digits(f.shown) for f in figures if end < f.line <= after}
        for row in range(i + 2, end) if printed else ():
            for number in MEASURED.finditer(CODE_AND_LINKS.sub("", lines[row])):
                if _digits(number.group(0)) not in printed:
                    missing.append(f"{_name(page)}:{row + 1}: "
                                   f"{number.group(0)} has no annotation under the table")
        i = end
    return missing


def named_records(page: Path) -> set[str]:
    """The ``benchmarks/results/*.json`` paths the page's prose names (code blocks left out)."""
    prose, in_code = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            prose.append(re.sub(r"<!--.*?-->", "", line))
    return set(re.findall(r"benchmarks/results/[\w/.-]+?\.json", "\n".join(prose)))
