"""The student's side of ``xvocab`` (docs/cross-tokenizer.md): what it sends for a
trajectory and what it trains on from the reply.

A teacher with another tokenizer (``teacher.tokenizer: other``) is sent each
trajectory's messages and tool schemas, rendered by the student's chat template
(``protocol/xvocab.py``, ``xvocab_request``). The student's tokens of that rendering
must be the trajectory's own tokens (the rendering may add the template's last
newline). They are not when the model wrote bytes that are not UTF-8 (a byte-level
student can): the messages then hold replacement characters, no rendering holds the
bytes the student trained on, and the trajectory is sent nothing and trained on
nowhere; :attr:`XvocabRequests.unaligned` counts them. An episode over the teacher's
limits (``max_episode_bytes``) is refused by the client before it is sent, and is sent
nothing and trained on nowhere too (:attr:`XvocabLink.too_large`).

The teacher's reply is over its own positions. :func:`student_targets` turns it into
per-position targets over the trajectory's selected positions, the group sampled-token
estimator of ``student/train/teacher/cross_vocab.py``: for each trainable group whose student
positions were all selected (a position ``p`` predicts token ``p + 1``) and whose
teacher tokens were all scored, every position of the group carries the teacher's
log-prob of the group's bytes (``target_logprobs``, the sum of its tokens' log-probs,
``group_logprob_G``) and the first one ``group_first = 1``. Other positions are dropped:
a group that crosses a provenance boundary or holds template bytes is not trained on
(``common/alignment.py``). The objective (``objectives/group_sampled_token.py``)
subtracts the student's log-prob of the same bytes. With ``loss.cross_vocab`` ``uld``
or ``hybrid`` each kept group also carries one row on its first position
(:func:`group_rows`): the teacher's top-k merged over the group, or, for a hybrid
group that is one token per side and a pair of the :class:`VocabMap`, the teacher's
top-k carried into the student's vocabulary (``objectives/group_uld.py`` reads them).

:class:`XvocabLink` is the teacher link of such a run (``link.py``): it sends
the request :class:`XvocabRequests` builds and turns each reply into these targets.

This module does not compute a loss or align.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeGuard

import numpy as np
import torch

from miniverl.common.errors import ConfigError
from miniverl.common.trajectory import Trajectory
from miniverl.protocol.messages import ErrorCode, ProtocolViolation
from miniverl.protocol.scoring_client import ScoringClient
from miniverl.protocol.xvocab import alignment_of_groups, xvocab_request
from miniverl.student.environments import get_environment
from miniverl.student.train.teacher.cross_vocab import (
    PROB_EPS,
    VocabMap,
    group_logprob_G,
    merge_group_topk,
    project_topk,
)
from miniverl.student.train.teacher.link import Scored, TeacherLink, _Job

ARRAYS = ("target_logprobs", "group_first")
CROSS_VOCAB = ("sampled_token", "hybrid", "uld")  # the values of loss.cross_vocab


class XvocabRequests:
    """Builds the xvocab request of a trajectory with the student's ``tokenizer``; the
    tool schemas are those the rollout showed: the trajectory's environment made with its
    own params (``env_params``, by environment name: ``environment.params``, or each
    member's of ``environments:``; ``calculator`` with ``units: false`` has one tool,
    not two, and a rendering with the other schemas is not the episode). An environment
    ``env_params`` does not name is made with its defaults."""

    def __init__(self, tokenizer: Any, env_params: dict[str, dict[str, Any]] | None = None):
        self.tokenizer = tokenizer
        self.env_params = {name: dict(params or {}) for name, params in (env_params or {}).items()}
        self._tools: dict[str, list[dict[str, Any]]] = {}
        self.sent = 0  # trajectories sent
        self.unaligned = 0  # trajectories whose rendering is not their tokens: not sent

    def tools(self, environment: str) -> list[dict[str, Any]]:
        if environment not in self._tools:
            env = get_environment(environment, **self.env_params.get(environment, {}))
            self._tools[environment] = list(env.tool_specs())
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


def student_targets(traj: Trajectory, positions_P: np.ndarray, arrays: dict[str, np.ndarray],
                    cross_vocab: str = "sampled_token", vmap: VocabMap | None = None,
                    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(positions, arrays)`` to train on from an xvocab reply (see the module doc):
    ``positions`` the kept student positions (sorted, a subset of ``positions_P``),
    ``arrays`` ``target_logprobs f4[P]`` and ``group_first i4[P]``; with
    ``cross_vocab`` ``uld`` or ``hybrid`` also each group's row (:func:`group_rows`)."""
    if cross_vocab not in CROSS_VOCAB:
        raise ConfigError(f"loss.cross_vocab={cross_vocab!r} is not one of "
                          f"{', '.join(CROSS_VOCAB)}; fix the recipe")
    if cross_vocab == "hybrid" and vmap is None:
        raise ConfigError("loss.cross_vocab: hybrid needs the vocabulary map of the two "
                          "tokenizers (student/train/teacher/cross_vocab.py, vocab_map)")
    alignment = alignment_of_groups(arrays["groups"])
    n_teacher = int(arrays["teacher_ids"].shape[0])
    teacher_lp_T = np.zeros(n_teacher, dtype=np.float64)
    row_T = np.full(n_teacher, -1, dtype=np.int64)  # the reply row scoring each token
    tokens_T = np.asarray(arrays["positions"], dtype=np.int64) + 1
    teacher_lp_T[tokens_T] = np.asarray(arrays["target_logprobs"], dtype=np.float64)
    row_T[tokens_T] = np.arange(tokens_T.shape[0])
    selected = np.zeros(len(traj.tokens), dtype=bool)
    selected[np.asarray(positions_P, dtype=np.int64)] = True
    a = alignment
    t_group_G = group_logprob_G(torch.from_numpy(teacher_lp_T), torch.from_numpy(a.teacher_start_G),
                                torch.from_numpy(a.teacher_end_G)).numpy()
    kept: list[int] = []
    target: list[float] = []
    first: list[int] = []
    groups: list[tuple[int, int, int, int]] = []
    for g in np.flatnonzero(a.trainable_G):
        lo, hi = int(a.student_start_G[g]) - 1, int(a.student_end_G[g]) - 1  # positions
        ts, te = int(a.teacher_start_G[g]), int(a.teacher_end_G[g])
        if lo < 0 or hi > selected.shape[0] or not selected[lo:hi].all():
            continue
        if (row_T[ts:te] < 0).any():
            continue
        kept.extend(range(lo, hi))
        target.extend([t_group_G[g]] * (hi - lo))
        first.extend([1] + [0] * (hi - lo - 1))
        groups.append((lo, hi, ts, te))
    out = {"target_logprobs": np.asarray(target, dtype=np.float32),
           "group_first": np.asarray(first, dtype=np.int32)}
    if cross_vocab != "sampled_token":
        out.update(group_rows(traj, arrays, row_T, groups, vmap if cross_vocab == "hybrid"
                              else None, len(kept)))
    return np.asarray(kept, dtype=np.int32), out


def group_rows(traj: Trajectory, arrays: dict[str, np.ndarray], row_T: np.ndarray,
               groups: list[tuple[int, int, int, int]], vmap: VocabMap | None,
               n_kept: int) -> dict[str, np.ndarray]:
    """The rows ``objectives/group_uld.py`` reads, on each group's first kept position:
    ``group_exact i4[P]`` (with ``vmap``: the group is one token per side, the two a
    pair of the map, and some of the teacher's top-k has a student twin), ``ids i4[P,
    K]`` and ``logprobs f4[P, K]`` (an exact group: the teacher's top-k in the
    student's vocabulary, ``project_topk``; any other: the teacher's top-k merged over
    the group, ``merge_group_topk``, ``observed``, as log-probs) and ``tail_logmass
    f4[P]`` (the mass outside the top-k, merged the same way). Other positions carry
    zeros (``-inf`` tails)."""
    k = int(arrays["ids"].shape[1])
    ids_PK = np.zeros((n_kept, k), dtype=np.int32)
    logprobs_PK = np.zeros((n_kept, k), dtype=np.float32)
    exact_P = np.zeros(n_kept, dtype=np.int32)
    tail_P = np.full(n_kept, -np.inf, dtype=np.float32)
    t_tail_R = torch.as_tensor(np.asarray(arrays["tail_logmass"], dtype=np.float64))
    t_ids_RK = torch.as_tensor(np.asarray(arrays["ids"], dtype=np.int64))
    t_lp_RK = torch.as_tensor(np.asarray(arrays["logprobs"], dtype=np.float64))
    t_actual_R = torch.as_tensor(np.asarray(arrays["target_logprobs"], dtype=np.float64))
    teacher_ids = np.asarray(arrays["teacher_ids"], dtype=np.int64)
    t_to_s = None if vmap is None else torch.as_tensor(vmap.teacher_to_student_W)
    p = 0
    for lo, hi, ts, te in groups:
        rows = torch.as_tensor(row_T[ts:te])
        if vmap is not None and t_to_s is not None and hi - lo == 1 and te - ts == 1:
            s_tok = int(traj.tokens[lo + 1])
            if (s_tok < vmap.student_to_teacher_V.shape[0]
                    and int(vmap.student_to_teacher_V[s_tok]) == int(teacher_ids[ts])):
                # Ids past the tokenizer (a model's padded vocabulary) have no twin.
                t_ids, t_lp = t_ids_RK[rows], t_lp_RK[rows]
                outside = t_ids >= t_to_s.shape[0]
                s_ids, s_lp = project_topk(t_ids.masked_fill(outside, 0),
                                           t_lp.masked_fill(outside, float("-inf")), t_to_s)
                if bool(torch.isfinite(s_lp).any()):
                    ids_PK[p], logprobs_PK[p], exact_P[p] = s_ids[0].numpy(), s_lp[0].numpy(), 1
                    p += hi - lo
                    continue
        # The tail bucket merges like one more entry of the row.
        row_RK1 = torch.cat([t_lp_RK[rows], t_tail_R[rows, None]], dim=1).exp()
        merged = merge_group_topk(row_RK1, t_actual_R[rows], torch.tensor([0]),
                                  torch.tensor([te - ts]), "observed")[0]
        logprobs_PK[p] = merged[:k].clamp_min(PROB_EPS).log().numpy()
        tail_P[p] = float(merged[k].clamp_min(0.0).log())
        p += hi - lo
    return {"ids": ids_PK, "logprobs": logprobs_PK, "tail_logmass": tail_P,
            "group_exact": exact_P}


def empty_targets(cross_vocab: str = "sampled_token", k: int = 1) -> dict[str, np.ndarray]:
    """The arrays of a trajectory with nothing to train on."""
    out = {"target_logprobs": np.zeros(0, np.float32), "group_first": np.zeros(0, np.int32)}
    if cross_vocab != "sampled_token":
        out.update(ids=np.zeros((0, k), np.int32), logprobs=np.zeros((0, k), np.float32),
                   tail_logmass=np.zeros(0, np.float32), group_exact=np.zeros(0, np.int32))
    return out


class XvocabClient(ScoringClient, Protocol):
    """A client that also sends xvocab SCOREs (docs/protocol.md, "xvocab"): the ZeroMQ
    client and the fake teacher's; an engine teacher's does not."""

    def submit_xvocab(self, episode: Any, student_cuts: Any, student_pieces: Any, *,
                      k: int = 16, temperature: float = 1.0, deadline_ms: int | None = None,
                      deterministic: bool = False) -> int: ...


def sends_xvocab(client: ScoringClient) -> TypeGuard[XvocabClient]:
    """Whether ``client`` can send the xvocab SCOREs of a teacher with another tokenizer."""
    return callable(getattr(client, "submit_xvocab", None))


@dataclass
class XvocabLink(TeacherLink):
    """The teacher link of ``teacher.tokenizer: other`` (kind ``xvocab``): a trajectory's
    request is its rendered messages (``xvocab``, an :class:`XvocabRequests`; None for a
    trajectory whose rendering is not its tokens: sent nothing, trained on nowhere), and
    a reply over the teacher's positions becomes targets over ours (:func:`student_targets`
    with ``cross_vocab`` and, for hybrid, the ``vocab_map`` of the two tokenizers);
    ``exact_groups`` / ``uld_groups`` count the groups each hybrid target trained."""

    # Its targets are over the aligned positions only (:func:`student_targets`).
    keeps_positions: ClassVar[bool] = False
    client: XvocabClient
    xvocab: XvocabRequests = field(kw_only=True)
    cross_vocab: str = "sampled_token"
    vocab_map: VocabMap | None = None
    exact_groups: int = 0
    uld_groups: int = 0
    too_large: int = 0  # episodes over the teacher's limits: not sent (_refused_here)
    on_too_large: Callable[[str], None] | None = None

    def counters(self) -> dict[str, Any]:
        """How many trajectories were sent (``xvocab_sent``), how many could not be
        aligned and how many were over the teacher's limits, both sent nothing and
        trained on nowhere (``xvocab_unaligned``, ``xvocab_too_large``); with
        ``loss.cross_vocab`` hybrid or uld, how many trained groups were exact pairs
        (``xvocab_exact_groups``) and how many ULD (``xvocab_uld_groups``)."""
        out = {"xvocab_sent": self.xvocab.sent, "xvocab_unaligned": self.xvocab.unaligned,
               "xvocab_too_large": self.too_large}
        if self.cross_vocab != "sampled_token":
            out.update(xvocab_exact_groups=self.exact_groups, xvocab_uld_groups=self.uld_groups)
        return out

    def _request(self, job: _Job) -> int | None:
        req = self.xvocab(job.traj)
        if req is None:  # its rendering is not its tokens: nothing to align
            return None
        try:
            return self.client.submit_xvocab(
                req["episode"], req["student_cuts"], req["student_pieces"], k=self.k,
                temperature=self.temperature, **self._flags)
        except ProtocolViolation as refused:
            self._refused_here(refused)
            return None  # sent nothing

    def _refused_here(self, refused: ProtocolViolation) -> None:
        """An episode over the teacher's limits (``max_episode_bytes``, ``max_tokens`` of
        its HELLO_OK), refused by the client before it is sent with the line the teacher
        would answer ``TOO_LARGE`` with: sent nothing, trained on nowhere, counted
        (``xvocab_too_large``) and said (``on_too_large``). Any other refusal is a bug
        of the request, raised."""
        if refused.code != ErrorCode.TOO_LARGE:
            raise refused
        self.xvocab.sent -= 1
        self.too_large += 1
        if self.on_too_large is not None:
            self.on_too_large(str(refused))

    def _scored(self, job: _Job, reply: Any, identity: dict[str, Any]) -> Scored:
        if reply is None:  # not sent (unaligned or nothing selected): trained on nowhere
            return Scored(job.traj, job.positions_P[:0], empty_targets(self.cross_vocab, self.k),
                          self.version, identity, "xvocab")
        positions_P, arrays = student_targets(job.traj, job.positions_P, reply.arrays,
                                              self.cross_vocab, self.vocab_map)
        if "group_exact" in arrays:
            groups = int(arrays["group_first"].sum())
            exact = int(arrays["group_exact"].sum())
            self.exact_groups += exact
            self.uld_groups += groups - exact
        return Scored(job.traj, positions_P, arrays, reply.student_version, identity, "xvocab")
