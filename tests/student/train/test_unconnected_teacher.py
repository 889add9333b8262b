"""A run's teacher side before it connects (``student/train/teacher/link.py``,
``connect.py``).

What a user relies on: scoring through, parking or waking a teacher the run has not
connected is one error naming where it gets connected, never a ``None`` failing deep in
an update; a run with no teacher endpoint at all is one ``ConfigError`` naming the ways
to give it one; and a teacher with another tokenizer behind a client that cannot send its
xvocab SCOREs is refused when the link is made, not at the first episode.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from miniverl.common.errors import ConfigError
from miniverl.student.train.teacher.connect import new_client, teacher_link
from miniverl.student.train.teacher.link import TeacherSide
from miniverl.student.train.teacher.routed import RoutedLink


def test_an_unconnected_teacher_side_scores_nothing_and_says_why():
    side = TeacherSide()
    assert not side.connected and side.counters() == {}
    calls = (lambda: side.link.begin_update(3), lambda: side.link.submit(None, np.zeros(1)),
             side.link.collect, side.park, side.wake)
    for call in calls:
        with pytest.raises(RuntimeError, match="not connected yet: teacher/connect.py"):
            call()
    side.link = RoutedLink(sides={}, route_of={})  # what connect binds for several teachers
    assert side.connected


def test_a_run_without_a_teacher_endpoint_is_one_config_error():
    state = SimpleNamespace(recipe=SimpleNamespace(runtime=None, teacher=None),
                            teacher=TeacherSide())
    with pytest.raises(ConfigError, match=r"teacher.endpoint is null.*--teacher ENDPOINT"):
        new_client(state)


def test_a_client_without_xvocab_scores_is_refused_for_a_teacher_with_another_tokenizer():
    recipe = SimpleNamespace(teacher=SimpleNamespace(tokenizer="other"),
                             loss=SimpleNamespace(top_k=4, temperature=1.0),
                             run=SimpleNamespace(deterministic=False),
                             runtime=SimpleNamespace(unavailable_timeout_s=1.0))
    state = SimpleNamespace(recipe=recipe, stop_event=None)
    with pytest.raises(ConfigError, match="needs xvocab SCOREs, which the SimpleNamespace"):
        teacher_link(state, SimpleNamespace(), lambda *_: None)
