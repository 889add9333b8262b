"""Names that stay names: teachers, routes and adapters, and the paths made from them.

A teacher's name under ``teachers:``, an adapter's name, and a route (``teacher`` or
``teacher/adapter``) come from a recipe, a command-line flag or a peer, and become
socket folders, log files, metric keys and wire fields. They match one pattern
(:data:`NAME`: letters, digits, ``_``, ``-`` and ``.``, not leading, at most 64), checked
before they are used (:func:`name_problem`, :func:`check_name`, :func:`check_route`);
a path derived from one is checked to stay inside the folder it belongs to
(:func:`path_inside`); and a private folder is created with only the folders this code
made changed to 0700 (:func:`make_private_dirs`), never one that already existed.
A name ``../../../../s`` once reached ``teacher-<name>.sock``'s folder, and the folder's
``chmod`` set an existing folder outside the run (the machine's temporary folder) to
0700 (issue 53).

This module opens no sockets and reads no recipes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import ConfigError

MAX_NAME = 64
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NAME_RULE = ("1-64 letters, digits, '_', '-' or '.', starting with a letter or digit "
             "(it names a socket, a log file and a route)")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def name_problem(name: object, what: str) -> str | None:
    """Why ``name`` cannot be a ``what`` name (``"teacher"``, ``"adapter"``), or None."""
    if isinstance(name, str) and NAME.fullmatch(name):
        return None
    return f"{what} name {_shown(name)} must be {NAME_RULE}; rename it"


def check_name(name: object, what: str) -> str:
    """``name`` unchanged, or :class:`ConfigError` (one line) when it is not a name."""
    problem = name_problem(name, what)
    if problem is not None:
        raise ConfigError(problem)
    return str(name)


def check_route(route: str) -> str:
    """A route as a flag names it: ``TEACHER`` or ``TEACHER/ADAPTER``, each a name."""
    teacher, sep, adapter = route.partition("/")
    check_name(teacher, "route's teacher")
    if sep:
        check_name(adapter, "route's adapter")
    return route


def path_inside(folder: str | os.PathLike, *parts: str, what: str) -> Path:
    """``folder / parts...``, after checking that it resolves inside ``folder``
    (symbolic links and ``..`` followed); :class:`ConfigError` naming both otherwise."""
    base = Path(folder).resolve()
    path = Path(folder).joinpath(*parts)
    resolved = path.resolve()
    if resolved != base and base not in resolved.parents:
        raise ConfigError(f"{what} {str(path)!r} resolves to {str(resolved)!r}, outside "
                          f"{str(base)!r}; give a name without '/' or '..'")
    return path


def make_private_dirs(folder: str | os.PathLike) -> list[Path]:
    """Create ``folder`` and its missing parents, each 0700, and return those created.

    Walks the path as written (no resolving first), so only folders this call makes
    are created and have their mode set; an existing folder, reached through ``..`` or
    not, keeps its mode.
    """
    path = Path(folder)
    made: list[Path] = []
    prefix = Path(path.anchor) if path.is_absolute() else Path()
    for part in path.parts[1 if path.is_absolute() else 0:]:
        prefix = prefix / part
        if prefix.exists():
            continue
        try:
            os.mkdir(prefix, 0o700)
        except FileExistsError:  # made by another process meanwhile: not ours
            continue
        os.chmod(prefix, 0o700)  # the umask may have taken bits off
        made.append(prefix)
    return made
