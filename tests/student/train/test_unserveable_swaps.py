"""A swap is checked against what the run needs; a teacher that refuses SCOREs is an
unavailable teacher, not a protocol error (issue 53).

What a user relies on (docs/several-teachers.md, "Swapping one teacher"; docs/protocol.md,
"Adapters"): ``miniverl teacher use RUN ENDPOINT --route nav`` refuses, with exit 1 and
one line, a teacher that cannot serve the route's requests (one serving only named
adapters to a route that names none, one without the kind, top-k or vocabulary the loss
asks); the run goes on with its old teacher and completes. A teacher that starts
refusing a route's SCOREs mid-run holds back that route's episodes, as a teacher that is
down does; the run still completes. Before, the swap was "accepted (handshake,
tokenizer and gate checked)" and the run ended with exit 1 on "request id 75 is not
pending".
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from miniverl.common.errors import AdapterNotServed, TeacherError, TeacherRefusing
from miniverl.common.recipe import Recipe
from miniverl.testing import FakeBackend, TeacherHarness
from miniverl.testing.fake_teacher import FakeTeacherClient
from tests.student.train.test_routed_teachers import _data, _episodes, _routed
from tests.toy_kit import events

SERVED = {"calc": "sha256:" + "1" * 64, "chat": "sha256:" + "2" * 64}
TOKENS = np.arange(6, dtype=np.int32)
CU = np.array([0, 6], np.int32)
POSITIONS = np.arange(5, dtype=np.int32)


def test_a_refused_score_is_the_teachers_refusal_not_a_lost_request():
    # The run: a client without an adapter scoring on a teacher that serves only
    # named adapters. Each SCORE is refused UNSUPPORTED; the waiter reads that refusal
    # as an unavailable teacher (TeacherRefusing), not "request id N is not pending".
    with TeacherHarness(backend=FakeBackend(adapters=SERVED)) as h, h.client() as client:
        rid = client.submit(TOKENS, CU, POSITIONS, k=4)
        with pytest.raises(TeacherRefusing) as info:
            client.wait([rid], timeout_s=10)
    text = str(info.value)
    assert "UNSUPPORTED" in text and "names no adapter" in text and "not pending" not in text
    assert isinstance(info.value, TeacherError)  # what callers caught before still catches it


def _state(top_k=16, objective="bucketed_topk_tail", vocab=32):
    loss = SimpleNamespace(top_k=top_k, objective=objective, cross_vocab=None)
    return SimpleNamespace(recipe=SimpleNamespace(loss=loss, teacher=None),
                           policy=SimpleNamespace(vocab_size=vocab))


def test_a_teacher_that_cannot_serve_the_route_is_refused_from_its_hello():
    from miniverl.student.train.teacher.connect import require_serves

    plain = SimpleNamespace(tokenizer=None)
    with TeacherHarness(backend=FakeBackend(adapters=SERVED)) as h, h.client() as client:
        client.connect(timeout_s=10)
        with pytest.raises(AdapterNotServed) as info:
            require_serves(_state(), client, plain, None, "nav")
        require_serves(_state(), client, plain, "chat", "nav/chat")  # its adapter: served
    assert "serves only named adapters (calc, chat)" in str(info.value)
    assert "route nav" in str(info.value) and "\n" not in str(info.value)
    with TeacherHarness(backend=FakeBackend()) as h, h.client() as client:
        hello = client.connect(timeout_s=10)
        require_serves(_state(), client, plain)  # the plain model, top-k: served
        too_many = hello.kinds.topk.k_max + 1
        with pytest.raises(TeacherError, match=f"loss.top_k is {too_many}"):
            require_serves(_state(top_k=too_many), client, plain)
        if hello.kinds.exact is not None:
            wide = hello.kinds.exact.max_vocab + 1
            with pytest.raises(TeacherError, match=f"asks all {wide} log-probs"):
                require_serves(_state(objective="exact_full_vocab", vocab=wide), client, plain)


class _RefusingLink:
    """A route's link whose teacher answers every SCORE with a refusal."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def collect(self, timeout_s=None):
        raise TeacherRefusing("teacher refused SCORE 75: UNSUPPORTED: SCORE names no adapter")


def test_a_route_whose_teacher_refuses_is_held_back_and_the_others_train():
    link, sides, said = _routed(["calc", "nav"])
    sides["nav"].link = _RefusingLink(sides["nav"].link)
    link.begin_update(2)
    trajs = _episodes(link, ["nav", "calc", "nav"])
    scored = link.collect()
    assert [s.traj for s in scored] == [trajs[1]]
    assert said == [("nav", 2, "its teacher refused its SCOREs (teacher refused SCORE 75: "
                               "UNSUPPORTED: SCORE names no adapter)")]


class _RefusingFrom(FakeTeacherClient):
    """nav's teacher: refuses every SCORE of the update of version ``from_version`` on."""

    from_version = 2

    def wait(self, ids, timeout_s=None):
        if self._version >= self.from_version:
            raise TeacherRefusing("teacher refused SCORE 75: UNSUPPORTED: SCORE names no "
                                  "adapter")
        return super().wait(ids, timeout_s)


@pytest.mark.slow  # one toy OPD run, a control socket and a teacher harness
def test_an_unserveable_swap_is_refused_and_the_run_completes_on_the_old_teacher(
        tmp_path, toy, monkeypatch, capsys):
    from miniverl.cli.app import run
    from miniverl.student import control
    from miniverl.student.control import ControlServer
    from miniverl.student.train import loop
    from miniverl.student.train.teacher import connect as teacher
    from miniverl.student.train.trainer import Trainer

    recipe = Recipe.model_validate(_data(tmp_path, cycles=4, rollouts_per_cycle=8))
    clients = {name: cls(toy.model, toy.tokenizer_fp, toy.vocab_size, name=f"{name}-teacher")
               for name, cls in (("calc", FakeTeacherClient), ("nav", _RefusingFrom))}
    # The teacher `teacher use` points nav at: the toy's tokenizer, named adapters only.
    harness = TeacherHarness(backend=FakeBackend(tokenizer_fp=toy.tokenizer_fp,
                                                 vocab_size=toy.vocab_size, adapters=SERVED))
    monkeypatch.setattr(control, "probe_teacher", lambda endpoint, timeout_s: None)
    monkeypatch.setattr(teacher, "new_client", lambda state, endpoint, **kw: harness.client(
        tokenizer_fp=toy.tokenizer_fp, vocab_size=toy.vocab_size,
        **({"adapter": kw["adapter"]} if kw.get("adapter") else {})))
    said = []
    log = loop.log_cycle

    def logging_then_swap(state, done):
        log(state, done)
        if state.step == 1:
            code = run(["teacher", "use", str(trainer.run.path), harness.endpoint,
                        "--route", "nav"])
            said.append((code, capsys.readouterr().err.strip().splitlines()))

    monkeypatch.setattr(loop, "log_cycle", logging_then_swap)
    trainer = Trainer(recipe, route_clients=clients, show_progress=False, write_report=False,
                      checkpoints=False)
    with harness, trainer, ControlServer(trainer):
        result = trainer.train()
    [(code, lines)] = said
    assert code == 1 and len(lines) == 1, lines
    assert "serves only named adapters (calc, chat)" in lines[0]
    assert result.status == "completed" and result.final_version == 4  # the run goes on
    refused = events(result.run_dir, "teacher_swap_refused")
    assert [e["route"] for e in refused if "route" in e] in ([], ["nav"])
    assert not events(result.run_dir, "teacher_changed")  # nav kept its old teacher
    # From version 2 nav's old teacher refuses its SCOREs: held back, not a failed run.
    held = [(e["route"], e["version"]) for e in events(result.run_dir, "route_held_back")]
    assert held and all(route == "nav" and version >= 2 for route, version in held)
    rows = [json.loads(line) for line in
            (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("phase") == "train"] == [1, 2, 3, 4]
