"""The student's side of ``xvocab`` (docs/cross-tokenizer.md): what it sends for a
trajectory and what it trains on from the reply.

A teacher with another tokenizer (``teacher.tokenizer: other``) is sent each
trajectory's messages and tool schemas, rendered by the student's chat template
(``protocol/xvocab.py``, ``xvocab_request``). The student's tokens of that rendering
must be the trajectory's own tokens (the rendering may add the template's last
newline). They are not when the model wrote bytes that are not UTF-8 (a byte-level
student can): the messages then hold replacement characters, no rendering holds the
bytes the student trained on, and the trajectory is sent nothing and trained on
nowhere; :attr:`XvocabRequests.unaligned` counts them.

The teacher's reply is over its own positions. :func:`student_targets` turns it into
per-position targets over the trajectory's selected positions, the group sampled-token
estimator of ``student/train/cross_vocab.py``: for each trainable group whose student
positions were all selected (a position ``p`` predicts token ``p + 1``) and whose
teacher tokens were all scored, every position of the group carries the teacher's
log-prob of the group's bytes (``target_logprobs``, the sum of its tokens' log-probs,
``group_logprob_G``) and the first one ``group_first = 1``. Other positions are dropped:
a group that crosses a provenance boundary or holds template bytes is not trained on
(``common/alignment.py``). The objective (``objectives/group_sampled_token.py``)
subtracts the student's log-prob of the same bytes.

This module does not send (``teacher_link.py``), compute a loss or align.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import Trajectory
from miniverl.protocol.xvocab import alignment_of_groups, xvocab_request
from miniverl.student.environments import get_environment
from miniverl.student.train.cross_vocab import group_logprob_G

ARRAYS = ("target_logprobs", "group_first")


class XvocabRequests:
    """Builds the xvocab request of a trajectory with the student's ``tokenizer``; the
    tool schemas are the trajectory's environment's (``tool_specs``)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._tools: dict[str, list[dict[str, Any]]] = {}
        self.sent = 0  # trajectories sent
        self.unaligned = 0  # trajectories whose rendering is not their tokens: not sent

    def tools(self, environment: str) -> list[dict[str, Any]]:
        if environment not in self._tools:
            self._tools[environment] = list(get_environment(environment).tool_specs())
        return self._tools[environment]

    def __call__(self, traj: Trajectory) -> dict[str, Any] | None:
        """The request of ``traj``, or None when its rendering is not its tokens."""
        if not traj.messages:
            raise ConfigError(f"trajectory {traj.id} has no messages: an xvocab teacher "
                              "renders the messages; record them (rollouts do)")
        req = xvocab_request(self.tokenizer, traj.messages, self.tools(traj.environment))
        ids, tokens = req["ids"], np.asarray(traj.tokens, dtype=np.int64)
        if ids.shape[0] < tokens.shape[0] or not np.array_equal(ids[:tokens.shape[0]], tokens):
            self.unaligned += 1
            return None
        self.sent += 1
        return req


def student_targets(traj: Trajectory, positions_P: np.ndarray,
                    arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(positions, arrays)`` to train on from an xvocab reply (see the module doc):
    ``positions`` the kept student positions (sorted, a subset of ``positions_P``),
    ``arrays`` ``target_logprobs f4[P]`` and ``group_first i4[P]``."""
    alignment = alignment_of_groups(arrays["groups"])
    n_teacher = int(arrays["teacher_ids"].shape[0])
    teacher_lp_T = np.zeros(n_teacher, dtype=np.float64)
    scored_T = np.zeros(n_teacher, dtype=bool)
    tokens_T = np.asarray(arrays["positions"], dtype=np.int64) + 1
    teacher_lp_T[tokens_T] = np.asarray(arrays["target_logprobs"], dtype=np.float64)
    scored_T[tokens_T] = True
    selected = np.zeros(len(traj.tokens), dtype=bool)
    selected[np.asarray(positions_P, dtype=np.int64)] = True
    a = alignment
    t_group_G = group_logprob_G(torch.from_numpy(teacher_lp_T), torch.from_numpy(a.teacher_start_G),
                                torch.from_numpy(a.teacher_end_G)).numpy()
    kept, target, first = [], [], []
    for g in np.flatnonzero(a.trainable_G):
        lo, hi = int(a.student_start_G[g]) - 1, int(a.student_end_G[g]) - 1  # positions
        ts, te = int(a.teacher_start_G[g]), int(a.teacher_end_G[g])
        if lo < 0 or hi > selected.shape[0] or not selected[lo:hi].all():
            continue
        if not scored_T[ts:te].all():
            continue
        kept.extend(range(lo, hi))
        target.extend([t_group_G[g]] * (hi - lo))
        first.extend([1] + [0] * (hi - lo - 1))
    return (np.asarray(kept, dtype=np.int32),
            {"target_logprobs": np.asarray(target, dtype=np.float32),
             "group_first": np.asarray(first, dtype=np.int32)})


def empty_targets() -> dict[str, np.ndarray]:
    """The arrays of a trajectory with nothing to train on."""
    return {"target_logprobs": np.zeros(0, np.float32), "group_first": np.zeros(0, np.int32)}
