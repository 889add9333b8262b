"""The teacher's lifecycle: LOADING, PARK/WAKE, RELOAD (drain, abort, refusals), SHUTDOWN.

Real TeacherServer in ``miniverl.testing``'s harness (in memory) with its numpy
``FakeBackend`` (``harness.py``).
"""

from __future__ import annotations

import threading

from miniverl.common.errors import ConfigError
from miniverl.protocol.messages import TeacherState
from miniverl.testing import FAKE_TOKENIZER_FP, FAKE_VOCAB, FakeBackend
from tests.teacher_server.harness import busy, call, hello, recv, score_arrays, score_header, send


def test_loading_state_pings_and_held_hello(harness):
    # Users rely on: a loading teacher is never mistaken for a dead one.
    release = threading.Event()
    backend = FakeBackend()

    def slow_loader(request):
        release.wait(10)
        return backend

    h, _ = harness(loader=slow_loader, wait_ready=False)
    sock = h.raw()
    pong, _ = call(sock, {"v": 1, "t": "PING", "id": 1})
    assert pong.state == TeacherState.LOADING
    err, _ = call(sock, score_header(2), score_arrays())
    assert err.t == "ERROR" and err.code.value == "RELOADING" and err.retryable
    send(sock, {"v": 1, "t": "HELLO", "id": 3, "client": "c", "tokenizer_fp": FAKE_TOKENIZER_FP,
                "vocab_size": FAKE_VOCAB})
    assert recv(sock, 0.2) is None  # held until the model is there
    release.set()
    ok, _ = recv(sock)
    assert ok.t == "HELLO_OK" and ok.id == 3


def test_failed_initial_load_exits_nonzero(harness):
    def loader(request):
        raise ConfigError("model path '/nope' has no config.json")

    h, _ = harness(loader=loader)
    assert h.wait_stopped(5) == 1


def test_park_wake_and_implicit_wake(harness):
    h, backend = harness()
    sock = h.raw()
    hello(sock)
    ok, _ = call(sock, {"v": 1, "t": "PARK", "id": 2})
    assert ok.t == "PARK_OK" and ok.state == TeacherState.PARKED and backend.parked
    assert call(sock, {"v": 1, "t": "PING", "id": 3})[0].state == TeacherState.PARKED
    ok, _ = call(sock, {"v": 1, "t": "WAKE", "id": 4})
    assert ok.state == TeacherState.READY and not backend.parked
    call(sock, {"v": 1, "t": "PARK", "id": 5})
    msg, _ = call(sock, score_header(6), score_arrays())  # SCORE while parked wakes it
    assert msg.t == "SCORE_OK" and not backend.parked
    assert call(sock, {"v": 1, "t": "PING", "id": 7})[0].state == TeacherState.READY


def test_reload_bumps_gen_and_refuses_another_tokenizer(harness):
    backends = {
        "first": FakeBackend("first"),
        "second": FakeBackend("second"),
        "alien": FakeBackend("alien", tokenizer_fp="sha256:" + "00" * 32),
    }

    def loader(request):
        if request is None:
            return backends["first"]
        if request["model"] == "broken":
            raise ConfigError("model 'broken' has no config.json")
        return backends[request["model"]]

    h, _ = harness(loader=loader)
    sock = h.raw()
    hello(sock)
    ok, _ = call(sock, {"v": 1, "t": "RELOAD", "id": 2, "model": "second", "mode": "drain"})
    assert ok.t == "RELOAD_OK" and ok.gen == 1 and ok.teacher.name == "second"
    assert backends["first"].calls == ["park", "close"]
    msg, _ = call(sock, score_header(3), score_arrays())
    assert msg.gen == 1
    err, _ = call(sock, {"v": 1, "t": "RELOAD", "id": 4, "model": "alien"})
    assert err.code.value == "TOKENIZER_MISMATCH" and "keeps serving" in err.message
    err, _ = call(sock, {"v": 1, "t": "RELOAD", "id": 5, "model": "broken", "mode": "abort"})
    assert err.code.value == "BAD_REQUEST" and "no config.json" in err.message
    msg, _ = call(sock, score_header(6), score_arrays())
    assert msg.t == "SCORE_OK" and msg.gen == 1 and not backends["second"].parked
    status, _ = call(sock, {"v": 1, "t": "STATUS", "id": 7})
    assert status.teacher.name == "second" and status.state == TeacherState.READY


def test_reload_passes_every_pin_to_the_loader(harness):
    requests = []

    def loader(request):
        requests.append(request)
        return FakeBackend("first" if request is None else "second")

    h, _ = harness(loader=loader)
    sock = h.raw()
    hello(sock)
    pins = {"model": "org/teacher", "revision": "a" * 40, "adapter": "org/lora",
            "adapter_revision": "b" * 40}
    ok, _ = call(sock, {"v": 1, "t": "RELOAD", "id": 2, **pins})
    assert ok.t == "RELOAD_OK"
    assert requests == [None, pins]


def test_reload_abort_fails_queued_requests_retryably(harness):
    h, first, gate, sock = busy(harness, first_id=1)
    send(sock, score_header(2), score_arrays())
    send(sock, {"v": 1, "t": "RELOAD", "id": 3, "model": "second", "mode": "abort"})
    errors = [recv(sock)[0] for _ in range(2)]
    assert {(e.id, e.code.value, e.retryable) for e in errors} == {
        (1, "RELOADING", True),
        (2, "RELOADING", True),
    }
    gate.set()
    ok, _ = recv(sock)
    assert ok.t == "RELOAD_OK" and ok.gen == 1
    assert recv(sock, 0.2) is None  # the aborted batch's result is never sent


def test_shutdown_drains_open_requests(harness):
    h, backend, gate, sock = busy(harness, first_id=1)
    send(sock, {"v": 1, "t": "SHUTDOWN", "id": 2, "mode": "drain"})
    err, _ = call(sock, score_header(3), score_arrays())
    assert err.code.value == "SHUTTING_DOWN" and err.retryable
    gate.set()
    first, _ = recv(sock)
    second, _ = recv(sock)
    assert (first.t, second.t) == ("SCORE_OK", "SHUTDOWN_OK")
    assert h.wait_stopped(5) == 0
    assert "close" in backend.calls


class WakeFails(FakeBackend):
    """A backend whose wake raises (a device out of memory) ``failures`` times."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def wake(self) -> None:
        self.calls.append("wake")
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("CUDA out of memory (fake)")
        self.parked = False


class ParkFails(FakeBackend):
    def park(self) -> None:
        self.calls.append("park")
        raise RuntimeError("host memory exhausted (fake)")


def test_failed_park_and_wake_answer_error_at_once(harness):
    # A student sending PARK/WAKE waited out its whole timeout when the call raised.
    h, backend = harness(backend=ParkFails())
    sock = h.raw()
    hello(sock)
    err, _ = call(sock, {"v": 1, "t": "PARK", "id": 2}, timeout_s=2.0)
    assert err.t == "ERROR" and err.code.value == "INTERNAL" and "PARK failed" in err.message
    assert "host memory exhausted" in err.message and "READY" in err.message
    h2, backend2 = harness(backend=WakeFails(failures=1))
    sock2 = h2.raw()
    hello(sock2)
    assert call(sock2, {"v": 1, "t": "PARK", "id": 2})[0].t == "PARK_OK"
    err, _ = call(sock2, {"v": 1, "t": "WAKE", "id": 3}, timeout_s=2.0)
    assert err.t == "ERROR" and "WAKE failed" in err.message and "PARKED" in err.message
    ok, _ = call(sock2, {"v": 1, "t": "WAKE", "id": 4})  # the next WAKE may succeed
    assert ok.t == "WAKE_OK" and ok.state == TeacherState.READY


def test_implicit_wake_retries_with_backoff_then_answers_error(harness, monkeypatch):
    # An implicit wake that failed was retried at once, forever: the SCORE never got an
    # answer and the loop spun. Now: WAKE_TRIES tries with backoff, then ERROR.
    from miniverl.teacher_server import lifecycle

    monkeypatch.setattr(lifecycle, "WAKE_BACKOFF_S", 0.01)
    h, backend = harness(backend=WakeFails(failures=10))
    sock = h.raw()
    hello(sock)
    call(sock, {"v": 1, "t": "PARK", "id": 2})
    err, _ = call(sock, score_header(3), score_arrays(), timeout_s=5.0)
    assert err.t == "ERROR" and err.code.value == "INTERNAL" and err.retryable
    assert f"could not be woken ({lifecycle.WAKE_TRIES} tries)" in err.message
    assert backend.calls.count("wake") == lifecycle.WAKE_TRIES
    assert call(sock, {"v": 1, "t": "PING", "id": 4})[0].state == TeacherState.PARKED
    # A wake that fails once, then works, serves the SCORE.
    h2, backend2 = harness(backend=WakeFails(failures=1))
    sock2 = h2.raw()
    hello(sock2)
    call(sock2, {"v": 1, "t": "PARK", "id": 2})
    msg, _ = call(sock2, score_header(3), score_arrays(), timeout_s=5.0)
    assert msg.t == "SCORE_OK" and backend2.calls.count("wake") == 2
