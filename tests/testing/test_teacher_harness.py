"""``miniverl.testing.TeacherHarness``: any backend, loader or scorer behind the real server.

What a teacher author relies on: their backend is driven through the same admission,
batcher and lifecycle as ``miniverl teacher serve`` runs (so what passes here passes
there), reached by the real client or raw frames, with no socket; loads, reloads and
failures behave as the teacher process's do. The server's own rules are tested in
``tests/teacher_server/`` on the same harness.
"""

from __future__ import annotations

import time
from importlib import metadata

import anyio
import numpy as np
import pytest

from miniverl.common.errors import ConfigError, TeacherError
from miniverl.teacher_server import scorers
from miniverl.testing import FakeBackend, MemoryNetwork, TeacherHarness

TOKENS = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9], np.int32)
CU = np.array([0, 5, 9], np.int32)
POS = np.array([0, 1, 2, 5, 6], np.int32)


def test_a_backend_is_served_through_admission_and_batching():
    backend = FakeBackend("mine")
    with TeacherHarness(backend) as harness, harness.client() as client:
        assert client.hello.teacher.name == "mine" and client.hello.instance == harness.instance
        backend.hold()
        ids = [client.submit(TOKENS, CU, POS, k=4)]
        assert backend.entered.wait(5)  # the first batch is held with one job in it
        ids += [client.submit(TOKENS, CU, POS, k=4) for _ in range(2)]
        deadline = time.monotonic() + 5
        while client.status()["queue_depth"] < 2:  # two queued behind the held batch
            assert time.monotonic() < deadline
        backend.release()
        results = client.wait(ids)
        assert all((r.arrays["ids"][:, 0] == TOKENS[POS + 1]).all() for r in results.values())
        assert sorted(len(batch) for batch in backend.batches) == [1, 2]  # coalesced
        assert harness.events("batch")[-1]["jobs"] == 2


def test_one_backend_refuses_a_reload_and_keeps_serving():
    with TeacherHarness(FakeBackend()) as harness, harness.client() as client:
        with pytest.raises(TeacherError, match="cannot load 'other'.*loader="):
            client.reload("other")
        assert client.score(TOKENS, CU, POS, k=2).gen == 0


def test_a_loader_serves_reloads_as_the_teacher_process_does():
    requests = []

    def loader(request):
        requests.append(request)
        return FakeBackend("first" if request is None else request["model"])

    with TeacherHarness(loader=loader) as harness, harness.client() as client:
        assert client.reload("second").teacher.name == "second"
        assert harness.gen == 1 and client.score(TOKENS, CU, POS, k=2).gen == 1
    assert requests[0] is None and requests[1]["model"] == "second"


def test_a_scorer_factory_gets_the_spec_and_options_and_unknown_names_are_refused():
    calls = []

    def make_scorer(spec, *, exact_max_vocab, max_batch_tokens, options):
        calls.append((spec, exact_max_vocab, max_batch_tokens, options))
        return FakeBackend(f"scored-{options['tau']}")

    harness = TeacherHarness(scorer=make_scorer, spec="my-spec", scorer_options={"tau": 0.5},
                             exact_max_vocab=1000, max_batch_tokens=64)
    with harness, harness.client() as client:
        assert client.hello.teacher.name == "scored-0.5"
    assert calls == [("my-spec", 1000, 64, {"tau": 0.5})]
    with pytest.raises(ConfigError, match="unknown scorer 'nope'"):
        TeacherHarness(scorer="nope")
    with pytest.raises(ConfigError, match="one of backend, loader or scorer"):
        TeacherHarness(FakeBackend(), loader=lambda request: FakeBackend())


def test_a_failed_load_stops_the_server_with_exit_code_1():
    def loader(request):
        raise ConfigError("model path '/nope' has no config.json")

    harness = TeacherHarness(loader=loader)
    assert harness.wait_stopped(5) == 1
    assert "no config.json" in harness.events("load_failed")[0]["error"]
    with pytest.raises(TimeoutError, match="did not load"):
        harness.client()
    harness.close()


def test_shutdown_through_the_client_or_the_harness_stops_the_server():
    harness = TeacherHarness()
    assert harness.state == "READY" and harness.running
    with harness.client() as client:
        client.shutdown()
    assert harness.wait_stopped(5) == 0 and not harness.running
    harness.close()
    harness = TeacherHarness()
    harness.shutdown("drain")  # as SIGTERM does
    assert harness.wait_stopped(5) == 0
    harness.close()


def make_named(spec, *, exact_max_vocab, max_batch_tokens, options):
    """A scorer registered by entry point in the test below."""
    return FakeBackend(f"named-{spec}")


def test_a_scorer_is_found_by_its_entry_point_name(monkeypatch):
    point = metadata.EntryPoint(name="mine", value=f"{__name__}:make_named",
                                group=scorers.ENTRY_POINT_GROUP)
    monkeypatch.setattr(scorers, "_entry_points", lambda: [point])
    with TeacherHarness(scorer="mine", spec="x") as harness, harness.client() as client:
        assert client.hello.teacher.name == "named-x"


def test_an_async_client_and_a_network_of_harnesses():
    with TeacherHarness(FakeBackend("a")) as a, TeacherHarness(FakeBackend("b")) as b:
        network = MemoryNetwork({"tcp://127.0.0.1:5555": a, "tcp://127.0.0.1:6000": b})

        async def main():
            with anyio.fail_after(10):
                async with a.async_client("tcp://127.0.0.1:5555",
                                          transport_factory=network.transport_factory) as client:
                    await client.connect()
                    assert (await client.score(TOKENS, CU, POS, k=2)).instance == a.instance
                    await client.retarget("tcp://127.0.0.1:6000")
                    assert (await client.score(TOKENS, CU, POS, k=2)).instance == b.instance

        anyio.run(main, backend="asyncio")


def test_a_load_past_start_timeout_raises_and_leaves_no_server_running():
    # The caller never gets the harness to close: the constructor must stop its server.
    import threading
    import time

    def slow(request):
        time.sleep(1.0)
        return FakeBackend()

    before = {t for t in threading.enumerate() if t.name == "teacher-harness"}
    with pytest.raises(TimeoutError, match="did not load in 0.2 s"):
        TeacherHarness(loader=slow, start_timeout_s=0.2)
    left = {t for t in threading.enumerate() if t.name == "teacher-harness"} - before
    assert not any(t.is_alive() for t in left)
