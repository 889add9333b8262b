"""Where a recipe's paths lead: every file or folder a recipe reads resolves from the
recipe's own folder (docs/recipes.md, "Paths").

The paths a recipe reads are its model directories (``student.model.path``, a launched
teacher's ``model.path``), its adapters (``teacher.adapter``, ``teacher.adapters``, and
each of ``teachers:``'s), its teacher preparations (``prepare:``), a remote teacher's
CURVE key files (``curve_secret_key``, ``curve_server_key``) and offline KD's
``train.trajectories``. ``prepare:`` always resolved from the recipe's folder, the others
from the current directory: the same recipe meant two things depending on where it was
run (issue 53).
:func:`anchor_paths` makes the relative ones absolute against the recipe's folder when
the recipe is loaded from a file (``load_recipe``), so every reader of a loaded recipe
sees one meaning; :func:`path_problems` is what ``miniverl validate`` checks of each
(it exists, it is a folder, it holds a model config or an adapter config; a
preparation, a key file and the trajectories are files), one line per path, before any
process or folder exists.

Left as written: an engine teacher's ``model.path`` (the served model's name, not a
path), a hub id (``adapter`` with ``adapter_revision``, ``ORG/NAME@<40-hex>`` among
``adapters``), ``run.output_dir`` and ``cache.dir`` (where a run writes: the current
directory, as every command's output folder). A recipe given as text
(``loads_recipe``) has no folder: its paths are read from the current directory.

This module loads no weights and reads no YAML.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
PINNED_HUB_ADAPTER = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+@[0-9a-f]{40}$")
MODEL_CONFIG = "config.json"
# A remote teacher's CURVE key files (``miniverl teacher keys``).
CURVE_KEYS = ("curve_secret_key", "curve_server_key")
ADAPTER_CONFIG = "adapter_config.json"


def _is_engine(section: Any) -> bool:
    endpoint = section.endpoint or ""
    return endpoint.startswith(("http://", "https://"))


def _teacher_sections(recipe: Any) -> Iterator[tuple[str, Any]]:
    if recipe.teacher is not None:
        yield "teacher", recipe.teacher
    for name, section in (recipe.teachers or {}).items():
        yield f"teachers.{name}", section


def _hub_adapter(section: Any, ref: str) -> bool:
    return section.adapter_revision is not None and HUB_ID.match(ref) is not None


def anchored(base: Path, value: str) -> str:
    """``value`` as written when absolute (``~`` expanded), else under ``base``."""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else base / path)


def anchor_paths(recipe: Any, base: Path) -> Any:
    """``recipe`` with every relative path it reads made absolute against ``base`` (the
    recipe's folder); ``prepare:`` is kept as written (its readers resolve it from the
    same folder) so a shipped recipe keeps its digest."""
    base = Path(base).resolve()
    update: dict[str, Any] = {}
    student = recipe.student
    if student.model.path is not None:
        update["student"] = student.model_copy(update={"model": student.model.model_copy(
            update={"path": anchored(base, student.model.path)})})

    def teacher(section: Any) -> Any:
        changes: dict[str, Any] = {}
        if section.model.path is not None and not _is_engine(section):
            changes["model"] = section.model.model_copy(
                update={"path": anchored(base, section.model.path)})
        if section.adapter is not None and not _hub_adapter(section, section.adapter):
            changes["adapter"] = anchored(base, section.adapter)
        if section.adapters is not None:
            changes["adapters"] = {
                name: ref if PINNED_HUB_ADAPTER.match(ref) else anchored(base, ref)
                for name, ref in section.adapters.items()}
        for key in CURVE_KEYS:
            if getattr(section, key) is not None:
                changes[key] = anchored(base, getattr(section, key))
        return section.model_copy(update=changes) if changes else section

    if recipe.teacher is not None:
        update["teacher"] = teacher(recipe.teacher)
    if recipe.teachers is not None:
        update["teachers"] = {name: teacher(s) for name, s in recipe.teachers.items()}
    if recipe.train.trajectories is not None:
        update["train"] = recipe.train.model_copy(
            update={"trajectories": anchored(base, recipe.train.trajectories)})
    return recipe.model_copy(update=update) if update else recipe


def _folder_problem(where: str, path: Path, holds: str, what: str) -> str | None:
    if not path.exists():
        return (f"{where}: {str(path)!r} does not exist (a recipe's paths resolve from its "
                f"own folder); give {what} folder")
    if not path.is_dir():
        return f"{where}: {str(path)!r} is a file, not a folder; give {what} folder"
    if not (path / holds).is_file():
        return (f"{where}: {str(path)!r} holds no {holds}; give {what} folder saved with "
                "save_pretrained")
    return None


def path_problems(recipe: Any, base: Path | None) -> list[str]:
    """One line per path the recipe reads that is not what it must be (an anchored
    recipe: :func:`anchor_paths`); ``base`` resolves ``prepare:`` (None: the current
    directory)."""
    folder = Path(base).resolve() if base is not None else Path.cwd()
    problems: list[str | None] = []
    if recipe.student.model.path is not None:
        problems.append(_folder_problem("student.model.path", Path(recipe.student.model.path),
                                        MODEL_CONFIG, "a model"))
    for where, section in _teacher_sections(recipe):
        launched = section.endpoint is None  # a model up or teacher serve loads
        if section.model.path is not None and launched:
            problems.append(_folder_problem(f"{where}.model.path", Path(section.model.path),
                                            MODEL_CONFIG, "a model"))
        if section.adapter is not None and not _hub_adapter(section, section.adapter):
            problems.append(_folder_problem(f"{where}.adapter", Path(section.adapter),
                                            ADAPTER_CONFIG, "an adapter"))
        for name, ref in (section.adapters or {}).items():
            if not PINNED_HUB_ADAPTER.match(ref):
                problems.append(_folder_problem(f"{where}.adapters.{name}", Path(ref),
                                                ADAPTER_CONFIG, "an adapter"))
        for key in CURVE_KEYS:
            if getattr(section, key) is not None:
                problems.append(_file_problem(f"{where}.{key}", Path(getattr(section, key)),
                                              "the key file `miniverl teacher keys` wrote"))
        if section.prepare is not None:
            prep = Path(section.prepare).expanduser()
            prep = prep if prep.is_absolute() else folder / prep
            if not prep.is_file():
                problems.append(
                    f"{where}.prepare: {section.prepare!r} is not a file (looked at "
                    f"{str(prep)!r}; a recipe's paths resolve from its own folder); point it "
                    "at an sft recipe")
    if recipe.train.trajectories is not None:
        problems.append(_file_problem("train.trajectories", Path(recipe.train.trajectories),
                                      "a trajectories.jsonl a run wrote"))
    return [p for p in problems if p is not None]


def _file_problem(where: str, path: Path, what: str) -> str | None:
    if path.is_file():
        return None
    state = "is a folder, not a file" if path.is_dir() else "does not exist"
    return (f"{where}: {str(path)!r} {state} (a recipe's paths resolve from its own "
            f"folder); give {what}")
