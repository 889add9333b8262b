"""The tested range holds at its lower end: the fast tier of this suite passes with the
lowest versions pyproject.toml allows (tests/compat/lowest.txt).

What users rely on: `pip install miniverl[train]` on an older stack that the bounds
accept works as well as on the newest one. The venv is made by
``bash tests/compat/setup_lowest_venv.sh`` (``.ci/run`` does it); without it the
venv-backed test skips and says how to make it. The bound check needs no venv.
"""

from __future__ import annotations

import os
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.tiers import FAST_TIER

ROOT = Path(__file__).resolve().parents[2]
LOWEST = ROOT / "tests" / "compat" / "lowest.txt"
VENV = Path(os.environ.get("MINIVERL_LOWEST_VENV",
                           Path.home() / ".cache" / "miniverl" / "lowest-venv"))


def pins() -> dict[str, str]:
    out = {}
    for line in LOWEST.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[name.lower()] = version
    return out


def lower_bounds() -> dict[str, str]:
    """``{package: lowest allowed version}`` for the training stack, from the metadata."""
    found = {}
    for text in metadata.requires("miniverl") or []:
        req = Requirement(text)
        for spec in req.specifier:
            if spec.operator == ">=" and req.name.lower() in pins():
                found[req.name.lower()] = spec.version
    return found


def test_lowest_pins_are_the_lower_bounds_of_pyproject():
    # A bound nobody tests is a guess: every pinned version must be exactly the bound,
    # and every bounded training package must be pinned.
    bounds = lower_bounds()
    assert set(bounds) == set(pins()), (set(bounds), set(pins()))
    for name, version in pins().items():
        assert Version(bounds[name]) == Version(version), (name, bounds[name], version)


@pytest.mark.slow
def test_fast_tier_passes_on_the_lowest_versions():
    python = VENV / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"no lowest-versions venv at {VENV}; create it with: "
                    "bash tests/compat/setup_lowest_venv.sh")
    listed = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, sys; "
         "print('\\n'.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))", *pins()],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    installed = dict(line.lower().split("==") for line in listed)
    for name, version in pins().items():
        # The local label (+cpu) names the build, not the release.
        assert Version(installed[name]).public == Version(version).public, (name, installed[name])
    # pyproject's -n auto inside, though an outer worker runs beside it: much of the fast
    # tier waits on sockets and child processes, and on two cores one inner process took
    # about 1.8x the wall time of two for a sixth less CPU time.
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", FAST_TIER,
         "--ignore", str(ROOT / "tests" / "compat")],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
