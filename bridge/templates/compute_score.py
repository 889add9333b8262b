"""Reward function for verl (``reward.custom_reward_function``), shipped in miniverl bundles.

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` once per
response. This file takes the final answer out of a Hermes-format response (the text of
the last assistant turn that makes no tool call) and asks the miniverl environment's own
verifier, so verl trains on exactly the reward miniverl evaluates with. It needs the
torch-free ``miniverl`` package importable in the verl environment (``pip install
miniverl``); it does not need torch, verl or the bundle's other files.

It never raises: a garbage response, a malformed row or an unknown environment scores
0.0. ``score_details`` returns the verifier's ``(success, score, reason)`` for checks such
as ``miniverl bridge doctor``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

DATA_SOURCE_PREFIX = "miniverl/"
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_SPECIAL = ("<|im_end|>", "<|endoftext|>")


def final_answer(solution_str: object) -> str:
    """Text of the last assistant turn when that turn makes no tool call, else ``""``.

    Handles both decodings verl may pass: with chat special tokens (turns split on
    ``<|im_start|>``) and with them skipped (turns follow the last ``</tool_response>``).
    The response starts inside an assistant turn, because the prompt ends with the
    ``<|im_start|>assistant`` header.
    """
    if not isinstance(solution_str, str):
        return ""
    text = solution_str
    if "<|im_start|>" in text:
        segments = text.split("<|im_start|>")
        last = segments[0]
        for segment in segments[1:]:
            role, _, body = segment.partition("\n")
            if role.strip() == "assistant":
                last = body
        text = last
    elif "</tool_response>" in text:
        text = text.rsplit("</tool_response>", 1)[1]
        stripped = text.lstrip()
        if stripped.startswith("assistant"):
            text = stripped[len("assistant") :]
    for token in _SPECIAL:
        text = text.split(token, 1)[0]
    text = _THINK.sub("", text)
    if "<tool_call>" in text or "<tool_response>" in text:
        return ""
    return text.strip()


def _task_and_env(data_source, ground_truth, extra_info):
    """The task dict, environment name and params a row describes."""
    info = extra_info.get("miniverl") if isinstance(extra_info, dict) else None
    if isinstance(info, dict) and isinstance(info.get("task_json"), str):
        task_json = info["task_json"]
        digest = "sha256:" + hashlib.sha256(task_json.encode("utf-8")).hexdigest()
        if digest != info.get("task_sha256"):
            raise ValueError("extra_info.miniverl.task_json does not match its sha256")
        params = json.loads(info.get("params_json") or "{}")
        return json.loads(task_json), str(info.get("environment")), params
    if not (isinstance(data_source, str) and data_source.startswith(DATA_SOURCE_PREFIX)):
        raise ValueError(f"data_source {data_source!r} is not a miniverl environment")
    # Without the task (a row that lost extra_info), verify against the ground truth alone.
    task = {
        "id": "",
        "split": "",
        "difficulty": "",
        "prompt": "",
        "answer": str(ground_truth),
        "data": {},
        "seed": 0,
    }
    return task, data_source[len(DATA_SOURCE_PREFIX) :], {}


def score_details(
    data_source, solution_str, ground_truth, extra_info=None
) -> tuple[bool, float, str]:
    """``(success, score in [0, 1], reason)``; never raises."""
    try:
        from miniverl.student.environments import Task, get_environment

        task_dict, env_name, params = _task_and_env(data_source, ground_truth, extra_info)
        from_dict = getattr(Task, "from_dict", None)
        task = from_dict(task_dict) if callable(from_dict) else Task(**task_dict)
        env = get_environment(env_name, **params)
        result = env.verify(task, final_answer(solution_str))
        score = float(result.score)
        if not math.isfinite(score):
            return False, 0.0, "verifier returned a non-finite score"
        return bool(result.success), min(max(score, 0.0), 1.0), str(result.reason)
    except Exception as exc:  # the reward must never take a training step down
        return False, 0.0, f"{type(exc).__name__}: {exc}"


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl's reward entry point: the verifier's score in [0, 1], 0.0 on any failure."""
    return score_details(data_source, solution_str, ground_truth, extra_info)[1]
