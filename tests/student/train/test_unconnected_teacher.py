"""A run's teacher side before it connects (``student/train/teacher/link.py``,
``connect.py``).

What a user relies on: scoring through, parking or waking a teacher the run has not
connected is one error naming where it gets connected, never a ``None`` failing deep in
an update; and a run with no teacher endpoint at all is one ``ConfigError`` naming the
ways to give it one.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from miniverl.common.errors import ConfigError
from miniverl.student.train.teacher.connect import new_client
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
