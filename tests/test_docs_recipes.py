"""docs/recipes.md lists every shipped recipe with what it does and the command that runs
it: a recipe added to ``recipes/`` without a row there fails here (the page listed 2 of 6)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| `(recipes/[^`]+\.yaml)` \| (.+?) \| `(miniverl [^`]+)` \|$")


def _rows() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    return {m[1]: (m[2], m[3]) for m in map(ROW.match, text.splitlines()) if m}


def _opening_command(recipe: Path) -> str:
    """The command a recipe's first line names (``# miniverl up recipes/x.yaml  ...``)."""
    first = recipe.read_text(encoding="utf-8").splitlines()[0]
    return re.split(r"\s{2,}|\s\(", first.removeprefix("# ").strip())[0]


def test_every_recipe_file_is_listed_with_its_command():
    rows = _rows()
    shipped = sorted(f"recipes/{p.name}" for p in (ROOT / "recipes").glob("*.y*ml"))
    assert shipped, "no recipes found"
    missing = [name for name in shipped if name not in rows]
    assert not missing, f"add a row to docs/recipes.md for: {', '.join(missing)}"
    for name in shipped:
        what, command = rows[name]
        assert len(what) > 20, (name, what)  # says what it does, not just a name
        assert command == _opening_command(ROOT / name), (name, command)


def test_every_listed_recipe_exists():
    stale = [name for name in _rows() if not (ROOT / name).is_file()]
    assert not stale, f"docs/recipes.md lists recipes that do not exist: {stale}"
