"""A run of one teacher outlasts a teacher that refuses its SCOREs (docs/training.md,
"A teacher that fails").

What a user relies on: a teacher that answers an update's SCOREs with a non-retryable
``ERROR`` (an adapter it no longer serves, a kind it does not give) is an unavailable
teacher, not a protocol error that ends the run at once. The update sends its SCOREs
again after a backoff, up to ``runtime.unavailable_timeout_s`` from the first refusal
(event ``teacher_refusing``); a teacher that serves again within it is trained on as
usual; past it the run stops with one line and event ``teacher_unavailable``, its
checkpoint at the last update boundary. The tests use ``miniverl.testing``'s fake
teacher over the real client, and bounded budgets (well under a second of backoff).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from miniverl.common.errors import TeacherRefusing, TeacherUnavailable
from miniverl.common.teacher_routes import Route
from miniverl.protocol.messages import ErrorCode
from miniverl.protocol.scoring_client import StopRequested
from miniverl.student.train.teacher.link import Patience, TeacherLink
from miniverl.student.train.teacher.routed import RoutedLink, RouteSide
from miniverl.testing import FakeTeacher, answer, error
from tests.toy_kit import events, make_recipe, metrics

REFUSED = error(ErrorCode.UNSUPPORTED, message="SCORE names no adapter")


def _link(client, budget_s, said):
    patience = Patience(budget_s, lambda name, **fields: said.append((name, fields)),
                        threading.Event(), first_s=0.05, most_s=0.2)
    link = TeacherLink(client, kind="topk", k=4, temperature=1.0, patience=patience)
    link.begin_update(3)
    for n in (6, 9):  # two episodes: stand-ins with the one field a plain link reads
        link.submit(SimpleNamespace(tokens=list(range(1, n + 1))), np.arange(n - 1))
    return link


def test_an_update_waits_out_refusals_and_trains_on_the_teachers_answers():
    teacher, said = FakeTeacher(), []
    teacher.script(*[REFUSED] * 4)  # two rounds of both SCOREs refused, then answered
    with teacher.client() as client:
        link = _link(client, budget_s=5.0, said=said)
        t0 = time.monotonic()
        scored = link.collect()
        waited = time.monotonic() - t0
    assert [len(s.positions_P) for s in scored] == [5, 8]
    assert all(s.arrays["ids"].shape == (len(s.positions_P), 4) for s in scored)
    assert all(s.student_version == 3 for s in scored)
    assert waited < 2.0, waited  # two backoffs of 0.05 and 0.1 s, not a timeout
    [(name, fields)] = said
    assert name == "teacher_refusing" and fields["version"] == 3 and fields["episodes"] == 2
    assert "UNSUPPORTED" in fields["why"] and fields["budget_s"] == 5.0
    assert teacher.count("SCORE") == 6  # 2 sent, then each sent again twice


def test_a_teacher_that_keeps_refusing_ends_the_run_in_one_line_within_its_budget():
    teacher, said = FakeTeacher(), []
    teacher.default = REFUSED
    with teacher.client() as client:
        link = _link(client, budget_s=0.6, said=said)
        t0 = time.monotonic()
        with pytest.raises(TeacherRefusing) as info:
            link.collect()
        waited = time.monotonic() - t0
    text = str(info.value)
    assert "\n" not in text and "runtime.unavailable_timeout_s=0.6" in text
    assert "UNSUPPORTED: SCORE names no adapter" in text and "--resume" in text
    assert 0.3 <= waited < 2.0, waited  # bounded by the budget, not by request timeouts
    assert isinstance(info.value, TeacherUnavailable)  # the loop checkpoints, then fails
    assert [name for name, _ in said] == ["teacher_refusing", "teacher_unavailable"]
    # No backoff starts that would end past the budget; the last re-send's refusal may
    # come one round trip later (29 ms past it on a loaded machine).
    assert said[1][1]["resent"] >= 2 and said[1][1]["waited_s"] <= 0.6 + 0.5


def test_a_silent_teacher_is_given_up_with_an_event_and_the_clients_own_line():
    # The client has already waited unavailable_timeout_s of silence (reconnecting):
    # the update does not wait again, it records why and ends.
    teacher, said = FakeTeacher(), []
    with teacher.client(unavailable_timeout_s=0.5) as client:
        teacher.silent = True  # from after its handshake: the update's SCOREs go unanswered
        link = _link(client, budget_s=5.0, said=said)
        with pytest.raises(TeacherUnavailable) as info:
            link.collect()
    assert "has not answered" in str(info.value)
    assert [name for name, _ in said] == ["teacher_unavailable"]


def test_a_stop_request_ends_the_wait_at_once():
    # What the trainer does on SIGTERM or `miniverl stop`: set the stop event and
    # interrupt the client. The backoff (1 s here) ends at once; the run stops as
    # interrupted at its update boundary.
    teacher, said = FakeTeacher(), []
    teacher.default = REFUSED
    with teacher.client() as client:
        stop = threading.Event()
        patience = Patience(30.0, lambda name, **fields: said.append(name), stop, first_s=1.0)
        link = TeacherLink(client, kind="topk", k=4, temperature=1.0, patience=patience)
        link.begin_update(0)
        link.submit(SimpleNamespace(tokens=[1, 2, 3]), np.arange(2))

        def stop_now():
            stop.set()
            client.interrupt("stop requested")

        threading.Timer(0.2, stop_now).start()
        t0 = time.monotonic()
        with pytest.raises(StopRequested):
            link.collect()
    assert time.monotonic() - t0 < 0.9
    assert said == ["teacher_refusing"]


def test_without_patience_a_refusal_is_raised_at_once():
    # A route of several teachers (no patience) is held back by routed.py instead.
    teacher = FakeTeacher()
    teacher.default = REFUSED
    with teacher.client() as client:
        link = TeacherLink(client, kind="topk", k=4, temperature=1.0)
        link.begin_update(0)
        link.submit(SimpleNamespace(tokens=[1, 2, 3]), np.arange(2))
        with pytest.raises(TeacherRefusing, match="UNSUPPORTED"):
            link.collect()
    assert teacher.count("SCORE") == 1


def test_a_route_alone_in_its_update_waits_out_refusals_and_one_with_others_is_held():
    calc, nav = FakeTeacher(), FakeTeacher(instance="teacher-N")
    nav.script(REFUSED, REFUSED)  # both of nav's SCOREs of the first update, once
    said, held = [], []
    with calc.client() as to_calc, nav.client() as to_nav:
        sides = {}
        for name, client in (("calc", to_calc), ("nav", to_nav)):
            patience = Patience(5.0, lambda event, **fields: said.append(event),
                                threading.Event(), first_s=0.05)
            route = Route(name=name, teacher=name, adapter=None, environments=(name,),
                          config=None)
            sides[name] = RouteSide(route, None, client=client, link=TeacherLink(
                client, kind="topk", k=4, temperature=1.0, patience=patience))
        link = RoutedLink(sides, {"calc": "calc", "nav": "nav"},
                          on_held=lambda route, n, why: held.append((route, n)))

        def update(version, envs):
            link.begin_update(version)
            trajs = [SimpleNamespace(environment=env, tokens=[1, 2, 3, 4]) for env in envs]
            for traj in trajs:
                link.submit(traj, np.arange(3))
            return trajs, link.collect()

        # Nothing but nav's episodes: waited for, as a run of one teacher waits.
        trajs, scored = update(1, ["nav", "nav"])
        assert [s.traj for s in scored] == trajs and held == []
        assert said == ["teacher_refusing"]
        # With calc's episode beside it, nav's refusal holds nav's back at once.
        nav.default = REFUSED
        trajs, scored = update(2, ["nav", "calc"])
        assert [s.traj for s in scored] == [trajs[1]] and held == [("nav", 1)]
        assert said == ["teacher_refusing"]


# -- a run of one teacher ----------------------------------------------------------------


def _run(tmp_path, teacher, **runtime):
    from miniverl.student.train.trainer import Trainer
    from tests.student.train.trainer_kit import scripted_client

    recipe = make_recipe("opd", tmp_path, cycles=3, sections={"runtime": runtime})
    trainer = Trainer(recipe, client=scripted_client(teacher), show_progress=False,
                      write_report=False)
    return trainer


@pytest.mark.slow  # a toy OPD run of three updates
def test_a_run_whose_teacher_refuses_one_update_completes(tmp_path, toy):
    from tests.student.train.trainer_kit import scripted_teacher

    teacher = scripted_teacher(toy)
    # Update 0's four SCOREs are answered; update 1's are refused once each.
    teacher.script(*[answer()] * 4, *[REFUSED] * 4)
    with _run(tmp_path, teacher) as trainer:
        result = trainer.train()
    assert result.status == "completed" and result.final_version == 3
    refusing = events(result.run_dir, "teacher_refusing")
    assert [(e["version"], e["episodes"]) for e in refusing] == [(1, 4)]
    assert not events(result.run_dir, "teacher_unavailable")
    assert [r["step"] for r in metrics(result.run_dir)] == [1, 2, 3]


@pytest.mark.slow  # a toy OPD run that stops in its second update
def test_a_run_whose_teacher_keeps_refusing_fails_in_one_line_with_a_checkpoint(
        tmp_path, toy):
    from tests.student.train.trainer_kit import scripted_teacher

    teacher = scripted_teacher(toy)
    teacher.script(*[answer()] * 4)
    teacher.default = REFUSED  # from update 1 on, every SCORE
    trainer = _run(tmp_path, teacher, unavailable_timeout_s=1.0)
    with trainer, pytest.raises(TeacherRefusing) as info:
        trainer.train()
    assert "\n" not in str(info.value) and "unavailable_timeout_s=1" in str(info.value)
    run_dir = trainer.run.path
    [gave_up] = events(run_dir, "teacher_unavailable")
    assert gave_up["version"] == 1 and gave_up["waited_s"] <= 1.0
    [failed] = events(run_dir, "run_failed")
    assert "refused this update's SCOREs" in failed["reason"]
    assert (run_dir / "checkpoints" / "step_1").is_dir()  # the update it finished is kept
