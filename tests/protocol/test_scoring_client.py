"""The seam the training side is typed against: every teacher client implements it.

``ScoringClient`` (protocol/scoring_client.py) names the methods the student calls on a
teacher client. Both implementations, the ZeroMQ ``SyncTeacherClient`` and the
in-process ``FakeTeacherClient`` of ``miniverl.testing``, must be instances of it and
have every method with the protocol's parameters (names, kinds, defaults), so a trainer
handed either one calls the same thing.
"""

from __future__ import annotations

import inspect

import pytest

from miniverl.protocol.scoring_client import ScoringClient
from miniverl.protocol.sync_client import SyncTeacherClient
from miniverl.testing import FAKE_TOKENIZER_FP, FAKE_VOCAB, FakeTeacher
from miniverl.testing.fake_teacher import FakeTeacherClient


def members() -> dict[str, object]:
    """The protocol's methods and properties, by name."""
    return {name: value for name, value in vars(ScoringClient).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def parameters(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def mismatches(cls: type) -> list[str]:
    """What ``cls`` lacks or spells differently from ``ScoringClient``; empty when none."""
    found = []
    fields = getattr(cls, "__dataclass_fields__", {})
    for name, member in members().items():
        if isinstance(member, property):
            if not (isinstance(getattr(cls, name, None), property) or name in fields):
                found.append(f"{name}: not a property or field")
            continue
        mine = getattr(cls, name, None)
        if not callable(mine):
            found.append(f"{name}: missing")
        elif parameters(mine) != parameters(member):
            found.append(f"{name}: {parameters(mine)} != {parameters(member)}")
    return found


def implementations():
    teacher = FakeTeacher()
    sync = SyncTeacherClient("inproc://seam", tokenizer_fp=FAKE_TOKENIZER_FP,
                             vocab_size=FAKE_VOCAB, transport_factory=teacher.transport_factory)
    fake = FakeTeacherClient(None, FAKE_TOKENIZER_FP, FAKE_VOCAB)
    return [sync, fake]


def test_the_protocol_names_what_the_training_side_calls():
    assert set(members()) == {"hello", "counters", "connected", "connect", "connect_soon",
                              "set_version", "bind", "submit", "wait", "forget", "retarget",
                              "park", "wake", "close", "interrupt"}


@pytest.mark.parametrize("client", implementations(), ids=["SyncTeacherClient",
                                                           "FakeTeacherClient"])
def test_each_client_implements_the_protocol_method_by_method(client):
    assert isinstance(client, ScoringClient)
    assert mismatches(type(client)) == []
    client.close()


def test_a_client_that_differs_is_named_with_what_differs():
    class Partial:
        hello = None
        counters: dict = {}

        def submit(self, tokens_N, positions_P):  # no cu_seqlens, no keywords
            return 0

    found = mismatches(Partial)
    assert not isinstance(Partial(), ScoringClient)
    assert "connect: missing" in found and "hello: not a property or field" in found
    assert any(line.startswith("submit: [('self'") for line in found)
