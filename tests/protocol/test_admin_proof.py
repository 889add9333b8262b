"""The client's half of "who may do what": token files, CURVE key files, the ``auth`` field.

No sockets: token files in a temporary directory, the client over
``miniverl.testing``'s in-memory fake teacher.
"""

from __future__ import annotations

import os
import stat

import pytest

from miniverl.common.errors import ConfigError, Unauthorized
from miniverl.protocol import messages as m
from miniverl.protocol.codec import encode
from miniverl.protocol.endpoints import (
    admin_token_path,
    create_curve_keys,
    curve_key_files,
    default_admin_token_file,
    load_curve_client_keys,
    load_curve_server_keys,
    read_admin_token,
    write_admin_token,
)
from miniverl.protocol.sync_client import SyncTeacherClient
from miniverl.testing import FakeTeacher


def test_token_paths_sit_beside_the_socket_or_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert admin_token_path(f"ipc://{tmp_path}/run/teacher.sock") == (
        tmp_path / "run" / "teacher.admin-token")
    assert admin_token_path("tcp://127.0.0.1:5555", tmp_path / "logs" / "teacher.log") == (
        tmp_path / "logs" / "teacher.admin-token")
    assert admin_token_path("tcp://127.0.0.1:5555") == (
        tmp_path / "miniverl" / "admin-tokens" / "tcp-127.0.0.1-5555.admin-token")
    with pytest.raises(ConfigError, match="no transport"):
        admin_token_path("127.0.0.1:5555")


def test_a_token_file_is_private_and_read_back(tmp_path):
    # Users rely on: no other user of the machine can read the teacher's admin token.
    path = write_admin_token(tmp_path / "new" / "teacher.admin-token", "ab" * 32)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert read_admin_token(path) == "ab" * 32
    assert default_admin_token_file(f"ipc://{tmp_path}/new/teacher.sock") == path
    assert default_admin_token_file(f"ipc://{tmp_path}/other/teacher.sock") is None


def test_a_missing_token_file_is_one_line_with_the_fix(tmp_path):
    with pytest.raises(ConfigError) as info:
        read_admin_token(tmp_path / "none")
    assert "does not exist" in str(info.value) and "--admin-token FILE" in str(info.value)
    assert "\n" not in str(info.value)


def test_curve_flags_come_in_pairs():
    assert curve_key_files(None, None) is None
    assert curve_key_files("s", "p") == ("s", "p")
    with pytest.raises(ConfigError, match="both --curve-secret-key"):
        curve_key_files("s", None)


def test_created_keys_load_by_role_and_are_never_overwritten(tmp_path):
    # Users rely on: `miniverl teacher keys` output works as the flags it prints say.
    paths = create_curve_keys(tmp_path / "keys")
    for name in ("server_secret", "student_secret", "admin_secret"):
        assert stat.S_IMODE(os.stat(paths[name]).st_mode) == 0o600
    server = load_curve_server_keys(paths["server_secret"], paths["authorized_dir"],
                                    paths["admin_dir"])
    admin = load_curve_client_keys(paths["admin_secret"], paths["server_public"])
    student = load_curve_client_keys(paths["student_secret"], paths["server_public"])
    assert server.admin_ids == {admin.public.decode()}
    assert student.public.decode() not in server.admin_ids
    assert student.server_public == server.public
    with pytest.raises(ConfigError, match="already exists"):
        create_curve_keys(tmp_path / "keys")


def _client(teacher, **settings):
    return SyncTeacherClient("ipc:///tmp/miniverl-test.sock", tokenizer_fp=None, vocab_size=1,
                             heartbeat_ms=50, request_timeout_s=0.5, unavailable_timeout_s=2,
                             transport_factory=teacher.transport_factory, **settings)


def test_admin_calls_carry_the_token_and_scoring_calls_do_not(tmp_path):
    teacher = FakeTeacher()
    token_file = write_admin_token(tmp_path / "t.admin-token", "cd" * 32)
    with _client(teacher, admin_token_file=str(token_file)) as client:
        client.park()
        client.wake()
        client.reload("fake/other")
        client.status()
        write_admin_token(token_file, "ef" * 32)  # a restarted teacher's new token
        client.shutdown()
    auth = {msg.t: getattr(msg, "auth", None) for msg in teacher.log}
    assert auth == {"PARK": "cd" * 32, "WAKE": "cd" * 32, "RELOAD": "cd" * 32,
                    "STATUS": None, "SHUTDOWN": "ef" * 32}


def test_an_admin_message_without_a_token_leaves_the_field_off_the_wire():
    # Backwards compatible: a teacher that predates `auth` still parses the header.
    assert "auth" not in m.header_dict(m.Park(id=1))
    assert m.Shutdown(id=2, auth="x").model_dump(mode="json")["auth"] == "x"
    assert encode(m.Wake(id=3))[0] == encode({"v": 1, "id": 3, "t": "WAKE"})[0]


def test_unauthorized_raises_its_own_error():
    teacher = FakeTeacher(admin_token="ab" * 32)
    with _client(teacher, admin_token="cd" * 32) as client:
        with pytest.raises(Unauthorized, match="UNAUTHORIZED"):
            client.park()
        assert client.status()["state"] == "READY"  # nothing was changed
