"""The shipped verl reward: correct on ground truth, 0.0 and no exception on garbage."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miniverl.bridge import parquet
from miniverl.student.environments import make_tasks

TEMPLATE = Path(__file__).resolve().parents[2] / "bridge" / "templates" / "compute_score.py"


@pytest.fixture(scope="module")
def reward():
    spec = importlib.util.spec_from_file_location("bundle_compute_score", TEMPLATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(env_name, n=4):
    env = parquet.env_facts(env_name)
    tasks = make_tasks(env_name, "eval", n, "mixed", 0)
    return [parquet.task_to_row(t, i, env, env.tool_names) for i, t in enumerate(tasks)]


def _hermes(answer: str, special: bool) -> str:
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    if special:
        return (
            f"<think>\nlet me compute\n</think>\n{call}<|im_end|>\n<|im_start|>user\n<tool_response>\n2\n"
            f"</tool_response><|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>"
        )
    return f"{call}\nuser\n<tool_response>\n2\n</tool_response>\nassistant\n{answer}"


@pytest.mark.parametrize("env_name", ["calculator", "jsonnav", "sqlite"])
def test_ground_truth_scores_one(reward, env_name):
    # verl trains on this number: the right answer must earn the full reward.
    for row in _rows(env_name):
        truth = row["reward_model"]["ground_truth"]
        for response in (truth, _hermes(truth, True), _hermes(truth, False)):
            assert (
                reward.compute_score(row["data_source"], response, truth, row["extra_info"]) == 1.0
            ), response


def test_wrong_or_unfinished_answer_scores_zero(reward):
    row = _rows("calculator", 1)[0]
    truth = row["reward_model"]["ground_truth"]
    ends_in_call = '<tool_call>\n{"name": "calculator", "arguments": {}}\n</tool_call>'
    for response in ("no idea", _hermes("banana", True), ends_in_call, f"{truth}<tool_call>"):
        assert reward.compute_score(row["data_source"], response, truth, row["extra_info"]) == 0.0


def test_without_extra_info_falls_back_to_ground_truth(reward):
    row = _rows("calculator", 1)[0]
    truth = row["reward_model"]["ground_truth"]
    assert reward.compute_score(row["data_source"], truth, truth) == 1.0


def test_tampered_task_json_scores_zero(reward):
    row = _rows("calculator", 1)[0]
    truth = row["reward_model"]["ground_truth"]
    row["extra_info"]["miniverl"]["task_json"] += " "
    assert reward.compute_score(row["data_source"], truth, truth, row["extra_info"]) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    data_source=st.one_of(
        st.none(),
        st.integers(),
        st.text(max_size=30),
        st.just("miniverl/calculator"),
        st.just("miniverl/nope"),
    ),
    solution=st.one_of(st.none(), st.integers(), st.binary(max_size=50), st.text(max_size=300)),
    truth=st.one_of(st.none(), st.text(max_size=20), st.floats()),
    extra=st.one_of(
        st.none(),
        st.text(max_size=20),
        st.dictionaries(st.text(max_size=10), st.text(max_size=10)),
        st.just({"miniverl": {"task_json": "{", "task_sha256": "x"}}),
    ),
)
@pytest.mark.slow
def test_garbage_never_raises(reward, data_source, solution, truth, extra):
    score = reward.compute_score(data_source, solution, truth, extra)
    assert isinstance(score, float) and 0.0 <= score <= 1.0


@settings(max_examples=100, deadline=None)
@given(solution=st.text(st.characters(blacklist_categories=("Cs", "Nd")), max_size=300))
def test_garbage_text_scores_zero_on_a_real_row(reward, solution):
    row = _rows("calculator", 1)[0]
    truth = row["reward_model"]["ground_truth"]
    assert reward.compute_score(row["data_source"], solution, truth, row["extra_info"]) == 0.0


def test_final_answer_extraction(reward):
    fa = reward.final_answer
    assert fa("  42 ") == "42"
    assert fa(_hermes("7", True)) == "7"
    assert fa(_hermes("7", False)) == "7"
    assert fa("<think>x</think>\n9<|im_end|>trailing") == "9"
    assert fa('<tool_call>{"name": "c"}</tool_call>') == ""
    assert fa(None) == "" and fa(b"x") == ""
