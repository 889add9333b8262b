"""The swap memory strategy when the teacher refuses PARK/WAKE (no admin proof).

An attached student without the teacher's admin token cannot move the teacher's
weights; the run keeps the teacher resident, says so once, and goes on.
"""

from __future__ import annotations

from types import SimpleNamespace

from miniverl.common.errors import Unauthorized
from miniverl.student.train.teacher import connect as teacher
from miniverl.student.train.teacher.link import TeacherSide


class _Client:
    def __init__(self, refuse: bool):
        self.refuse, self.calls = refuse, []

    def park(self):
        self._call("park")

    def wake(self):
        self._call("wake")

    def _call(self, what):
        self.calls.append(what)
        if self.refuse:
            raise Unauthorized(f"teacher refused {what.upper()}: UNAUTHORIZED: no proof")


def _state(refuse: bool, monkeypatch):
    events, manifest = [], {}
    monkeypatch.setattr(teacher, "update_manifest", lambda run, **kw: manifest.update(kw))
    run = SimpleNamespace(event=lambda name, **kw: events.append((name, kw)))
    state = SimpleNamespace(
        teacher=TeacherSide(client=_Client(refuse), memory="swap"), run=run, version=3,
        recipe=SimpleNamespace(teacher=SimpleNamespace(memory="swap")),
        policy=SimpleNamespace(device=SimpleNamespace(type="cpu")))
    return state, events, manifest


def test_an_admitted_swap_parks_and_wakes(monkeypatch):
    state, events, _ = _state(False, monkeypatch)
    teacher.wake(state)
    teacher.park(state)
    assert state.teacher.client.calls == ["wake", "park"] and state.teacher.memory == "swap"
    assert events == []


def test_a_refused_swap_degrades_to_resident_and_says_so(monkeypatch):
    # Users rely on: a run attached without the token still trains (teacher resident).
    state, events, manifest = _state(True, monkeypatch)
    teacher.wake(state)
    assert state.teacher.memory == "resident"
    [(name, fields)] = events
    assert name == "memory_swap_refused" and fields["version"] == 3
    assert "UNAUTHORIZED" in fields["reason"] and "stays resident" in fields["reason"]
    assert manifest["memory"]["chosen"] == "resident"


def test_the_client_is_built_with_the_recipe_keys_unless_flags_name_others(monkeypatch):
    # Users rely on: teacher.curve_* in the recipe is enough; flags override it.
    loaded = []
    monkeypatch.setattr(teacher, "load_curve_client_keys", lambda *f: loaded.append(f) or f)
    recipe_teacher = SimpleNamespace(curve_secret_key="r.key_secret", curve_server_key="r.key")
    state = SimpleNamespace(teacher=TeacherSide(endpoint="tcp://127.0.0.2:5555"),
                            recipe=SimpleNamespace(teacher=recipe_teacher))
    assert teacher.client_proof(state) == {"curve": ("r.key_secret", "r.key"),
                                           "admin_token_file": None}
    state.teacher.curve = ("f.key_secret", "f.key")
    state.teacher.admin_token_file = "t.admin-token"
    assert teacher.client_proof(state) == {"curve": ("f.key_secret", "f.key"),
                                           "admin_token_file": "t.admin-token"}
