"""The layers of DESIGN §1, enforced by parsing every import.

- common/ and protocol/ import no torch, transformers, peft or bitsandbytes at module
  level (they must load on the torch-free core install);
- student/ and teacher_server/ never import each other (the process boundary is the
  wire, not a Python import);
- bridge/ imports only miniverl.common and miniverl.student.environments;
- student/environments/ is torch-free everywhere (verl reward functions import it);
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
}
HEAVY = ("torch", "transformers", "peft", "bitsandbytes", "accelerate")


@dataclass
class Import:
    file: Path
    line: int
    module: str  # absolute dotted name
    top_level: bool  # executed at import time (not inside a function)


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

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            elif isinstance(child, ast.If) and _type_checking(child):
                continue  # annotations only; never executed
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(path, child.lineno, alias.name, top))
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
                    found.append(Import(path, child.lineno, name, top))
            else:
                visit(child, top)

    visit(tree, True)
    return found


def files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def where(imp: Import) -> str:
    return f"{imp.file.relative_to(ROOT)}:{imp.line} imports {imp.module}"


def test_core_layers_do_not_import_torch_at_module_level():
    bad = [
        where(i)
        for folder in ("common", "protocol")
        for f in files(folder)
        for i in imports_of(f)
        if i.top_level and any(is_under(i.module, h) for h in HEAVY)
    ]
    assert not bad, "\n".join(bad)


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


def test_bridge_imports_only_common_and_environments():
    allowed = ("miniverl.common", "miniverl.student.environments", "miniverl.bridge")
    bad = [
        where(i)
        for f in files("bridge")
        for i in imports_of(f)
        if is_under(i.module, "miniverl") and not any(is_under(i.module, a) for a in allowed)
    ]
    bad += [
        where(i)
        for f in files("bridge")
        for i in imports_of(f)
        if i.top_level and any(is_under(i.module, h) for h in HEAVY)
    ]
    assert not bad, "\n".join(bad)


def test_environments_are_torch_free():
    allowed = ("miniverl.common", "miniverl.student.environments")
    bad = [
        where(i)
        for f in files("student/environments")
        for i in imports_of(f)
        if any(is_under(i.module, h) for h in HEAVY)
        or (is_under(i.module, "miniverl") and not any(is_under(i.module, a) for a in allowed))
    ]
    assert not bad, "\n".join(bad)


def test_relative_imports_resolve():
    # Guards the checker itself: a relative import must map to a real miniverl module.
    imps = imports_of(ROOT / "common" / "recipe_io.py")
    assert any(i.module == "miniverl.common.errors" for i in imps)


@pytest.mark.integration
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
