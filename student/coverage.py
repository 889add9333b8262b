"""State coverage: how many of the states a policy visits its fixed set ever shows.

A *state* is a turn-start prefix: the token ids of an episode up to the first token of
one of its assistant turns (``tokens[:s]``, ``s`` the start of a model span that follows
a context span), the context the policy answers from at that turn. An episode of ``T``
assistant turns has ``T`` states; the first is its prompt. :func:`state_coverage`
counts the states of ``episodes`` that are not a turn-start prefix of any ``reference``
episode: the share of the student's own states that imitation of the reference never
trained on (the exposure-bias figure; Ross et al. 2011, Agarwal et al. 2024). Under a
chat template an assistant turn starts only after the assistant header, so "a prefix of
a reference episode that ends at a turn start" and "a reference episode's turn-start
prefix" are the same thing.

Held-out evaluation tasks never occur in a training set, so against the fixed set as
it stands every first state would be unseen. :func:`coverage_reference` therefore plays
the fixed set's *source* on the evaluated tasks: their oracle traces (``sft``, and
``offline_kd`` on ``fixed_set: oracle``), or the teacher's own episodes of them
(``fixed_set: teacher``, played once per split and kept in the eval folder). A fixed
set that is not a function of the task (a ``trajectories`` file, frozen ``student``
states) and a mode without one get no coverage figure.

This module does not train or score.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from miniverl.common.qualification import PRIVILEGED
from miniverl.common.recipe import Recipe
from miniverl.common.trajectory import Trajectory, read_trajectories, write_trajectories
from miniverl.student.rollout.oracle import oracle_trajectories
from miniverl.student.teacher_play import play_as_teacher


def turn_starts(traj: Trajectory) -> list[int]:
    """Token index of the first token of each assistant turn."""
    starts = []
    for i, span in enumerate(traj.spans):
        if span.type.trainable and (i == 0 or not traj.spans[i - 1].type.trainable):
            starts.append(span.start)
    return starts


def _states(traj: Trajectory) -> list[bytes]:
    ids = np.asarray(traj.tokens, dtype=np.int64)
    return [hashlib.blake2b(ids[:s].tobytes(), digest_size=16).digest()
            for s in turn_starts(traj)]


def state_coverage(episodes: list[Trajectory], reference: list[Trajectory]) -> dict[str, Any]:
    """``{"states", "unseen", "unseen_share", "reference_episodes"}``: the turn-start
    states of ``episodes``, how many are no turn-start prefix of any ``reference``
    episode, that share (None without states) and the reference's size."""
    known = {state for traj in reference for state in _states(traj)}
    visited = [state for traj in episodes for state in _states(traj)]
    unseen = sum(state not in known for state in visited)
    return {"states": len(visited), "unseen": unseen,
            "unseen_share": unseen / len(visited) if visited else None,
            "reference_episodes": len(reference)}


def reference_source(recipe: Recipe) -> str | None:
    """``oracle``, ``teacher`` or None: what the run's fixed set is made of, when that is
    a function of the task."""
    mode, train = recipe.run.mode, recipe.train
    if train.fixed_set == "teacher":
        return "teacher"
    if mode == "sft" or (mode == "offline_kd" and train.fixed_set in (None, "oracle")
                         and train.trajectories is None):
        return "oracle"
    return None


def coverage_reference(recipe: Recipe, tasks: list[Any], seeds: list[int], tokenizer: Any,
                       tokenizer_fp: str, *, split: str, out_dir: str | Path | None,
                       offline: bool = False) -> list[Trajectory] | None:
    """The fixed set's source played on ``tasks`` (see the module docstring), or None."""
    source = reference_source(recipe)
    env = recipe.environment
    if recipe.environments is not None:
        return None  # a mixture's sft: its states are not read against one environment's
    if source == "oracle":
        return oracle_trajectories(env.name, tasks, tokenizer, tokenizer_fp, env.params,
                                   privileged=recipe.rollout.view == PRIVILEGED)
    if source != "teacher":
        return None
    # The teacher is frozen: its episodes of one split are played once per run folder.
    kept = Path(out_dir) / f"{split}.teacher.trajectories.jsonl" if out_dir else None
    wanted = [t.id for t in tasks]
    if kept is not None and kept.is_file():
        reference = read_trajectories(kept)
        if [t.task_id for t in reference] == wanted:
            return reference
    reference = play_as_teacher(recipe, tasks, seeds, tokenizer, tokenizer_fp,
                                offline=offline).trajectories
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        write_trajectories(kept, reference)
    return reference
