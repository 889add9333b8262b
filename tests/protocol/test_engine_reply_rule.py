"""One rule for both engine shapes (protocol/engine_replies.py ``position_targets``).

What a user relies on (docs/engine-teachers.md, "What holds as for any teacher"): whatever engine scores
the run, a position's numbers are held to the same checks: every log-prob at most 0,
the distinct tokens of the position (the actual token included) hold at most all the
probability, and the actual token's log-prob is the same in both places a shape gives
it. The same numbers in vLLM's shape and in SGLang's get the same verdict, in the same
words; nothing refused reaches a loss.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miniverl.protocol.engine_replies import EngineGarbage, parse_score

VOCAB, K = 263, 4
L = math.log


def sglang_body(toks, tops):
    return [{"meta_info": {"input_token_logprobs": toks, "input_top_logprobs": tops}}]


def vllm_body(entries):
    return {"model": "m", "choices": [{"index": 0, "prompt_logprobs": entries}]}


def verdict(flavour, body, seq, positions):
    """``("accepted", arrays)`` or ``("refused", the words after the position)``."""
    try:
        return "accepted", parse_score(flavour, body, "m", [seq], [positions], k=K,
                                       vocab_size=VOCAB, where="w")
    except EngineGarbage as exc:
        text = str(exc)
        assert "\n" not in text
        return "refused", text.split("position", 1)[1]


def test_the_issue_53_sglang_replies_are_refused_with_the_words_of_vllms_shape():
    seq, positions = [5, 6, 7, 8], [0, 1, 2]
    # 1: a top-k of 0.96 beside an actual token outside it at 0.5 (1.46 in all).
    toks = [[None, 5, None]] + [[L(0.5), a, "x"] for a in (6, 7, 8)]
    tops = [None] + [[[L(0.24), t, "y"] for t in (100, 101, 102, 103)]] * 3
    sglang = verdict("sglang", sglang_body(toks, tops), seq, positions)
    entries = [None] + [{**{str(t): {"logprob": L(0.24)} for t in (100, 101, 102, 103)},
                         str(a): {"logprob": L(0.5)}} for a in (6, 7, 8)]
    vllm = verdict("vllm", vllm_body(entries), seq, positions)
    assert sglang == vllm == ("refused", " 1: the 5 distinct tokens' log-probs sum to a "
                                         "probability of 1.46, above 1")
    # 2: the actual token at 0.9 in one list and 0.5 in the other (the 0.9 was trained on
    # by the sampled-token estimator). vLLM's shape names a token once per key: the same
    # numbers there are the actual token under two keys ("6" and "06").
    toks = [[None, 5, None]] + [[L(0.9), a, "x"] for a in (6, 7, 8)]
    tops = [None] + [[[L(0.5), a, "y"], *([L(0.1), t, "y"] for t in (100, 101, 102))]
                     for a in (6, 7, 8)]
    sglang = verdict("sglang", sglang_body(toks, tops), seq, positions)
    entries = [None] + [{str(a): {"logprob": L(0.5)},
                         **{str(t): {"logprob": L(0.1)} for t in (100, 101, 102)},
                         f"0{a}": {"logprob": L(0.9)}} for a in (6, 7, 8)]
    vllm = verdict("vllm", vllm_body(entries), seq, positions)
    assert sglang == vllm
    assert sglang[1] == (" 1: token 6 is given log-prob -0.6931 in one place and -0.1054 "
                         "in another; a position gives each token one log-prob")


@st.composite
def positions_of(draw):
    """One prompt's positions: per position a top-k (distinct ids, log-probs, sum <= 1.2),
    whether the actual token is in it, and a second log-prob for it that may disagree."""
    n = draw(st.integers(1, 4))
    seq = [draw(st.integers(0, VOCAB - 1))]
    rows = []
    for _ in range(n):
        ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=K, max_size=K, unique=True))
        probs = draw(st.lists(st.floats(1e-4, 0.4), min_size=K, max_size=K))
        lps = sorted((L(p) for p in probs), reverse=True)
        inside = draw(st.booleans())
        if inside:
            actual = ids[draw(st.integers(0, K - 1))]
            own = dict(zip(ids, lps, strict=True))[actual]
        else:
            actual = draw(st.integers(0, VOCAB - 1).filter(lambda t, ids=ids: t not in ids))
            own = lps[-1] - draw(st.floats(1e-3, 5.0))
        shift = draw(st.sampled_from([0.0, 0.0, 0.0, 1e-5, 0.3, -0.5]))
        seq.append(actual)
        rows.append((ids, lps, actual, own, min(own + shift, 0.0) if inside else own))
    return seq, rows


@pytest.mark.slow  # about 10 s on a busy 2-core machine
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(positions_of())
def test_the_same_numbers_get_the_same_verdict_in_both_shapes(case):
    seq, rows = case
    toks, tops, entries = [[None, seq[0], None]], [None], [None]
    for ids, lps, actual, own, second in rows:
        toks.append([second, actual, "x"])
        tops.append([[lp, i, "y"] for i, lp in zip(ids, lps, strict=True)])
        entry = {str(i): {"logprob": lp} for i, lp in zip(ids, lps, strict=True)}
        if actual not in ids:
            entry[str(actual)] = {"logprob": own}
        elif abs(second - own) > 1e-3:  # vLLM's second place for one token: a second key
            entry[f"0{actual}"] = {"logprob": second}
        entries.append(entry)
    positions = list(range(len(rows)))
    sglang = verdict("sglang", sglang_body(toks, tops), seq, positions)
    vllm = verdict("vllm", vllm_body(entries), seq, positions)
    assert sglang[0] == vllm[0]
    if sglang[0] == "refused":
        assert sglang[1] == vllm[1]
        return
    for name in ("ids", "logprobs", "tail_logmass", "target_logprobs"):
        np.testing.assert_array_equal(sglang[1][name], vllm[1][name])
    for p, (ids, lps, actual, own, _) in enumerate(rows):  # what a loss may use
        mass = sum(math.exp(lp) for lp in lps) + (0 if actual in ids else math.exp(own))
        assert mass <= 1 + 1e-3
        assert sglang[1]["target_logprobs"][p] == pytest.approx(own, abs=1e-3)
