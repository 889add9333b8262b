"""A remote student over CURVE: a teacher on another loopback address, keys by role.

`miniverl teacher keys` makes a server, a student and an admin certificate; the teacher
binds ``tcp://127.0.0.2:<port>`` (a non-loopback-looking bind needs CURVE, so this is
the remote setup minus the network). A toy student trains against it with the recipe's
``teacher.curve_*`` fields; a key the teacher does not list gets no answer at all; the
student key may score but not SHUTDOWN; the admin key may.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.toy_kit import MINIVERL, TEACHER, recipe_dict, spawn_teacher, toy_dir

pytestmark = pytest.mark.integration

ADDRESS = "127.0.0.2"


def _free_port(address: str) -> int:
    with socket.socket() as s:
        try:
            s.bind((address, 0))
        except OSError as exc:
            pytest.skip(f"cannot bind {address} here ({exc}); it is loopback on Linux only")
        return s.getsockname()[1]


def _client(endpoint, secret, server, timeout_s=10.0):
    from miniverl.protocol.endpoints import load_curve_client_keys
    from miniverl.protocol.sync_client import SyncTeacherClient

    return SyncTeacherClient(endpoint, tokenizer_fp=None, vocab_size=1, client_name="probe",
                             request_timeout_s=timeout_s, unavailable_timeout_s=timeout_s,
                             curve=load_curve_client_keys(secret, server))


def _wait_ready(teacher, keys, timeout_s=240.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert teacher.proc.poll() is None, teacher.out.read_text()[-2000:]
        with _client(teacher.endpoint, keys["student_secret"], keys["server_public"], 2) as c:
            try:
                if c.ping().state.value == "READY":
                    return
            except Exception:  # still importing: no socket yet
                time.sleep(0.5)
    pytest.fail("the CURVE teacher was not READY in time")


def _cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*MINIVERL, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.fixture(scope="module")
def curve_teacher(tmp_path_factory):
    root = tmp_path_factory.mktemp("curve")
    made = _cli("teacher", "keys", root / "keys")
    assert made.returncode == 0, made.stderr
    from miniverl.protocol.endpoints import create_curve_keys

    keys = {k: str(v) for k, v in create_curve_keys(root / "other").items()}
    stranger = keys["student_secret"]  # a well-formed key the teacher does not list
    keys = {k: str(root / "keys" / v) for k, v in {
        "server_secret": "server.key_secret", "server_public": "server.key",
        "student_secret": "student.key_secret", "admin_secret": "admin.key_secret",
        "authorized_dir": "authorized", "admin_dir": "admins"}.items()}
    keys["stranger_secret"] = stranger
    endpoint = f"tcp://{ADDRESS}:{_free_port(ADDRESS)}"
    teacher = spawn_teacher(toy_dir(TEACHER), root, endpoint=endpoint, extra=[
        "--dtype", "float32", "--heartbeat-ms", "200",
        "--curve-secret-key", keys["server_secret"],
        "--curve-authorized-dir", keys["authorized_dir"],
        "--curve-admin-dir", keys["admin_dir"]])
    try:
        _wait_ready(teacher, keys)
        yield teacher, keys, root
    finally:
        teacher.stop()


def test_keys_are_private_and_listed_by_role(curve_teacher):
    # Users rely on: secret files are readable by their owner only.
    import os
    import stat

    _, keys, _ = curve_teacher
    for name in ("server_secret", "student_secret", "admin_secret"):
        assert stat.S_IMODE(os.stat(keys[name]).st_mode) == 0o600


def test_a_student_trains_against_a_curve_teacher(curve_teacher):
    # Users rely on: a remote student needs only its key and the teacher's public key,
    # given as `up` flags (the recipe's teacher.curve_* fields are the same settings).
    from miniverl.common.rundir import RunDir
    from tests.toy_kit import metrics, write_recipe

    teacher, keys, root = curve_teacher
    recipe = write_recipe(root / "recipe.yaml", recipe_dict("opd", root / "runs", cycles=2))
    done = _cli("up", recipe, "--quiet", "--teacher", teacher.endpoint,
                "--curve-secret-key", keys["student_secret"],
                "--curve-server-key", keys["server_public"], timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = Path(done.stdout.strip().rsplit("run directory: ", 1)[-1])
    assert RunDir.open(run_dir).status == "completed"
    rows = [r for r in metrics(run_dir) if r.get("phase") == "train"]
    assert len(rows) == 2 and all(r["stale_dropped"] == 0 for r in rows)
    assert teacher.proc.poll() is None  # `up` never stops a teacher it attached to


def test_a_key_the_teacher_does_not_list_gets_no_answer(curve_teacher):
    from miniverl.common.errors import TeacherUnavailable

    teacher, keys, _ = curve_teacher
    stranger = _client(teacher.endpoint, keys["stranger_secret"], keys["server_public"], 2)
    with stranger, pytest.raises(TeacherUnavailable):
        stranger.ping()


def test_qualify_teacher_measures_a_curve_teacher(curve_teacher, capsys):
    # Users rely on: a teacher on another machine is measured where the student runs,
    # with the student's key (qualify-teacher --teacher, docs/choosing-a-teacher.md).
    from miniverl.cli.app import run
    from tests.toy_kit import write_recipe

    teacher, keys, root = curve_teacher
    recipe = write_recipe(root / "qualify.yaml", recipe_dict("opd", root / "runs"))
    assert run(["qualify-teacher", str(recipe), "--teacher", teacher.endpoint, "--max-tasks",
                "1", "--curve-secret-key", keys["student_secret"],
                "--curve-server-key", keys["server_public"]]) == 0
    assert "on calculator eval (n=1)" in capsys.readouterr().out
    # The keys are for --teacher only: without it they are refused in one line.
    assert run(["qualify-teacher", str(recipe), "--curve-secret-key",
                keys["student_secret"]]) == 1
    assert "go with --teacher" in capsys.readouterr().err


def test_a_student_key_cannot_shut_down_but_an_admin_key_can(curve_teacher):
    # Users rely on: the students they hand keys to cannot stop or reload their teacher.
    teacher, keys, _ = curve_teacher
    refused = _cli("teacher", "shutdown", teacher.endpoint,
                   "--curve-secret-key", keys["student_secret"],
                   "--curve-server-key", keys["server_public"])
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr.startswith("error: teacher refused SHUTDOWN: UNAUTHORIZED")
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    reload = _cli("teacher", "reload", teacher.endpoint, "--model", "/etc",
                  "--curve-secret-key", keys["student_secret"],
                  "--curve-server-key", keys["server_public"])
    assert reload.returncode == 1 and "UNAUTHORIZED" in reload.stderr
    assert "/etc" not in reload.stderr.split("UNAUTHORIZED", 1)[1]
    assert teacher.proc.poll() is None
    done = _cli("teacher", "shutdown", teacher.endpoint,
                "--curve-secret-key", keys["admin_secret"],
                "--curve-server-key", keys["server_public"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{teacher.endpoint}: shut down (drain)"
    assert teacher.proc.wait(30) == 0
