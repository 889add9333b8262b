"""Names are names (common/names.py): one pattern for teacher, route and adapter names,
paths made from them stay in their folder, and only folders the code made change mode.

What a user relies on (docs/recipes.md, "Names"; issue 53): a teacher named
``../../../../s`` or ``a=b`` is refused by ``validate`` with one line before anything
exists; no command changes the mode of a folder it did not create (a socket folder's
``chmod`` once set the machine's temporary folder to 0700).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from miniverl.cli.app import run
from miniverl.common.errors import ConfigError
from miniverl.common.names import (
    check_route,
    make_private_dirs,
    name_problem,
    path_inside,
)
from miniverl.common.teacher_routes import teacher_flags
from miniverl.protocol.endpoints import check_bind_endpoint

HOSTILE = ["../../../../s", "a=b", "a/b", "..", ".hidden", "-x", "", "x" * 65, "a b", "calc\n",
           "/abs", "a\\b", "\u00e9"]


@pytest.mark.parametrize("name", ["calc", "nav", "a.b", "A-1_z", "x" * 64, "0"])
def test_plain_names_pass(name):
    assert name_problem(name, "teacher") is None


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_is_not_a_name_is_one_line(name):
    problem = name_problem(name, "teacher")
    assert problem is not None and "\n" not in problem and "rename it" in problem


def test_flags_take_names_only():
    assert teacher_flags(["calc=tcp://127.0.0.1:5555"]) == (None, {"calc": "tcp://127.0.0.1:5555"})
    for bad in ("a/b=tcp://127.0.0.1:5", "../x=ipc:///tmp/x.sock", ".x=tcp://127.0.0.1:5"):
        with pytest.raises(ConfigError, match="must be 1-64"):
            teacher_flags([bad])
    assert check_route("calc") == "calc" and check_route("specialists/sql") == "specialists/sql"
    for bad in ("../x", "a/b/c", "a/", "/a"):
        with pytest.raises(ConfigError, match="must be 1-64"):
            check_route(bad)


def test_teacher_use_refuses_a_route_that_is_not_a_name_before_sending(tmp_path, capsys):
    code = run(["teacher", "use", str(tmp_path), "tcp://127.0.0.1:5555", "--route", "../x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "'..' must be 1-64" in err[0]


def test_a_path_made_from_a_name_stays_in_its_folder(tmp_path):
    assert path_inside(tmp_path, "teacher-calc.log", what="log") == tmp_path / "teacher-calc.log"
    for name in ("teacher-../../../x.log", "../x", "/etc/passwd"):
        with pytest.raises(ConfigError, match="outside"):
            path_inside(tmp_path, name, what="log")


def modes(root: Path) -> dict[str, int]:
    """The mode of ``root``, of every folder under it and of its parents."""
    found = {str(p): stat.S_IMODE(os.stat(p).st_mode) for p in (root, *root.parents)}
    for folder, subdirs, _ in os.walk(root):
        for sub in subdirs:
            path = Path(folder) / sub
            found[str(path)] = stat.S_IMODE(os.stat(path).st_mode)
    return found


def test_only_the_folders_made_are_made_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    before = modes(tmp_path)
    made = make_private_dirs(shared / "run" / "teacher-.." / ".." / ".." / "s")
    after = modes(tmp_path)
    assert made == [shared / "run", shared / "run" / "teacher-..", shared / "run" / "teacher-.."
                    / ".." / ".." / "s"]
    assert all(after[p] == mode for p, mode in before.items())  # existing: unchanged
    assert after[str(shared / "s")] == 0o700 and after[str(shared / "run")] == 0o700


@pytest.fixture
def short_tmp():
    folder = Path(tempfile.mkdtemp(prefix="mvn-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_binding_a_socket_through_dot_dot_changes_no_existing_folder(short_tmp):
    # teacher-<name> with name '../../..' made the socket's folder resolve to an existing
    # one, which check_bind_endpoint then chmod'ed 0700. (A short folder: an ipc path
    # under pytest's per-worker folders passes the OS's 107-byte limit.)
    tmp_path = short_tmp
    run_dir = tmp_path / "out" / "run-1"
    run_dir.mkdir(parents=True)
    for folder in (tmp_path, tmp_path / "out", run_dir):
        os.chmod(folder, 0o755)
    before = modes(tmp_path)
    check_bind_endpoint(f"ipc://{run_dir}/teacher-../../../teacher.sock", curve_configured=False)
    after = modes(tmp_path)
    assert all(after[p] == mode for p, mode in before.items())
