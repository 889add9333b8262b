"""The modes are peers: none imports another, and none hands a step's product to the
next step through the shared TrainState (a step returns what it produced)."""

from __future__ import annotations

import ast
from pathlib import Path

from miniverl.student.train import loop
from miniverl.student.train.state import TrainState

TRAIN = Path(loop.__file__).resolve().parent
MODES_DIR = TRAIN / "modes"
# The cursors a checkpoint records (data_cursor) that the SFT warm-up advances.
CHECKPOINTED_CURSORS = {"warmup_end", "warmup_losses"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _state_writes(path: Path) -> set[str]:
    """Attributes assigned on a name ``state`` (``state.x = ...``, ``state.x += ...``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                   else [])
        for target in targets:
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "state"):
                out.add(target.attr)
    return out


def test_no_mode_module_imports_another_mode_module():
    modules = sorted(p for p in MODES_DIR.glob("*.py") if p.name != "__init__.py")
    assert {p.stem for p in modules} == set(loop.MODES)
    for path in modules:
        others = {f"miniverl.student.train.modes.{p.stem}" for p in modules if p != path}
        assert not (_imports(path) & (others | {"miniverl.student.train.modes"})), path.name


def test_steps_and_modes_leave_no_product_on_the_train_state():
    # Only the checkpointed warm-up cursors are assigned; everything else a step makes
    # is returned (Sampled, CycleResult) or kept in the mode's own object.
    fields = set(TrainState.__dataclass_fields__)
    for path in [TRAIN / "steps.py", *sorted(MODES_DIR.glob("*.py"))]:
        written = _state_writes(path)
        assert written <= CHECKPOINTED_CURSORS, (path.name, written - CHECKPOINTED_CURSORS)
        assert written <= fields


def test_every_mode_object_has_what_the_loop_calls():
    for name, make in loop.MODES.items():
        mode = make()
        for method in ("prepare", "resume", "cycle"):
            assert callable(getattr(mode, method, None)), (name, method)
