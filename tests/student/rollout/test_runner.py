"""Batched multi-turn rollouts: exact spans, verbatim sampled ids, reproducible seeds."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from miniverl.common.recipe_sections import RolloutConfig  # noqa: E402
from miniverl.common.toy import build_toy_model, build_toy_tokenizer  # noqa: E402
from miniverl.common.trajectory import CONTEXT_SPANS, SpanType, StopReason  # noqa: E402
from miniverl.student.environments import make_tasks  # noqa: E402
from miniverl.student.rollout.engine import SampledTurn  # noqa: E402
from miniverl.student.rollout.hf_engine import sample_next  # noqa: E402
from miniverl.student.rollout.runner import RolloutRunner  # noqa: E402
from tests.toy_kit import FOUR_HEAD  # noqa: E402

torch.set_num_threads(1)
TINY = FOUR_HEAD
CFG = dict(
    max_turns=3, max_new_tokens_per_turn=24, max_total_tokens=400,
    temperature=1.0, top_p=0.95, batch_size=8,
)


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_toy_model(TINY, tok)


@pytest.fixture(scope="module")
def tasks():
    return make_tasks("calculator", "train", 6, "mixed", 0)


def _runner(model, tok, **overrides):
    return RolloutRunner(
        model, tok, env_name="calculator", rollout=RolloutConfig(**{**CFG, **overrides}), tokenizer_fp="fp"
    )


def _record(runner):
    """Capture exactly what the engine sampled for each episode, per task."""
    sampled: dict[str, list[list[int]]] = {}
    inner = runner._after_turn

    def wrapped(ep, turn):
        sampled.setdefault(ep.task.id, []).append(list(turn.ids))
        return inner(ep, turn)

    runner._after_turn = wrapped
    return sampled


def test_spans_tile_and_model_spans_are_the_sampled_ids(model, tok, tasks):
    runner = _runner(model, tok)
    sampled = _record(runner)
    trajs = runner.run(tasks, policy_version=3, seeds=list(range(len(tasks))))
    assert [t.task_id for t in trajs] == [t.id for t in tasks]
    for traj in trajs:
        assert traj.policy_version == 3 and traj.tokenizer_fp == "fp"
        # Each model turn is one or two adjacent model spans; joined, they are the
        # ids the sampler produced, never re-tokenized text.
        turns, current, prev_end = [], [], None
        for span in traj.spans:
            if span.type.trainable:
                if prev_end != span.start:
                    current = []
                    turns.append(current)
                current.extend(traj.tokens[span.start : span.end])
                prev_end = span.end
        assert turns == sampled[traj.task_id]
        mask = traj.loss_mask()
        for span in traj.spans:
            if span.type in CONTEXT_SPANS:
                assert not mask[span.start : span.end].any()
        assert traj.spans[0].type == SpanType.SYSTEM


@pytest.mark.slow
def test_same_seeds_same_trajectories_and_batch_size_does_not_matter(model, tok, tasks):
    seeds = [11, 12, 13, 14, 15, 16]
    a = _runner(model, tok).run(tasks, policy_version=0, seeds=seeds)
    b = _runner(model, tok).run(tasks, policy_version=0, seeds=seeds)
    one = _runner(model, tok, batch_size=1).run(tasks, policy_version=0, seeds=seeds)
    assert [t.tokens for t in a] == [t.tokens for t in b] == [t.tokens for t in one]
    other = _runner(model, tok).run(tasks, policy_version=0, seeds=[s + 100 for s in seeds])
    assert [t.tokens for t in other] != [t.tokens for t in a]


@pytest.mark.slow
def test_greedy_batched_equals_one_at_a_time(model, tok, tasks):
    a = _runner(model, tok, batch_size=4).run(tasks, policy_version=0, greedy=True)
    b = _runner(model, tok, batch_size=1).run(tasks, policy_version=0, greedy=True)
    assert [t.tokens for t in a] == [t.tokens for t in b]


def test_on_finished_fires_once_per_episode(model, tok, tasks):
    seen = []
    trajs = _runner(model, tok, batch_size=3).run(
        tasks, policy_version=0, seeds=list(range(len(tasks))), on_finished=seen.append
    )
    assert sorted(t.id for t in seen) == sorted(t.id for t in trajs)


def test_sample_next_rows_are_independent():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    together = sample_next(logits, gens, greedy=False, temperature=1.0, top_p=0.9)
    alone = [
        sample_next(logits[i : i + 1], [torch.Generator().manual_seed(s)], greedy=False,
                    temperature=1.0, top_p=0.9).item()
        for i, s in enumerate((1, 2, 3))
    ]
    assert together.tolist() == alone
    tiny_p = sample_next(logits, gens, greedy=False, temperature=1.0, top_p=1e-6)
    assert tiny_p.tolist() == logits.argmax(-1).tolist()


# -- stop reasons, with scripted turns in place of the model --------------------------


class _Scripted:
    """A sampling engine that plays one episode's turns from a script (texts)."""

    def __init__(self, tok, script):
        self.tok, self.script = tok, script

    def reset(self):
        pass

    def release(self):
        pass

    def sample(self, requests, sampling):
        assert len(requests) == 1  # one scripted episode per run
        ids = self.tok.encode(self.script.pop(0), add_special_tokens=False)
        return [SampledTurn(ids=ids, logprobs=None)]


def _scripted(runner, tok, script):
    runner.engine = _Scripted(tok, script)


def _call(expr):
    args = json.dumps({"expression": expr})
    return f'<tool_call>\n{{"name": "calculator", "arguments": {args}}}\n</tool_call><|im_end|>'


def test_stop_reasons(model, tok, tasks):
    t = tasks[0]
    expr = t.data.get("expression", "1+1")
    cases = {
        StopReason.FINAL_ANSWER: [_call(expr), f"{t.answer}<|im_end|>"],
        StopReason.PARSE_ERRORS: ["<tool_call>{oops}</tool_call><|im_end|>"] * 2,
        StopReason.REPEATED_CALLS: [_call("1+1")] * 3,
        StopReason.MAX_TURNS: [_call("1"), _call("2"), _call("3")],
        StopReason.MAX_TOKENS: ["no stop token here"],
    }
    for reason, script in cases.items():
        runner = _runner(model, tok, max_total_tokens=2048)
        _scripted(runner, tok, list(script))
        (traj,) = runner.run([t], policy_version=0, seeds=[0])
        assert traj.stop_reason == reason, (reason, traj.stop_reason)
        if reason == StopReason.FINAL_ANSWER:
            assert traj.verifier.success and traj.tool_calls.total == 1
            assert traj.tool_calls.by_name == {"calculator": 1}
            assert traj.spans[-1].type == SpanType.ASSISTANT_FINAL
        else:
            assert not traj.verifier.success
        if reason == StopReason.PARSE_ERRORS:
            assert traj.tool_calls.parse_errors == 2
            # The malformed call was answered with an error tool result (a signal).
            assert traj.messages[3]["content"].startswith("error:")


def test_total_token_budget_stops_the_episode(model, tok, tasks):
    t = tasks[0]
    call = tok.encode(_call("1"), add_special_tokens=False)
    probe = _runner(model, tok, max_new_tokens_per_turn=1).run([t], policy_version=0, seeds=[0])
    prompt_len = len(probe[0].tokens) - 1
    # Room for the call but not for its tool result: the episode ends after the call.
    runner = _runner(model, tok, max_total_tokens=prompt_len + len(call) + 5)
    _scripted(runner, tok, [_call("1")])
    (traj,) = runner.run([t], policy_version=0, seeds=[0])
    assert traj.stop_reason == StopReason.MAX_TOKENS
    assert traj.tokens[prompt_len:] == call
