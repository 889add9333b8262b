"""The two tiers are one definition (tests/tiers.py) that the pages, CI and the suite share.

What a developer relies on: the fast-tier command the README shows leaves out every
slow test and nothing else, and the full command the README shows is the one CI runs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiers import FAST_COMMAND, FAST_TIER, SLOW_KINDS, SLOW_S

ROOT = Path(__file__).resolve().parents[1]
FULL_COMMAND = "pytest -q"


def _bash_blocks(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S)]


def test_the_readme_shows_the_full_and_the_fast_command_and_ci_runs_the_full_one():
    blocks = _bash_blocks(ROOT / "README.md")
    assert FULL_COMMAND in blocks and FAST_COMMAND in blocks, blocks
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    runs = [line.split("||")[0].strip() for line in ci.splitlines()
            if line.strip().startswith("pytest")]
    assert runs == [FULL_COMMAND], runs


def test_the_pages_name_the_fast_tier_as_the_suite_defines_it():
    for page in ("docs/development.md", "docs/compatibility.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        assert FAST_COMMAND in text, page
        # An older spelling of the tier (the marker list it replaced) would be a second one.
        assert "not integration and not" not in text, page
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    assert f"takes more than {SLOW_S:g} s alone" in text
    assert all(f"`{kind}`" in text for kind in SLOW_KINDS)


@pytest.mark.slow
def test_the_fast_tier_leaves_out_every_slow_kind_and_keeps_the_rest(tmp_path):
    # One module per kind of mark: a plain test, a @slow one, and one of each SLOW_KINDS.
    body = "import pytest\n\ndef test_plain():\n    pass\n\n@pytest.mark.slow\n" \
           "def test_marked():\n    pass\n"
    for kind in SLOW_KINDS:
        body += f"\n@pytest.mark.{kind}\ndef test_{kind}():\n    pass\n"
    probe = tmp_path / "test_probe_tiers.py"
    probe.write_text(body, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-n", "0", "-m", FAST_TIER, "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
         "-p", "tests.conftest", str(probe)],  # outside tests/: its conftest loaded by name
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    collected = [line.split("::")[-1] for line in proc.stdout.splitlines() if "::" in line]
    assert collected == ["test_plain"], proc.stdout[-3000:]
