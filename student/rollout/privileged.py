"""The privileged-context teacher's view of a student trajectory, and the alignment map.

With ``teacher.mode: privileged_context`` the teacher reads the same conversation as
the student, except that its system message also carries
``env.privileged_context(task)`` (the answer, the JSON path, the SQL). The student
builds that view itself, so the teacher server needs nothing special:

1. :func:`build_teacher_view` replays the trajectory through an
   :class:`~miniverl.student.rollout.chat.EpisodeBuilder` whose system message is
   ``system + "\\n\\n" + privileged``: the opening context and every tool result are
   rendered by the same chat template, the model turns are appended verbatim (the ids
   the student sampled, never re-tokenized).
2. Segment by segment the two views must agree: the same number of spans with the same
   types, and every span after the system prompt the same ids (so the same length).
   Only the system span differs; each later segment is the student's run of ids
   shifted by a constant offset.
3. :meth:`TeacherView.map_positions` sends a student position ``p`` (which predicts
   ``tokens[p + 1]``) to the teacher position that predicts the same token, and checks
   that the target ids agree. The map is strictly increasing, so the reply's rows
   (one per position, in request order) line up with the student's positions as they
   are.

Anything that breaks the alignment (a template that renders a later segment
differently when the system message changes, a target id that differs, a trajectory
made with another tokenizer) raises :class:`~miniverl.common.errors.ProvenanceError`
or :class:`~miniverl.common.errors.TokenizerMismatch`; nothing is ever trained on a
guessed alignment. This module runs no model and sends nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from miniverl.common.errors import ConfigError, ProvenanceError, TokenizerMismatch
from miniverl.common.trajectory import Span, SpanType, Trajectory
from miniverl.student.environments import get_environment, make_tasks
from miniverl.student.rollout.chat import EpisodeBuilder

# How the privileged context joins the environment's system prompt.
SEPARATOR = "\n\n"


def teacher_system(system: str, privileged: str) -> str:
    """The privileged teacher's system message: the environment's, a blank line, the context."""
    return f"{system}{SEPARATOR}{privileged}" if privileged else system


def privileged_system(env: Any, task: Any) -> str:
    """The privileged view's system message for ``task``: the environment's, plus the
    task's privileged context (preparing or qualifying a privileged teacher; the rollout
    runner picks this at start, oracle traces through :func:`episode_system`)."""
    return teacher_system(env.system_prompt(), env.privileged_context(task))


def episode_system(env: Any, task: Any, privileged: bool) -> str:
    """The system message an episode of ``task`` opens with: the environment's, or
    :func:`privileged_system` in the privileged view."""
    return privileged_system(env, task) if privileged else env.system_prompt()


@dataclass
class TeacherView:
    """The teacher's tokens and spans, and the offset of each segment against the student's."""

    tokens: np.ndarray  # i4 [N_teacher]
    spans: list[Span]
    student_tokens: np.ndarray  # i4 [N_student]
    student_spans: list[Span]
    offsets: np.ndarray  # i8 [S]: teacher start - student start, per span
    trajectory_id: str

    def map_positions(self, positions_P: np.ndarray) -> np.ndarray:
        """Teacher positions predicting the same target tokens as ``positions_P`` (i4 [P])."""
        positions_P = np.asarray(positions_P, dtype=np.int64)
        if positions_P.size == 0:
            return np.zeros(0, np.int32)
        n = len(self.student_tokens)
        bad = positions_P[(positions_P < 0) | (positions_P >= n - 1)]
        if bad.size:
            raise ProvenanceError(
                f"trajectory {self.trajectory_id}: position {int(bad[0])} predicts no token of "
                f"a {n}-token sequence; positions must lie in [0, {n - 1})"
            )
        targets = positions_P + 1
        starts = np.array([s.start for s in self.student_spans], dtype=np.int64)
        segment = np.searchsorted(starts, targets, side="right") - 1
        if np.any(segment == 0) and self.student_spans[0].type == SpanType.SYSTEM:
            p = int(positions_P[segment == 0][0])
            raise ProvenanceError(
                f"trajectory {self.trajectory_id}: position {p} predicts a system-prompt "
                "token, which the privileged teacher reads differently; score only positions "
                "after the system prompt (loss.positions selects assistant tokens)"
            )
        mapped = positions_P + self.offsets[segment]
        # Segments were compared id by id when the view was built; this re-check guards
        # the map itself: a wrong offset would score the teacher on another token.
        inside = (mapped >= 0) & (mapped + 1 < len(self.tokens))
        differ = ~inside
        differ[inside] = (
            self.tokens[mapped[inside] + 1] != self.student_tokens[targets[inside]]
        )
        if np.any(differ):
            i = int(np.argmax(differ))
            raise ProvenanceError(
                f"trajectory {self.trajectory_id}: student position {int(positions_P[i])} "
                f"targets id {int(self.student_tokens[targets[i]])} but the teacher position "
                f"{int(mapped[i])} targets {self._id_at(int(mapped[i]) + 1)}; the views are "
                "not aligned"
            )
        return mapped.astype(np.int32)

    def _id_at(self, index: int) -> str:
        if 0 <= index < len(self.tokens):
            return f"id {int(self.tokens[index])}"
        return f"nothing (index {index} is outside its {len(self.tokens)} tokens)"


def _messages_by_role(traj: Trajectory) -> tuple[str, str, list[list[str]]]:
    """(system text, user prompt, tool-result groups in order) from the stored messages."""
    msgs = traj.messages
    if len(msgs) < 2 or msgs[0].get("role") != "system" or msgs[1].get("role") != "user":
        raise ProvenanceError(
            f"trajectory {traj.id} does not start with a system and a user message; the "
            "privileged teacher extends the system message, so the episode needs one"
        )
    groups: list[list[str]] = []
    previous = None
    for msg in msgs[2:]:
        if msg.get("role") == "tool":
            if previous != "tool":
                groups.append([])
            groups[-1].append(str(msg.get("content", "")))
        previous = msg.get("role")
    return str(msgs[0].get("content", "")), str(msgs[1].get("content", "")), groups


def _replay(traj: Trajectory, tokenizer, system: str, user: str, tools, groups) -> EpisodeBuilder:
    """The trajectory's turns replayed on a builder with another system message."""
    builder = EpisodeBuilder(tokenizer, system, user, tools)
    spans = traj.spans
    i = 2 if len(spans) > 1 and spans[1].type == SpanType.USER else 1
    tool_groups = iter(groups)
    while i < len(spans):
        span = spans[i]
        if span.type.trainable:
            j = i
            while j < len(spans) and spans[j].type.trainable:
                j += 1
            builder.add_model_turn(traj.tokens[spans[i].start : spans[j - 1].end])
            i = j
        elif span.type == SpanType.TOOL_RESULT:
            results = next(tool_groups, None)
            if results is None:
                raise ProvenanceError(
                    f"trajectory {traj.id}: tool-result segment at token {span.start} has no "
                    "tool message in the stored messages; the trajectory is inconsistent"
                )
            builder.add_tool_results(results)
            i += 1
        else:
            raise ProvenanceError(
                f"trajectory {traj.id}: a {span.type.value} segment at token {span.start} "
                "after the opening context; the privileged view cannot replay it"
            )
    return builder


def build_teacher_view(
    traj: Trajectory,
    tokenizer,
    *,
    tokenizer_fp: str,
    tools: list[dict] | None,
    privileged: str,
) -> TeacherView:
    """Replay ``traj`` with ``privileged`` added to its system message; verify every segment."""
    if traj.tokenizer_fp != tokenizer_fp:
        raise TokenizerMismatch(
            f"trajectory {traj.id} was made with tokenizer {traj.tokenizer_fp}, but the "
            f"privileged view is rendered with {tokenizer_fp}; the teacher's view must use "
            "the tokenizer that made the trajectory"
        )
    system, user, groups = _messages_by_role(traj)
    if not traj.spans or traj.spans[0].type != SpanType.SYSTEM:
        raise ProvenanceError(
            f"trajectory {traj.id}: the chat template does not render the system message "
            "as its own segment, so the privileged context cannot be added to it alone"
        )
    builder = _replay(traj, tokenizer, teacher_system(system, privileged), user, tools, groups)
    student, teacher = traj.spans, builder.spans
    if [s.type for s in student] != [s.type for s in teacher]:
        raise ProvenanceError(
            f"trajectory {traj.id}: the teacher's view has segments "
            f"{[s.type.value for s in teacher]}, the student's {[s.type.value for s in student]}; "
            "the chat template renders the conversation differently when the system "
            "message changes"
        )
    offsets = np.zeros(len(student), dtype=np.int64)
    for k, (s, t) in enumerate(zip(student, teacher, strict=True)):
        offsets[k] = t.start - s.start
        if k == 0:
            continue
        if s.end - s.start != t.end - t.start:
            raise ProvenanceError(
                f"trajectory {traj.id}: segment {k} ({s.type.value}) is {s.end - s.start} "
                f"tokens for the student but {t.end - t.start} for the teacher; the chat "
                "template renders it differently when the system message changes, so the "
                "privileged view cannot be aligned (use teacher.mode: standard)"
            )
        a = traj.tokens[s.start : s.end]
        b = builder.tokens[t.start : t.end]
        if a != b:
            at = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
            raise ProvenanceError(
                f"trajectory {traj.id}: segment {k} ({s.type.value}) differs at token "
                f"{s.start + at}: id {a[at]} for the student, {b[at]} for the teacher; the "
                "stored messages do not re-render to the stored tokens"
            )
    return TeacherView(
        tokens=np.asarray(builder.tokens, dtype=np.int32),
        spans=list(teacher),
        student_tokens=np.asarray(traj.tokens, dtype=np.int32),
        student_spans=list(student),
        offsets=offsets,
        trajectory_id=traj.id,
    )


class PrivilegedViews:
    """The ``view`` hook a :class:`~miniverl.student.train.teacher.link.TeacherLink` applies.

    ``task_of(traj)`` returns the :class:`~miniverl.student.environments.Task` a
    trajectory played (its privileged context is computed from it). Calling the object
    with ``(traj, positions_P)`` returns the teacher's ``(tokens_N, positions_P)``.
    """

    def __init__(
        self,
        tokenizer,
        *,
        tokenizer_fp: str,
        env_name: str,
        env_params: dict[str, Any] | None,
        task_of: Callable[[Trajectory], Any],
    ):
        self.tokenizer = tokenizer
        self.tokenizer_fp = tokenizer_fp
        self.env_name = env_name
        self.env_params = dict(env_params or {})
        self.task_of = task_of
        self.tools = get_environment(env_name, **self.env_params).tool_specs()

    def view(self, traj: Trajectory) -> TeacherView:
        if traj.environment != self.env_name:
            raise ConfigError(
                f"trajectory {traj.id} is from environment {traj.environment!r}, the recipe's "
                f"is {self.env_name!r}; the privileged teacher needs the task's environment"
            )
        task = self.task_of(traj)
        privileged = get_environment(self.env_name, **self.env_params).privileged_context(task)
        return build_teacher_view(
            traj, self.tokenizer, tokenizer_fp=self.tokenizer_fp, tools=self.tools,
            privileged=privileged,
        )

    def __call__(self, traj: Trajectory, positions_P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        view = self.view(traj)
        return view.tokens, view.map_positions(positions_P)


def task_lookup(env_name: str, env_params: dict[str, Any] | None, difficulty: str,
                split_seed: int, sizes: dict[str, int], known: list[Any] | None = None):
    """A ``task_of(traj)`` that finds a trajectory's task by id in the recipe's splits.

    ``known`` tasks (the trainer's train split) are indexed at once; another split is
    generated the first time one of its trajectories asks.
    """
    by_id: dict[str, Any] = {t.id: t for t in (known or [])}
    made: set[str] = {t.split for t in (known or [])}

    def task_of(traj: Trajectory) -> Any:
        if traj.task_id not in by_id and traj.split not in made and traj.split in sizes:
            made.add(traj.split)
            for t in make_tasks(env_name, traj.split, sizes[traj.split], difficulty,
                                split_seed, params=env_params):
                by_id.setdefault(t.id, t)
        task = by_id.get(traj.task_id)
        if task is None:
            raise ProvenanceError(
                f"trajectory {traj.id}: task {traj.task_id!r} is not in the recipe's "
                f"{traj.split} split of {env_name!r}; the privileged teacher needs the task "
                "(same environment, params, difficulty and split_seed as when it was made)"
            )
        return task

    return task_of
