"""Who may do what on a teacher: admin messages need proof, scoring messages do not.

A real server in ``miniverl.testing``'s harness (named ``inproc://``) with a configured
admin token (the same rule a teacher process applies on ipc and loopback TCP); raw
in-memory connections speak the wire. The CURVE
half of the rule is checked on :func:`roles.refusal` with the user ids ZeroMQ reports.
"""

from __future__ import annotations

import pytest

from miniverl.protocol.messages import Park, Reload, Shutdown, TeacherState
from miniverl.teacher_server import roles
from miniverl.testing import FakeBackend
from tests.teacher_server.harness import call, hello, score_arrays, score_header

TOKEN = "ab" * 32
ADMIN = {
    "RELOAD": {"model": "second", "mode": "drain"},
    "PARK": {},
    "WAKE": {},
    "SHUTDOWN": {"mode": "abort"},
}


def _server(harness):
    requests = []

    def loader(request):
        requests.append(request)
        return FakeBackend("first" if request is None else "second")

    h, _ = harness(loader=loader, admin_token=TOKEN)
    sock = h.raw()
    assert hello(sock).t == "HELLO_OK"
    return h, sock, requests


@pytest.mark.parametrize("t", sorted(ADMIN))
@pytest.mark.parametrize("auth", [None, "", "cd" * 32, TOKEN[:-1], "é" * 8])
def test_admin_message_without_the_token_is_refused_and_changes_nothing(harness, t, auth):
    # Users rely on: another local process cannot reload, park or stop their teacher.
    h, sock, requests = _server(harness)
    header = {"v": 1, "t": t, "id": 2, **ADMIN[t]}
    if auth is not None:
        header["auth"] = auth
    reply, _ = call(sock, header)
    if auth == "":  # an empty token is not even a well-formed header
        assert reply.code.value == "BAD_REQUEST"
    else:
        assert (reply.t, reply.code.value, reply.id, reply.retryable) == (
            "ERROR", "UNAUTHORIZED", 2, False)
    pong, _ = call(sock, {"v": 1, "t": "PING", "id": 3})
    assert pong.state == TeacherState.READY and pong.gen == 0
    assert requests == [None]  # the loader never saw a reload
    assert h.running  # not shut down
    ok, _ = call(sock, score_header(4), score_arrays())
    assert ok.t == "SCORE_OK"


@pytest.mark.parametrize("t", sorted(ADMIN))
def test_admin_message_with_the_token_is_served(harness, t):
    # Users rely on: `miniverl teacher reload|park|wake|shutdown` and `up`'s swap work.
    h, sock, requests = _server(harness)
    reply, _ = call(sock, {"v": 1, "t": t, "id": 2, "auth": TOKEN, **ADMIN[t]})
    assert reply.t == f"{t}_OK", reply
    if t == "RELOAD":
        assert reply.gen == 1 and requests[-1]["model"] == "second"
    if t == "SHUTDOWN":
        assert h.wait_stopped(5) == 0


def test_scoring_messages_need_no_token(harness):
    # Users rely on: a student scores with nothing but HELLO, as before.
    h, sock, _ = _server(harness)
    assert call(sock, score_header(2), score_arrays())[0].t == "SCORE_OK"
    assert call(sock, {"v": 1, "t": "PING", "id": 3})[0].t == "PONG"
    assert call(sock, {"v": 1, "t": "STATUS", "id": 4})[0].t == "STATUS_OK"


def test_a_refused_reload_reveals_nothing_about_paths(harness, tmp_path):
    # Users rely on: a failed RELOAD does not tell an outsider whether a path exists.
    h, sock, requests = _server(harness)
    present = tmp_path / "exists"
    present.mkdir()
    messages = set()
    for rid, model in enumerate((str(present), str(tmp_path / "missing"), "/etc/passwd"), 10):
        reply, _ = call(sock, {"v": 1, "t": "RELOAD", "id": rid, "model": model})
        assert reply.code.value == "UNAUTHORIZED"
        assert model not in reply.message
        messages.add(reply.message)
    assert len(messages) == 1 and requests == [None]


def test_a_refused_message_is_refused_before_the_state_check(harness):
    # An outsider's WAKE of a parked teacher is refused by the rule, before the
    # lifecycle looks at it: the teacher stays parked.
    h, sock, _ = _server(harness)
    call(sock, {"v": 1, "t": "PARK", "id": 2, "auth": TOKEN})
    reply, _ = call(sock, {"v": 1, "t": "WAKE", "id": 3, "auth": "00" * 32})
    assert reply.code.value == "UNAUTHORIZED"
    assert call(sock, {"v": 1, "t": "PING", "id": 4})[0].state == TeacherState.PARKED


def test_unauthorized_is_counted_among_errors(harness):
    h, sock, _ = _server(harness)
    call(sock, {"v": 1, "t": "SHUTDOWN", "id": 2})
    status, _ = call(sock, {"v": 1, "t": "STATUS", "id": 3})
    assert status.counters.errors == {"UNAUTHORIZED": 1}


def test_inproc_without_a_token_is_this_process_only_and_open(harness):
    # An embedding process talking to its own inproc teacher needs no proof.
    h, _ = harness()
    sock = h.raw()
    hello(sock)
    assert call(sock, {"v": 1, "t": "PARK", "id": 2})[0].t == "PARK_OK"


def test_curve_rule_admits_admin_keys_only():
    rule = roles.AdminRule(curve=True, admin_ids=frozenset({"ADMINKEY"}))
    for msg in (Reload(id=1, model="m"), Park(id=2), Shutdown(id=3)):
        assert roles.refusal(rule, msg, "ADMINKEY") is None
        refused = roles.refusal(rule, msg, "STUDENTKEY")
        assert refused is not None and "admin CURVE key" in refused
        assert roles.refusal(rule, msg, None) is not None
        # Over CURVE the key is the identity: a token does not make a student an admin.
        assert roles.refusal(rule, msg.model_copy(update={"auth": TOKEN}), "STUDENTKEY")


def test_user_id_of_a_frame_without_one_is_none():
    assert roles.user_id(b"not a frame") is None
