"""Oracle trajectories: an environment's scripted solution, tokenized like a rollout.

``oracle_trajectory`` plays ``env.oracle_actions(task)`` through the real tools
(``env.step``) and builds the episode with the same
:class:`~miniverl.student.rollout.chat.EpisodeBuilder` a rollout uses. Each assistant action is
rendered exactly as the chat template renders an assistant message (Hermes
``<tool_call>`` blocks for calls, plain text for the final answer), tokenized, and
stored as the model span of that turn; tool results and headers are context. SFT
trains on these, and the toy teacher becomes competent on them.

This module runs no model. A trace whose final answer does not verify is a bug in
the environment and raises :class:`~miniverl.common.errors.ProvenanceError`.
"""

from __future__ import annotations

from typing import Any

from miniverl.common.errors import ProvenanceError
from miniverl.common.trajectory import StopReason, ToolCallStats, Trajectory
from miniverl.student.environments import FinalAnswer, ToolCall, get_environment
from miniverl.student.rollout.chat import EpisodeBuilder
from miniverl.student.rollout.privileged import episode_system


def oracle_trajectory(
    env_name: str,
    task: Any,
    tokenizer,
    tokenizer_fp: str,
    env_params: dict[str, Any] | None = None,
    *,
    privileged: bool = False,
) -> Trajectory:
    """The oracle's episode for ``task`` as a verified trajectory (``source="oracle"``).

    ``privileged``: in the privileged teacher's view (the task's privileged context in
    the system message), to prepare such a teacher on the view it scores with."""
    env = get_environment(env_name, **(env_params or {}))
    env.reset(task)
    builder = EpisodeBuilder(tokenizer, episode_system(env, task, privileged), task.prompt,
                             env.tool_specs())
    by_name: dict[str, int] = {}
    failed = 0
    verdict = None
    for action in env.oracle_actions(task):
        if isinstance(action, ToolCall):
            call = {"name": action.name, "arguments": action.arguments}
            turn = builder.add_model_turn(builder.assistant_ids("", [call]))
            parsed = [(c.name, c.arguments) for c in turn.calls]
            if parsed != [(action.name, action.arguments)]:
                raise ProvenanceError(
                    f"oracle call {action.name}({action.arguments}) for task {task.id!r} does "
                    f"not parse back from its rendering (got {parsed}); the chat template and "
                    "the Hermes parser disagree"
                )
            result = env.step(action.name, action.arguments)
            by_name[action.name] = by_name.get(action.name, 0) + 1
            failed += result.startswith("error")
            builder.add_tool_results([result])
        elif isinstance(action, FinalAnswer):
            turn = builder.add_model_turn(builder.assistant_ids(action.text))
            verdict = env.verify(task, turn.answer)
            break
        else:
            raise ProvenanceError(
                f"environment {env_name!r} returned an oracle action of type "
                f"{type(action).__name__}; expected ToolCall or FinalAnswer"
            )
    if verdict is None or not verdict.success:
        reason = verdict.reason if verdict is not None else "no final answer"
        raise ProvenanceError(
            f"oracle trace for task {task.id!r} of {env_name!r} does not verify ({reason}); "
            "the environment's oracle_actions or verifier is wrong"
        )
    return Trajectory(
        id=f"{env_name}/{task.id}/oracle",
        tokens=builder.tokens,
        spans=builder.spans,
        policy_version=0,
        tokenizer_fp=tokenizer_fp,
        environment=env_name,
        task_id=task.id,
        split=task.split,
        difficulty=task.difficulty,
        stop_reason=StopReason.FINAL_ANSWER,
        tool_calls=ToolCallStats(total=sum(by_name.values()), failed=failed, by_name=by_name),
        verifier=verdict,
        seed=task.seed,
        source="oracle",
        messages=builder.messages,
    )


def oracle_trajectories(
    env_name: str,
    tasks: list[Any],
    tokenizer,
    tokenizer_fp: str,
    env_params: dict[str, Any] | None = None,
    *,
    privileged: bool = False,
) -> list[Trajectory]:
    """:func:`oracle_trajectory` for each task, in order."""
    return [oracle_trajectory(env_name, t, tokenizer, tokenizer_fp, env_params,
                              privileged=privileged) for t in tasks]
