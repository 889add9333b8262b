"""Scorers by entry point: discovery, the example ``sharpen`` scorer, clear refusals.

Users rely on: an installed ``miniverl.scorers`` entry point is found by name, the
default is the causal LM itself, a sharpened teacher's targets are exactly the base
model's at temperature ``T * tau``, and a wrong name or option fails with a message
that says what to do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from miniverl.common.errors import ConfigError  # noqa: E402
from miniverl.teacher_server.backend import ScoreJob  # noqa: E402
from miniverl.teacher_server.loader import TeacherSpec  # noqa: E402
from miniverl.teacher_server.scorers import (  # noqa: E402
    DEFAULT_SCORER,
    causal_lm,
    get_scorer,
    list_scorers,
    make_loader,
    parse_options,
)
from miniverl.teacher_server.scoring import score_positions  # noqa: E402
from tests.toy_kit import ONE_LAYER, seeded  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_teacher"
SPEC = seeded(ONE_LAYER, 3)


def install_example(root: Path) -> None:
    """Make ``examples/custom_teacher`` importable and its entry point visible.

    What ``pip install -e examples/custom_teacher`` does, without touching the
    environment: a dist-info folder with the package's entry_points.txt on sys.path.
    """
    dist = root / "miniverl_sharpen_teacher-0.1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: miniverl-sharpen-teacher\nVersion: 0.1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[miniverl.scorers]\nsharpen = sharpen_teacher:make_scorer\n"
    )


@pytest.fixture
def example_installed(tmp_path, monkeypatch):
    install_example(tmp_path / "site")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield
    sys.modules.pop("sharpen_teacher", None)


@pytest.fixture(scope="module")
def toy_dir():
    from miniverl.common.toy import toy_model_dir

    return toy_model_dir(SPEC)


def _job(vocab: int, temperature: float = 1.0) -> ScoreJob:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 250, size=40).astype(np.int32)
    return ScoreJob(tokens_N=tokens, cu_seqlens_B1=np.array([0, 40], np.int32),
                    positions_P=np.arange(5, 39, dtype=np.int32), kind="topk", k=8,
                    temperature=temperature)


def test_default_scorer_is_the_causal_lm(toy_dir):
    assert get_scorer(DEFAULT_SCORER) is causal_lm
    assert DEFAULT_SCORER in list_scorers()
    backend = make_loader(TeacherSpec(model=str(toy_dir), device="cpu"))(None)
    assert backend.info["name"] == Path(toy_dir).name
    with pytest.raises(ConfigError, match="takes no options"):
        causal_lm(TeacherSpec(model=str(toy_dir)), exact_max_vocab=1, max_batch_tokens=1,
                  options={"tau": 1})


def test_unknown_scorer_names_the_installed_ones():
    with pytest.raises(ConfigError, match=r"unknown scorer 'nope'; installed: .*causal_lm"):
        get_scorer("nope")
    # The loader refuses it before any bind or load happens.
    with pytest.raises(ConfigError, match="unknown scorer"):
        make_loader(TeacherSpec(model="x"), scorer="nope")


def test_options_parse_numbers_and_refuse_garbage():
    assert parse_options(["tau=0.5", "n=3", "on=true", "name=x"]) == {
        "tau": 0.5, "n": 3, "on": True, "name": "x"}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_options(["tau"])


def test_sharpen_entry_point_scores_at_temperature_times_tau(example_installed, toy_dir):
    assert "sharpen" in list_scorers()
    loader = make_loader(TeacherSpec(model=str(toy_dir), device="cpu"), scorer="sharpen",
                         scorer_options={"tau": 0.5})
    backend = loader(None)
    assert backend.info["name"].endswith("+sharpen(tau=0.5)")
    job = _job(backend.vocab_size, temperature=1.0)
    (got,) = backend.score_batch([job])
    want = score_positions(backend.base.model, job.tokens_N, job.cu_seqlens_B1, job.positions_P,
                           kind="topk", k=8, temperature=0.5)
    for name in ("ids", "logprobs", "tail_logmass", "target_logprobs"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    plain = score_positions(backend.base.model, job.tokens_N, job.cu_seqlens_B1,
                            job.positions_P, kind="topk", k=8, temperature=1.0)
    # Sharper: the top token holds more mass; greedy choices are unchanged.
    assert np.all(got["logprobs"][:, 0] >= plain["logprobs"][:, 0] - 1e-6)
    assert np.array_equal(got["ids"][:, 0], plain["ids"][:, 0])
    # A RELOAD goes through the same scorer.
    again = loader({"model": str(toy_dir), "revision": None, "adapter": None})
    assert again.info["name"].endswith("+sharpen(tau=0.5)")


def test_sharpen_refuses_bad_options(example_installed, toy_dir):
    factory = get_scorer("sharpen")
    spec = TeacherSpec(model=str(toy_dir), device="cpu")
    with pytest.raises(ConfigError, match="only tau"):
        factory(spec, exact_max_vocab=1, max_batch_tokens=1, options={"beta": 1})
    with pytest.raises(ConfigError, match=r"tau 0 must be a number in \(0, 10\]"):
        factory(spec, exact_max_vocab=1, max_batch_tokens=1, options={"tau": 0})


def test_a_broken_plugin_is_reported(tmp_path, monkeypatch):
    dist = tmp_path / "broken_scorer-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-scorer\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[miniverl.scorers]\nbroken = no_such_module:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="scorer 'broken' .* failed to import"):
        get_scorer("broken")
