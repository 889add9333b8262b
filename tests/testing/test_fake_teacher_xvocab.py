"""The test kit's fakes serve ``xvocab`` (docs/protocol.md, "xvocab"): the in-memory
``FakeTeacher`` over the real codec and client, the in-process ``FakeTeacherClient``
over a torch model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from miniverl.common.alignment import align_episode
from miniverl.protocol.xvocab import groups_of_alignment, xvocab_request
from miniverl.teacher_server.scoring import score_positions
from miniverl.testing import FAKE_TOKENIZER_FP, FAKE_VOCAB, FakeTeacher, FakeTeacherClient
from miniverl.testing.script import answer
from tests.common.cross_tokenizer_kit import (
    TOOLS,
    byte_fallback_tokenizer,
    hostile_episode,
    toy_tokenizer,
)

TEACHER_FP = "sha256:" + "ef" * 32
MESSAGES = hostile_episode("Tabs\t\tand 日本 text.")


def _request(messages=MESSAGES, tools=TOOLS):
    return xvocab_request(toy_tokenizer(), messages, tools)


def test_fake_teacher_serves_xvocab_and_a_reply_for_another_episode_is_stale():
    tok = byte_fallback_tokenizer()
    teacher = FakeTeacher(tokenizer=tok, tokenizer_fp=TEACHER_FP, vocab_size=len(tok),
                          k_max=8)
    req = _request()
    # The first answer names another episode: dropped as stale, the resend is answered.
    teacher.script(answer(episode_sha256="sha256:" + "0" * 64))
    with teacher.client(tokenizer_fp=FAKE_TOKENIZER_FP, vocab_size=FAKE_VOCAB,
                        xvocab=True) as client:
        assert client.hello.kinds.xvocab is not None
        rid = client.submit_xvocab(req["episode"], req["student_cuts"], req["student_pieces"],
                                   k=4)
        result = client.wait([rid], timeout_s=10)[rid]
        assert client.counters["stale_dropped"] == 1
    local = align_episode(toy_tokenizer(), tok, MESSAGES, TOOLS)
    np.testing.assert_array_equal(result.arrays["groups"],
                                  groups_of_alignment(local["alignment"]))
    assert teacher.count("SCORE") == 2  # the request and its resend


@pytest.mark.slow  # builds a torch model: over tests/tiers.py's SLOW_S alone
def test_fake_teacher_client_scores_xvocab_with_its_model():
    tok = byte_fallback_tokenizer()
    from tests.toy_kit import TEACHER, bare_qwen3

    torch.manual_seed(0)
    model = bare_qwen3(TEACHER, vocab=len(tok), max_positions=256).eval()
    client = FakeTeacherClient(model, TEACHER_FP, len(tok), tokenizer=tok)
    assert client.hello.kinds.xvocab is not None
    req = _request([{"role": "user", "content": "2+2?"},
                    {"role": "assistant", "content": "4, I think."}], None)
    client.bind()
    rid = client.submit_xvocab(req["episode"], req["student_cuts"], req["student_pieces"], k=4)
    result = client.wait([rid])[rid]
    got = result.arrays
    assert result.kind == "xvocab"
    n = got["teacher_ids"].shape[0]
    ref = score_positions(model, got["teacher_ids"], np.array([0, n]), got["positions"],
                          kind="topk", k=4)
    np.testing.assert_array_equal(got["ids"], ref["ids"])
    np.testing.assert_allclose(got["target_logprobs"], ref["target_logprobs"])
