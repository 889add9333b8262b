"""``examples/testing/`` is a user's own test suite, and CI runs it as a user would.

What docs/testing.md promises: with miniverl installed, plain ``pytest`` in a project
finds the kit's fixtures (no ``conftest.py``: the ``pytest11`` entry point registers
them), and a client and a custom teacher can be tested with ``miniverl.testing`` alone.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.extras import missing

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "testing"


@pytest.mark.slow
def test_the_example_suite_passes_under_plain_pytest():
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=EXAMPLE, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "10 passed" in proc.stdout, proc.stdout[-2000:]
    assert not (EXAMPLE / "conftest.py").exists()  # the fixtures come from the plugin


def test_the_example_tests_use_only_the_public_kit():
    for test_file in sorted(EXAMPLE.glob("test_*.py")):
        tree = ast.parse(test_file.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith("tests"), f"{test_file.name} imports {name}"
                if name.startswith("miniverl"):
                    assert name == "miniverl.testing", f"{test_file.name} imports {name}"


@pytest.mark.slow
def test_the_plugin_loads_no_kit_until_a_fixture_is_used_and_every_name_resolves():
    # pytest imports the plugin in every session of every project with miniverl installed.
    code = ("import sys, miniverl.testing.plugin as p, miniverl.testing as t\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('miniverl'))\n"
            "assert loaded == ['miniverl', 'miniverl.testing', 'miniverl.testing.plugin'], loaded\n"
            "assert all(getattr(t, name) is not None for name in t.__all__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_python_blocks_of_docs_testing_run():
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    # A block under a check-only marker is a sketch with the user's own model (the docs
    # tests check its syntax); every other block runs here as written, but for one whose
    # marker names an optional module (needs=) that this install lacks.
    found = re.findall(r"(<!-- [^\n]*-->\n)?```python\n(.*?)```", text, re.S)
    blocks = [(marker, block) for marker, block in found if "<!-- check-only" not in marker]
    assert len(blocks) == 4 and len(found) == 5
    not_run = []
    for number, (marker, block) in enumerate(blocks):
        reasons = [r for r in map(missing, re.findall(r"needs=(\w+)", marker)) if r]
        if reasons:
            not_run.append(f"python block {number}: {'; '.join(reasons)}")
            continue
        exec(compile(block, f"docs/testing.md python block {number}", "exec"), {})
    if not_run:
        pytest.skip("; ".join(not_run))
