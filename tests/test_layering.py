"""The layers of docs/design.md ("Layers"), enforced by parsing every import.

- common/ and protocol/ import no torch, transformers, peft or bitsandbytes at module
  level (they must load on the torch-free core install);
- student/ and teacher_server/ never import each other (the process boundary is the
  wire, not a Python import);
- bridge/ imports only miniverl.common and miniverl.student.environments;
- testing/ (the public test kit) imports only common, protocol and teacher_server, and
  nothing imports it (it sits on the top layer, beside cli/);
- student/environments/ is torch-free everywhere (verl reward functions import it);
- no arrow from a lower layer up to a higher one (common < protocol < student,
  teacher_server, bridge < cli);
- no import circle, counting imports inside functions and under `TYPE_CHECKING` too;
- a function-local import is for a heavy optional dependency, or (cli/, or a line
  commented "start-up") a measured start-up cost; never to hide a circle;
- no module over 800 lines (docs/design.md, "Layers": a module holds one job, whole;
  cohesion decides a split, the cap only catches a file that outgrew one job);
- `miniverl --help` and importing common/protocol do not load torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "common": "miniverl.common",
    "protocol": "miniverl.protocol",
    "teacher_server": "miniverl.teacher_server",
    "student": "miniverl.student",
    "bridge": "miniverl.bridge",
    "cli": "miniverl.cli",
    "testing": "miniverl.testing",
}
HEAVY = ("torch", "transformers", "peft", "bitsandbytes", "accelerate")
# Optional dependencies a module may import inside a function, so that the module still
# imports (and `miniverl --help` stays fast) where they are missing or slow to load.
OPTIONAL = (*HEAVY, "pyarrow", "gguf", "safetensors", "tokenizers", "huggingface_hub",
            "zmq.auth", "chromium", "httpx", "vllm")
LAYER = {"miniverl.common": 0, "miniverl.protocol": 1, "miniverl.student.environments": 1,
         "miniverl.teacher_server": 2, "miniverl.student": 2, "miniverl.bridge": 2,
         "miniverl.cli": 3, "miniverl.testing": 3}
MAX_LINES = 800


@dataclass
class Import:
    file: Path
    line: int
    module: str  # absolute dotted name
    top_level: bool  # executed at import time (not inside a function)
    annotation: bool = False  # under `if TYPE_CHECKING:`: never executed, still a dependency


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    name = ".".join([PACKAGES[parts[0]], *parts[1:]])
    return name.removesuffix(".__init__")


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rsplit(".", 1)[0]
    found: list[Import] = []

    def visit(node: ast.AST, top: bool, annotation: bool = False) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False, annotation)
            elif isinstance(child, ast.If) and _type_checking(child):
                # Never executed, so not a start-up cost or a torch import; but the
                # module still depends on what it names, so circles count it.
                visit(child, False, True)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(path, child.lineno, alias.name, top, annotation))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                # `from . import x` / `from miniverl import x` name modules in `names`.
                by_name = not child.module or mod == "miniverl"
                names = [f"{mod}.{a.name}" for a in child.names] if by_name else [mod]
                for name in names:
                    found.append(Import(path, child.lineno, name, top, annotation))
            else:
                visit(child, top, annotation)

    visit(tree, True)
    return found


def files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def where(imp: Import) -> str:
    return f"{imp.file.relative_to(ROOT)}:{imp.line} imports {imp.module}"


def heavy_imports(folder: str, *, top_level_only: bool) -> list[str]:
    """Where a module under ``folder`` imports torch & co (at module level only, if asked)."""
    return [
        where(i)
        for f in files(folder)
        for i in imports_of(f)
        if (i.top_level or not (top_level_only or i.annotation))
        and any(is_under(i.module, h) for h in HEAVY)
    ]


def imports_outside(folder: str, allowed: tuple[str, ...]) -> list[str]:
    """Where a module under ``folder`` imports a miniverl module outside ``allowed``."""
    return [
        where(i)
        for f in files(folder)
        for i in imports_of(f)
        if is_under(i.module, "miniverl") and not any(is_under(i.module, a) for a in allowed)
    ]


def test_core_layers_do_not_import_torch_at_module_level():
    bad = [*heavy_imports("common", top_level_only=True),
           *heavy_imports("protocol", top_level_only=True)]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_student_and_teacher_never_import_each_other():
    bad = [
        where(i)
        for f in files("student")
        for i in imports_of(f)
        if is_under(i.module, "miniverl.teacher_server")
    ]
    bad += [
        where(i)
        for f in files("teacher_server")
        for i in imports_of(f)
        if is_under(i.module, "miniverl.student")
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_bridge_imports_only_common_and_environments():
    allowed = ("miniverl.common", "miniverl.student.environments", "miniverl.bridge")
    bad = imports_outside("bridge", allowed) + heavy_imports("bridge", top_level_only=True)
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_the_test_kit_imports_only_the_wire_and_the_server_and_nothing_imports_it():
    allowed = ("miniverl.common", "miniverl.protocol", "miniverl.teacher_server",
               "miniverl.testing")
    bad = imports_outside("testing", allowed)
    bad += [
        where(i)
        for folder in PACKAGES
        if folder != "testing"
        for f in files(folder)
        for i in imports_of(f)
        if is_under(i.module, "miniverl.testing")
    ]
    assert not bad, "\n".join(bad)


def test_environments_are_torch_free():
    allowed = ("miniverl.common", "miniverl.student.environments")
    bad = (heavy_imports("student/environments", top_level_only=False)
           + imports_outside("student/environments", allowed))
    assert not bad, "\n".join(bad)


def test_relative_imports_resolve():
    # Guards the checker itself: a relative import must map to a real miniverl module.
    imps = imports_of(ROOT / "common" / "recipe_io.py")
    assert any(i.module == "miniverl.common.errors" for i in imps)


@pytest.mark.integration
@pytest.mark.slow
def test_help_and_core_imports_do_not_load_torch():
    core = [module_name(f) for folder in ("common", "protocol") for f in files(folder)]
    code = textwrap.dedent(
        f"""
        import importlib, sys
        from typer.testing import CliRunner
        from miniverl.cli.app import app
        result = CliRunner().invoke(app, ["--help"])
        assert result.exit_code == 0, result.output
        for name in {core!r}:
            importlib.import_module(name)
        heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
        assert not heavy, heavy
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def layer_of(module: str) -> tuple[str, int] | None:
    best = max((p for p in LAYER if is_under(module, p)), key=len, default=None)
    return None if best is None else (best, LAYER[best])


@pytest.mark.slow
def test_no_import_points_up_a_layer():
    bad = []
    for folder in PACKAGES:
        for f in files(folder):
            here = layer_of(module_name(f))
            for i in imports_of(f):
                there = layer_of(i.module)
                if here and there and there[0] != here[0] and there[1] >= here[1]:
                    bad.append(f"{where(i)} ({here[0]} may not import {there[0]})")
    assert not bad, "\n".join(bad)


def all_modules() -> dict[str, Path]:
    return {module_name(f): f for folder in PACKAGES for f in files(folder)}


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The miniverl module an import names (``a.b.Name`` -> ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for i in imports_of(path):
            target = resolve(i.module, modules)
            if target and target != name:
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_circle():
    # Guards the checker: a two-module circle through a function-local import counts.
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_imports_under_type_checking_are_dependencies(tmp_path, monkeypatch):
    # Guards the checker: an import under TYPE_CHECKING is recorded (so circles see it),
    # as neither a module-level nor a function-local import.
    pkg = tmp_path / "common"
    pkg.mkdir()
    source = pkg / "hidden.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    import miniverl.student.state\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = [i for i in imports_of(source) if i.module.startswith("miniverl")]
    assert [(i.module, i.top_level, i.annotation) for i in found] == [
        ("miniverl.student.state", False, True)]


@pytest.mark.slow
def test_no_import_circles_even_inside_functions():
    # A circle hidden by a function-local import, or by an import under TYPE_CHECKING,
    # still couples the two modules: neither can be read, tested or moved without the other.
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.slow
def test_function_local_imports_are_for_optional_dependencies_or_start_up():
    stdlib = sys.stdlib_module_names
    bad = []
    for folder in PACKAGES:
        if folder == "cli":
            continue  # command bodies import lazily so `miniverl --help` stays fast (docs/design.md)
        for f in files(folder):
            if f.parent.name == "templates":
                # Bundle payloads run inside verl's workers: a missing miniverl must
                # give a zero score there, so the import sits inside the scoring try.
                continue
            lines = f.read_text(encoding="utf-8").splitlines()
            for i in imports_of(f):
                if i.top_level or i.annotation or i.module.split(".")[0] in stdlib:
                    continue
                if any(is_under(i.module, o) for o in OPTIONAL):
                    continue
                context = " ".join(lines[max(0, i.line - 2): i.line]).lower()
                if "start-up" in context:
                    continue
                bad.append(where(i))
    assert not bad, (
        "function-local imports that are neither an optional dependency nor commented "
        "as a start-up cost:\n" + "\n".join(bad)
    )


def test_no_module_is_over_the_cap():
    # No median rule: a median rewards splitting one job into files that then write each
    # other's state. The cap catches only a module that has clearly outgrown one job.
    sizes = {f.relative_to(ROOT).as_posix(): len(f.read_text(encoding="utf-8").splitlines())
             for folder in PACKAGES for f in files(folder)}
    big = sorted(f"{name}: {n} lines" for name, n in sizes.items() if n > MAX_LINES)
    assert not big, (f"modules over {MAX_LINES} lines (split where a file holds two jobs):\n"
                     + "\n".join(big))
