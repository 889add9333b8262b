"""Every package folder of the project is listed in pyproject.toml.

An editable install finds a sub-package through its parent's path, so a folder
missing from ``[tool.setuptools] packages`` still imports in development and is
left out of a wheel. This test reads the list and the tree and compares them.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _configured() -> tuple[set[str], dict[str, str]]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(setuptools["packages"]), dict(setuptools["package-dir"])


def test_every_package_folder_is_listed_and_mapped():
    packages, package_dir = _configured()
    tops = {name: folder for name, folder in package_dir.items() if name.count(".") == 1}
    found: dict[str, str] = {}
    for top_name, top_folder in tops.items():
        for init in sorted((ROOT / top_folder).rglob("__init__.py")):
            folder = init.parent.relative_to(ROOT).as_posix()
            if "__pycache__" in folder:
                continue
            rest = init.parent.relative_to(ROOT / top_folder).parts
            found[".".join((top_name, *rest))] = folder
    missing = sorted(set(found) - packages)
    assert not missing, f"package folders not listed in pyproject.toml packages: {missing}"
    unmapped = sorted(name for name in found if package_dir.get(name) != found[name])
    assert not unmapped, f"packages without their folder in package-dir: {unmapped}"
    stale = sorted(packages - set(found))
    assert not stale, f"pyproject.toml lists packages with no folder: {stale}"
