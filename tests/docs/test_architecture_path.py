"""docs/architecture.md names the functions one scored position passes through; they exist.

The page's numbered list under "The path, function by function" is the route a reader
follows with the code open: each item opens with a ``module.function`` name (relative to
``miniverl``). A function renamed, moved or removed without the page following it
fails here, naming the item. Each name must be *defined* in the module it is listed
under (not merely imported there), so the page's module count is the count of the
modules the path really crosses; that count is checked against the page's sentence, and
no two of those modules may share a base name.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
SECTION = "## The path, function by function"
ITEM = re.compile(r"^\d+\. `([A-Za-z_][\w.]*)`")
COUNTS = re.compile(r"These are (\d+) calls of (\d+) functions in (\d+) modules")


def path_names(text: str) -> list[str]:
    """The ``module.function`` names of the section's numbered items, in page order."""
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    body = text[start:] if end < 0 else text[start:end]
    return [m[1] for line in body.splitlines() if (m := ITEM.match(line.strip()))]


def resolve(name: str) -> tuple[str, object]:
    """``(module, object)`` for ``name``: the longest importable ``miniverl.`` prefix, then
    attributes. Raises LookupError naming what is missing or defined elsewhere."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module_name = "miniverl." + ".".join(parts[:i])
        try:
            obj: object = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                continue  # this prefix is not a module; try a shorter one
            raise
        break
    else:
        raise LookupError(f"{name}: no module of miniverl is a prefix of it")
    owner = obj
    for attr in parts[i:]:
        if not hasattr(owner, attr):
            raise LookupError(f"{name}: {module_name} has no {'.'.join(parts[i:])}")
        owner = getattr(owner, attr)
    if not callable(owner):
        raise LookupError(f"{name}: not a function")
    top = getattr(obj, parts[i])
    defined_in = getattr(top, "__module__", None)
    if defined_in != module_name:
        raise LookupError(f"{name}: defined in {defined_in}, not in {module_name}")
    return module_name, owner


def test_every_function_on_the_path_exists_where_the_page_says():
    names = path_names(PAGE.read_text(encoding="utf-8"))
    assert len(names) >= 20, f"found only {len(names)} items under {SECTION!r}"
    missing = []
    for n, name in enumerate(names, 1):
        try:
            resolve(name)
        except LookupError as exc:
            missing.append(f"item {n}: {exc}")
    assert not missing, "docs/architecture.md names functions that do not exist:\n" + \
        "\n".join(missing)


def test_the_page_counts_what_it_lists():
    text = PAGE.read_text(encoding="utf-8")
    names = path_names(text)
    found = COUNTS.search(text)
    assert found, f"docs/architecture.md needs a sentence matching {COUNTS.pattern!r}"
    modules = {resolve(name)[0] for name in names}
    assert tuple(map(int, found.groups())) == (len(names), len(set(names)), len(modules))


def test_no_two_modules_on_the_path_share_a_base_name():
    # A reader who meets `link.py` or `state.py` on this path must not have to ask which.
    modules = sorted({resolve(name)[0] for name in path_names(PAGE.read_text("utf-8"))})
    by_base: dict[str, list[str]] = {}
    for module in modules:
        by_base.setdefault(module.rsplit(".", 1)[1], []).append(module)
    shared = {base: mods for base, mods in by_base.items() if len(mods) > 1}
    assert not shared, f"modules on the path that share a base name: {shared}"


def test_the_resolver_refuses_what_is_not_there():
    # Guards the check: a missing name, a name imported from elsewhere and a non-function
    # are each refused.
    assert inspect.isfunction(resolve("common.trajectory.select_positions")[1])
    with pytest.raises(LookupError, match="has no"):
        resolve("common.trajectory.no_such_function")
    with pytest.raises(LookupError, match="defined in"):
        resolve("common.trajectory.Counter")
    with pytest.raises(LookupError, match="not a function"):
        resolve("protocol.limits.MAX_HEADER_BYTES")
