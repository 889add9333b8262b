"""Testing my client code against a fake teacher, with nothing but ``miniverl.testing``.

The fixtures ``fake_teacher`` (a scriptable in-memory teacher) and
``fake_teacher_client`` (a real, connected ``SyncTeacherClient`` talking to it) come
from miniverl's pytest plugin. Each test scripts one way a teacher misbehaves and
checks what ``score_update`` (``my_client.py``) hands to the training loop.
"""

import numpy as np
import pytest
from my_client import score_update

from miniverl.testing import answer, drop, duplicate, reload, restart, stale

EPISODES = [np.array([1, 2, 3, 4, 5], np.int32), np.array([6, 7, 8, 9], np.int32)]


def test_every_position_of_every_episode_is_scored(fake_teacher_client):
    teacher, results = score_update(fake_teacher_client, EPISODES, version=3, k=4)
    assert teacher == ("teacher-A", 0)
    for tokens, result in zip(EPISODES, results, strict=True):
        assert result.student_version == 3
        assert result.arrays["ids"].shape == (len(tokens) - 1, 4)
        # The fake teacher's favourite is the token that actually follows.
        assert (result.arrays["ids"][:, 0] == tokens[1:]).all()


def test_stale_and_duplicate_replies_never_reach_the_training_loop(fake_teacher,
                                                                    fake_teacher_client):
    # Per SCORE: a reply for the previous policy version, the honest reply, two copies.
    fake_teacher.default = stale() + duplicate(copies=3)
    _, results = score_update(fake_teacher_client, EPISODES, version=5)
    assert [r.student_version for r in results] == [5, 5]
    assert fake_teacher_client.counters["stale_dropped"] == 3 * len(EPISODES)


def test_a_reload_mid_update_rescores_the_whole_update(fake_teacher, fake_teacher_client):
    fake_teacher.script(reload() + answer())  # the first SCORE meets a reload
    teacher, results = score_update(fake_teacher_client, EPISODES, version=1)
    assert teacher == ("teacher-A", 1)
    assert {(r.instance, r.gen) for r in results} == {("teacher-A", 1)}
    # The results are those of the SCOREs sent after the reload, one per episode.
    assert [msg.id for msg in fake_teacher.scores[-len(EPISODES):]] == [r.id for r in results]


def test_a_lost_request_is_resent_and_a_restart_is_survived(fake_teacher,
                                                            fake_teacher_client):
    fake_teacher.script(drop(), restart())
    teacher, results = score_update(fake_teacher_client, EPISODES, version=0)
    assert teacher[0] == "teacher-B" and {r.instance for r in results} == {"teacher-B"}


def test_a_hung_teacher_is_reported_not_waited_for(fake_teacher):
    with fake_teacher.client(unavailable_timeout_s=0.5) as client:
        fake_teacher.silent = True
        with pytest.raises(ConnectionError, match="has not answered"):
            score_update(client, EPISODES, version=0)
