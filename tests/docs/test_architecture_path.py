"""docs/architecture.md's reading path is what one strict OPD update runs, in its order.

The page opens with the files a reader opens to follow one update ("The reading path")
and ends with the functions it runs ("The path, function by function"), in three lists:
the student's update, the wire and the teacher. ``update_path.record_update`` trains a
toy student two strict OPD updates against the real teacher server (in process) with
every call recorded; the second update is compared with the page:

- every function of the page's files that ran on the training thread is on the
  student's list, and the list is in the order of their first calls (a function added,
  removed, renamed or reordered on the path fails here, naming it);
- the student's list names no function that did not run, and its other items (from
  files off the reading path) run in the order given;
- the files are listed in the order the update first enters them;
- the wire's and the teacher's lists run, each in the order given, on their threads.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.update_path import record_update

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
FILE = re.compile(r"^\d+\. `([\w/]+\.py)`")
ITEM = re.compile(r"^\d+\. `([A-Za-z_][\w.]*)`")
LISTS = {"student": "### The student's update", "client": "### The wire",
         "teacher": "### The teacher"}


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = min((i for i in (text.find("\n## ", start + 1), text.find("\n### ", start + 1))
               if i >= 0), default=len(text))
    return text[start:end]


def reading_files(text: str) -> list[str]:
    """The module names (``student.train.steps``) of the files under "The reading path"."""
    body = _section(text, "## The reading path")
    paths = [m[1] for line in body.splitlines() if (m := FILE.match(line.strip()))]
    return [p.removesuffix(".py").replace("/", ".") for p in paths]


def page_lists(text: str) -> dict[str, list[str]]:
    """Each list's ``module.function`` names, in page order."""
    return {role: [m[1] for line in _section(text, heading).splitlines()
                   if (m := ITEM.match(line.strip()))]
            for role, heading in LISTS.items()}


def module_of(name: str, modules: list[str]) -> str | None:
    return next((m for m in modules if name.startswith(m + ".")), None)


def out_of_order(page: list[str], ran: list[str]) -> list[str]:
    """The page's items that did not run, or ran before an item the page puts first."""
    rank = {name: i for i, name in enumerate(ran)}
    problems, last = [], -1
    for n, name in enumerate(page, 1):
        if name not in rank:
            problems.append(f"item {n} {name}: did not run")
        elif rank[name] < last:
            problems.append(f"item {n} {name}: first ran before the item above it")
        else:
            last = rank[name]
    return problems


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, list[str]]:
    return record_update(tmp_path_factory.mktemp("update"))


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


@pytest.mark.slow
def test_every_function_of_the_reading_path_files_is_listed_in_the_order_it_ran(ran, page):
    files = reading_files(page)
    assert len(files) >= 5, f"found only {len(files)} files under 'The reading path'"
    listed = page_lists(page)["student"]
    on_path = [name for name in ran["student"] if module_of(name, files)]
    mine = [name for name in listed if module_of(name, files)]
    missing = [name for name in on_path if name not in mine]
    assert not missing, ("functions of the reading path's files that ran in the update "
                         "but are not on the page's student list:\n" + "\n".join(missing))
    assert mine == on_path, "the page's order is not the order they first ran:\n" + \
        "\n".join(f"{a}  |  ran: {b}" for a, b in zip(mine, on_path, strict=False) if a != b)


@pytest.mark.slow
def test_each_list_ran_in_the_order_the_page_gives(ran, page):
    problems = []
    for role, names in page_lists(page).items():
        assert len(names) >= 10, f"found only {len(names)} items under {LISTS[role]!r}"
        problems += [f"{LISTS[role]}: {p}" for p in out_of_order(names, ran[role])]
    assert not problems, "docs/architecture.md's path differs from what ran:\n" + \
        "\n".join(problems)


@pytest.mark.slow
def test_the_files_are_listed_in_the_order_the_update_enters_them(ran, page):
    files = reading_files(page)
    entered: list[str] = []
    for name in ran["student"]:
        module = module_of(name, files)
        if module and module not in entered:
            entered.append(module)
    assert entered == files


def test_the_checks_read_the_page():
    # Guards the parsers: the page's three lists and its files are found.
    text = PAGE.read_text(encoding="utf-8")
    assert reading_files(text)[0] == "student.train.modes.opd"
    lists = page_lists(text)
    assert lists["student"][0] == "student.train.modes.opd.OpdMode.cycle"
    assert out_of_order(["a", "c", "b"], ["a", "b", "c"]) == [
        "item 3 b: first ran before the item above it"]
    assert out_of_order(["x"], ["a"]) == ["item 1 x: did not run"]
