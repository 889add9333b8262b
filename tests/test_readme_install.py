"""CI proves the README's install line alone, before it installs any extra.

What a newcomer relies on: the README's install, then its test command, passes on a
fresh machine. CI installs every extra for the full suite, so it would not see a test or
a doc block that assumes one; ``.ci/readme-install`` runs the fast tier and the docs tests
in a fresh venv holding only the README's install, and ``.ci/run`` calls it first.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "readme-install"


def readme_install_line() -> str:
    """The README's install line, less the command that follows it (``&& miniverl demo``)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("pip install torch")]
    return line.split(" && miniverl")[0]


def test_the_readme_venv_installs_exactly_the_readme_line_in_a_fresh_venv():
    script = SCRIPT.read_text(encoding="utf-8")
    commands = [ln.strip() for ln in script.splitlines()
                if ln.strip() and not ln.strip().startswith("#")]
    installs = [ln for ln in commands if "pip install" in ln]
    assert installs == [readme_install_line()], installs
    venvs = [ln for ln in commands if " -m venv " in ln]
    # A venv that sees the system's packages would see the extras CI installs.
    assert len(venvs) == 1 and "--system-site-packages" not in venvs[0], venvs
    assert 'python -m pytest -q -p no:cacheprovider -m "not slow"' in commands
    assert any(ln.startswith("python -m pytest") and "tests/docs" in ln for ln in commands)


def test_ci_runs_the_readme_venv_before_it_installs_anything_else():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    steps = [i for i, ln in enumerate(ci) if re.match(r"\s*(bash \.ci/readme-install|pip )", ln)]
    assert ci[steps[0]].strip().startswith("bash .ci/readme-install"), ci[steps[0]]
    assert any("readme_status" in ln and "exit" not in ln for ln in ci[steps[0]:])
    assert any(ln.strip() == 'if [ "$readme_status" -ne 0 ]; then' for ln in ci)
