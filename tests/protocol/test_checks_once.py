"""Each check of a SCORE and its SCORE_OK runs once on each side of the wire.

docs/protocol.md ("Where each check runs") names one place per check and side. One
SCORE goes from the real client to the real teacher server (``miniverl.testing``'s
harness: in memory, one process) and back; every check is wrapped where that page says
it runs, and each must have run exactly once.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

import miniverl.protocol.codec as codec
import miniverl.protocol.pending as pending
import miniverl.teacher_server.batcher as batcher
import miniverl.teacher_server.server as server
from miniverl.protocol import checks
from miniverl.protocol import client as client_module
from miniverl.testing import TeacherHarness

TOKENS = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9], np.int32)
CU = np.array([0, 5, 9], np.int32)
POS = np.array([0, 1, 2, 5, 6], np.int32)


def test_one_score_meets_each_check_once_per_side(monkeypatch):
    calls: Counter[str] = Counter()

    def counted(module, name, label):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            key = label(*args) if callable(label) else label
            if key is not None:  # None: a message this test does not follow (HELLO, PING)
                calls[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(client_module, "validate_score", "client: validate_score")
    counted(server, "check_score", "teacher: check_score")
    counted(codec, "check_limits", lambda msg, *_: f"check_limits on a {msg.t} received"
            if msg.t in ("SCORE", "SCORE_OK") else None)
    # Inside checks.py: validate_score's own call (the client's), and the SCORE size rule
    # that validate_score (client) and check_limits (teacher, in decode) share.
    counted(checks, "check_score", "client: check_score, inside validate_score")
    counted(checks, "_score_sizes", "SCORE size limits, once a side")
    counted(pending, "accept_reply", "client: accept_reply")
    counted(pending, "reply_problem", "client: reply_problem")
    counted(checks, "nonfinite_report", "client: nonfinite_report")
    counted(batcher, "nonfinite_report", "teacher: nonfinite_report")
    with TeacherHarness() as h, h.client() as client:
        client.set_version(2)
        client.bind()
        rid = client.submit(TOKENS, CU, POS, kind="topk", k=4)
        (result,) = client.wait([rid]).values()
    assert result.student_version == 2 and result.arrays["ids"].shape == (5, 4)
    assert calls == {
        "client: validate_score": 1, "teacher: check_score": 1,
        "client: check_score, inside validate_score": 1, "SCORE size limits, once a side": 2,
        "check_limits on a SCORE received": 1, "check_limits on a SCORE_OK received": 1,
        "client: accept_reply": 1, "client: reply_problem": 1,
        "client: nonfinite_report": 1, "teacher: nonfinite_report": 1,
    }
