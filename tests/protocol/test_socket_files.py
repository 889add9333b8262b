"""Socket files: removed by the process that bound them, never one a newer process bound."""

from __future__ import annotations

import os

from miniverl.protocol.socket_files import bound_file, remove_bound_file


def test_tcp_and_abstract_endpoints_have_no_file():
    assert bound_file("tcp://127.0.0.1:5555") is None
    assert bound_file("ipc://@abstract") is None
    assert remove_bound_file(None) is False


def test_own_file_is_removed(tmp_path):
    path = tmp_path / "teacher.sock"
    path.write_bytes(b"")  # stands in for the socket a bind made
    bound = bound_file(f"ipc://{path}")
    assert remove_bound_file(bound) is True
    assert not path.exists()
    assert remove_bound_file(bound) is False  # already gone: nothing to do


def test_a_newer_socket_at_the_same_path_is_left_alone(tmp_path):
    # A teacher that ends late must not delete the socket of its replacement.
    path = tmp_path / "teacher.sock"
    path.write_bytes(b"")
    bound = bound_file(f"ipc://{path}")
    newer = tmp_path / "newer"
    newer.write_bytes(b"new")  # made while the old one exists: another inode
    os.replace(newer, path)
    assert remove_bound_file(bound) is False
    assert path.read_bytes() == b"new"
