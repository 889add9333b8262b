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

A table followed by annotations is a results table: :func:`unannotated_table_figures`
names every measured-looking number in its rows (a decimal, a thousands separator, or a
unit: ``%``, ``s``, ``ms``, ``x``, ``MB``, ``MiB``) that no annotation of the table
prints. :func:`named_records` lists the committed records a page's prose names.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
ANNOTATION = re.compile(
    r"<!--\s*figure:\s*(?P<shown>[^=]+?)\s*=\s*(?P<path>[^#\s]+)#(?P<pointer>\S+)"
    r"\s*@\s*(?P<commit>[0-9a-f]{7,40})\s*-->"
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
        while after < len(lines) and ANNOTATION.search(lines[after]):
            after += 1
        printed = {_digits(f.shown) for f in figures if end < f.line <= after}
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
