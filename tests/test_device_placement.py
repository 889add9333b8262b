"""Tensor factories on the update, scoring and sampling paths place their tensors on the
model's device (docs/gpu.md, "Tests that catch CUDA faults on a CPU").

On the CPU every tensor is on the one device, so a ``torch.zeros(...)`` that forgets
``device=`` runs; on CUDA it meets the model's tensors and raises ("Expected all tensors
to be on the same device"). This check reads the code: each factory call on these paths
passes ``device=``, or is moved in the same expression (``torch.full(...).to(device)``,
``torch.cat([...]).to(device)``), or its line says ``# host:`` why it is built on the
host (a batch filled row by row, then moved once).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = [
    "student/train/updates.py",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "student/train/objectives").glob("*.py")),
    "teacher_server/scoring.py",
    "student/rollout/hf_engine.py",
    "common/shared_prefix.py",
]
FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "randn",
             "rand", "randint", "eye", "linspace", "from_numpy"}


def misplaced(source: str) -> list[int]:
    """Lines of factory calls that neither name a device nor are moved in their
    expression, nor carry a ``# host:`` comment."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and node.func.attr in FACTORIES):
            continue
        if any(k.arg == "device" for k in node.keywords):
            continue
        if "# host:" in lines[node.lineno - 1]:
            continue
        up: ast.AST | None = node
        moved = False
        while up is not None and not isinstance(up, ast.stmt):
            if isinstance(up, ast.Call) and isinstance(up.func, ast.Attribute) \
                    and up.func.attr == "to":
                moved = True
                break
            up = parents.get(up)
        if not moved:
            found.append(node.lineno)
    return found


def test_the_check_finds_a_factory_without_a_device():
    bad = "def f(h):\n    z = torch.zeros(3)\n    return h + z\n"
    good = ("def f(h):\n    a = torch.zeros(3, device=h.device)\n"
            "    b = torch.cat([torch.ones(2)]).to(h.device)\n"
            "    c = torch.full((2,), 1)  # host: filled then moved\n    return a, b, c\n")
    assert misplaced(bad) == [2]
    assert misplaced(good) == []


@pytest.mark.parametrize("path", PATHS)
def test_factories_place_tensors_on_the_models_device(path):
    lines = misplaced((ROOT / path).read_text())
    assert lines == [], (f"{path}: lines {lines} make a tensor on the default (CPU) device; "
                         "pass device=, move it in the same expression, or say why with "
                         "'# host:'")
