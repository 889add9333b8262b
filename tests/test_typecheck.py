"""The type checker runs in CI, over the packages it names, and can fail.

What a contributor relies on: the Protocols and typed seams are held to by mypy on every
CI run (``.ci/run`` calls ``.ci/typecheck``), so the check cannot stop running unseen: a
``.ci/run`` without it, a package dropped from it, or a configuration that reports
nothing fails here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "typecheck"
CHECKED = ("miniverl.common", "miniverl.protocol", "miniverl.student.train")


def mypy_sections(pyproject: str) -> list[str]:
    """pyproject.toml's ``[tool.mypy]`` table and its ``[[tool.mypy.overrides]]``, each
    from its header to the next table's."""
    tables = re.split(r"^(?=\[)", pyproject, flags=re.M)
    return [t for t in tables if t.startswith(("[tool.mypy]", "[[tool.mypy."))]


def test_ci_runs_the_type_checker_before_the_suite():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "bash .ci/typecheck" in lines
    assert lines.index("bash .ci/typecheck") < next(
        i for i, ln in enumerate(lines) if ln.startswith("pytest -q"))


def test_the_checked_packages_and_the_configuration_are_in_place():
    script = SCRIPT.read_text(encoding="utf-8")
    (default,) = [ln.strip() for ln in script.splitlines() if ln.strip().startswith("set -- ")]
    assert [w for w in default.split() if w.startswith("miniverl.")] == list(CHECKED)
    sections = mypy_sections((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert sections[0].startswith("[tool.mypy]"), sections
    # A setting that silences errors makes the check report less than it says: no module
    # of the project is excused (overrides name third-party libraries only), no error is
    # ignored or disabled, and a `# type: ignore` that is no longer needed is an error.
    for section in sections:
        assert not re.search(r"^\s*(ignore_errors|disable_error_code)\s*=", section, re.M), section
        modules = re.search(r"^module\s*=\s*(\[.*?\]|\".*?\")", section, re.M | re.S)
        named = re.findall(r'"([\w.*]+)"', modules[1]) if modules else []
        assert not [m for m in named if m.split(".")[0] in ("miniverl", "*")], section
    assert re.search(r"^warn_unused_ignores\s*=\s*true", sections[0], re.M)


@pytest.mark.slow
def test_a_type_error_fails_the_check(tmp_path):
    if shutil.which("mypy") is None:
        pytest.skip("mypy is not installed; it comes with the dev extra: "
                    'pip install -e ".[dev]"')
    bad = tmp_path / "bad.py"
    bad.write_text("def half(n: int) -> int:\n    return n / 2\n", encoding="utf-8")
    proc = subprocess.run(["bash", str(SCRIPT), str(bad)], capture_output=True, text=True,
                          timeout=300, env={"MYPY_CACHE_DIR": str(tmp_path / "cache"),
                                            "PATH": str(Path(shutil.which("mypy")).parent)
                                            + ":/usr/bin:/bin"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "bad.py:2: error: Incompatible return value type" in proc.stdout, proc.stdout
