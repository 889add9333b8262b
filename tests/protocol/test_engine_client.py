"""A vLLM or SGLang server as the student's teacher (``protocol/engine_client.py``).

Against ``engine_fake.FakeEngine``, a real loopback HTTP server answering in each
flavour's documented shape with our own teacher's numbers on the toy model: the targets
the client builds equal ``score_positions``' (ids, log-probs and the actual token's
log-prob exactly; the tail within the stated bound), a reply for an older student
version is dropped and counted, never returned; a tokenizer mismatch is refused at the
handshake, before any rollout; a server that now serves another model is refused;
garbage, a server that is down and one that is briefly overloaded each end in one line
(or a retry); and a toy student trains a few OPD updates with the engine as its teacher.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from miniverl.common.errors import (
    ConfigError,
    StaleTargetError,
    TeacherError,
    TeacherUnavailable,
    TokenizerMismatch,
)
from tests.extras import require

require("httpx")

from miniverl.protocol.engine_client import (  # noqa: E402 (after the skip)
    EngineModelChanged,
    EngineTeacherClient,
)
from miniverl.protocol.engine_replies import tail_logmass  # noqa: E402
from tests.protocol.engine_fake import FakeEngine  # noqa: E402
from tests.toy_kit import TEACHER, make_recipe, toy_dir  # noqa: E402

K = 8
FLAVOURS = ("vllm", "sglang")


@pytest.fixture(scope="module")
def toy():
    import torch

    from miniverl.common.modeling import load_causal_lm, load_tokenizer
    from miniverl.common.tokenizer_id import fingerprint_tokenizer

    torch.set_num_threads(1)
    model = load_causal_lm(toy_dir(TEACHER), dtype="float32", device="cpu").eval()
    tokenizer = load_tokenizer(toy_dir(TEACHER))
    return model, tokenizer, fingerprint_tokenizer(tokenizer)


def _client(engine: FakeEngine, toy, **kw) -> EngineTeacherClient:
    _, tokenizer, fp = toy
    settings = dict(flavour=engine.flavour, model=engine.model,
                    tokenize=lambda s: tokenizer.encode(s, add_special_tokens=False),
                    tokenizer_fp=fp, vocab_size=len(tokenizer),
                    bos_id=tokenizer.bos_token_id, request_timeout_s=5.0,
                    retry_backoff_s=0.05)
    return EngineTeacherClient(engine.url, **{**settings, **kw})


def _sequences(toy, n: int = 3) -> list[list[int]]:
    _, tokenizer, _ = toy
    texts = ["What is 12 + 30? Use the calculator.", "The answer is 42.",
             "Compute (7 * 6) - 0 and say the result."]
    return [tokenizer.encode(t) for t in texts[:n]]


def _packed(seqs):
    tokens = np.concatenate([np.asarray(s, np.int32) for s in seqs])
    cu = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int32)
    return tokens, cu


def test_the_engine_client_implements_the_scoring_seam():
    from miniverl.protocol.scoring_client import ScoringClient
    from tests.protocol.test_scoring_client import mismatches

    assert mismatches(EngineTeacherClient) == []
    client = EngineTeacherClient("http://127.0.0.1:9", flavour="vllm", model="m",
                                 tokenize=lambda s: [], tokenizer_fp="fp", vocab_size=10)
    assert isinstance(client, ScoringClient) and client.hello is None
    client.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_targets_equal_our_teachers_and_requests_pipeline(toy, flavour):
    from miniverl.teacher_server.scoring import score_positions

    model, tokenizer, _ = toy
    seqs = _sequences(toy)
    tokens, cu = _packed(seqs)
    # Positions out of sequence order, some of each sequence: rows follow the request.
    positions = np.array([cu[1] + 3, 0, cu[2] + 1, 5, cu[1], cu[2] + 4], np.int32)
    with FakeEngine(model, tokenizer, flavour=flavour) as engine, _client(engine, toy) as client:
        client.set_version(0)
        client.bind()
        ids = [client.submit(tokens, cu, positions, k=K) for _ in range(4)]  # in flight at once
        replies = client.wait(ids, timeout_s=60)
        # Our teacher on each whole sequence alone, as an engine scores every token of each
        # prompt (a packed SCORE of some positions differs from it by float rounding only).
        seq_of = np.searchsorted(cu, positions, side="right") - 1
        whole = [score_positions(model, np.asarray(s, np.int32), np.array([0, len(s)], np.int32),
                                 np.arange(len(s) - 1, dtype=np.int32), kind="topk", k=K)
                 for s in seqs]
        ref = {name: np.stack([whole[b][name][p - cu[b]]
                               for p, b in zip(positions, seq_of, strict=True)])
               for name in whole[0]}
        for rid in ids:
            got = replies[rid].arrays
            assert replies[rid].student_version == 0
            np.testing.assert_array_equal(got["ids"], ref["ids"])
            np.testing.assert_array_equal(got["logprobs"], ref["logprobs"])
            np.testing.assert_array_equal(got["target_logprobs"], ref["target_logprobs"])
            # log1p(-sum p) of float32 log-probs against our exact excluded-mass sum.
            np.testing.assert_allclose(got["tail_logmass"], ref["tail_logmass"], atol=1e-3)
        scored = [b for r, b in engine.requests if r in ("/v1/completions", "/generate")
                  and b is not None and ("prompt" in b or "input_ids" in b)]
        assert len(scored) == 4 and all(len(b.get("prompt", b.get("input_ids"))) == 3
                                        for b in scored)
        assert client.counters["received"] == 4 and client.counters["stale_dropped"] == 0


@pytest.mark.slow
def test_the_request_bodies_are_the_documented_ones(toy):
    model, tokenizer, _ = toy
    seq = _sequences(toy, 1)
    tokens, cu = _packed(seq)
    for flavour, route, want in (
        ("vllm", "/v1/completions", {"model": "toy-teacher", "prompt": seq, "max_tokens": 1,
                                     "prompt_logprobs": K}),
        ("sglang", "/generate", {"input_ids": seq, "sampling_params": {"max_new_tokens": 1},
                                 "return_logprob": True, "logprob_start_len": 0,
                                 "top_logprobs_num": K}),
    ):
        with FakeEngine(model, tokenizer, flavour=flavour) as engine, \
                _client(engine, toy) as client:
            client.set_version(0)
            client.bind()
            client.wait([client.submit(tokens, cu, np.array([1, 2], np.int32), k=K)])
            assert engine.requests[-1] == (route, want)


def test_tail_is_finite_or_minus_inf_exactly_where_topk_is_the_vocabulary():
    # Rows: mass 2 and 1 + e^-30 (a sum rounded past 1), and 0.9.
    lp = np.array([[0.0, 0.0], [0.0, -30.0], np.log([0.6, 0.3])], np.float32)
    lp = lp[[0, 2, 1]]
    tail = tail_logmass(lp, k=2, vocab_size=10)
    assert np.isfinite(tail).all() and abs(tail[1] - np.log(0.1)) < 1e-5
    assert tail[0] == tail[2] == np.float32(np.log(np.finfo(np.float32).tiny))
    assert np.all(tail_logmass(lp, k=2, vocab_size=2) == -np.inf)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_reply_for_an_older_version_is_dropped_counted_and_never_returned(toy, flavour):
    model, tokenizer, _ = toy
    tokens, cu = _packed(_sequences(toy, 1))
    positions = np.array([1, 2, 3], np.int32)
    with FakeEngine(model, tokenizer, flavour=flavour) as engine, _client(engine, toy) as client:
        client.set_version(0)
        client.bind()
        engine.delay_s = 0.5  # the version-0 reply comes back after the update
        old = client.submit(tokens, cu, positions, k=K)
        client.set_version(1)  # strict OPD: a version-0 target may not train version 1
        with pytest.raises(StaleTargetError):
            client.wait([old], timeout_s=5)
        engine.delay_s = 0.0
        new = client.submit(tokens, cu, positions, k=K)
        got = client.wait([new], timeout_s=30)
        assert list(got) == [new] and got[new].student_version == 1
        deadline = time.monotonic() + 10
        while client.counters["stale_dropped"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.counters["stale_dropped"] == 1  # the late one, counted, not kept


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_tokenizer_mismatch_is_refused_at_the_handshake(toy, flavour):
    model, tokenizer, _ = toy
    with FakeEngine(model, tokenizer, flavour=flavour) as engine:
        engine.tokenize = lambda text, special: [t + 1 for t in tokenizer.encode(text)]
        client = _client(engine, toy, tokenizer_name="the student's tokenizer 'toy'")
        try:
            with pytest.raises(TokenizerMismatch) as err:
                client.connect(5)
        finally:
            client.close()
    text = str(err.value)
    assert "toy-teacher" in text and "'toy'" in text and "\n" not in text
    assert "serve a teacher with the student's tokenizer" in text


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_server_serving_another_model_is_refused(toy, flavour):
    model, tokenizer, _ = toy
    tokens, cu = _packed(_sequences(toy, 1))
    with FakeEngine(model, tokenizer, flavour=flavour) as engine, _client(engine, toy) as client:
        client.set_version(0)
        client.bind()
        engine.model = "other-model"  # restarted with other weights
        if flavour == "vllm":  # its replies name the model: refused at the reply
            rid = client.submit(tokens, cu, np.array([1], np.int32), k=K)
            with pytest.raises(EngineModelChanged, match="other-model"):
                client.wait([rid], timeout_s=10)
        with pytest.raises(EngineModelChanged, match="a changed teacher is refused"):
            client.bind()  # every update boundary asks which model is served
        assert client.counters["model_changed"] >= 1 and client.counters["received"] == 0 \
            or flavour == "sglang"


def _drop_last_entry(route, body):
    if route == "/v1/completions":
        body["choices"][0]["prompt_logprobs"].pop()
    return body


def _nan(route, body):
    if route == "/v1/completions":
        entry = body["choices"][0]["prompt_logprobs"][2]
        next(iter(entry.values()))["logprob"] = float("nan")
        return json_bytes(body)  # NaN is written as the bare token NaN, as Python does
    return body


def _inf(route, body):
    if route == "/v1/completions":
        entry = body["choices"][0]["prompt_logprobs"][2]
        for value in entry.values():
            value["logprob"] = float("-inf")
        return json_bytes(body)
    return body


def _out_of_vocab(route, body):
    if route == "/v1/completions":
        entry = body["choices"][0]["prompt_logprobs"][2]
        key = next(iter(entry))
        entry[str(10**6)] = entry.pop(key)
    return body


def _few(route, body):
    if route == "/v1/completions":
        entry = body["choices"][0]["prompt_logprobs"][2]
        for key in list(entry)[: 3]:
            entry.pop(key)
    return body


def json_bytes(body) -> bytes:
    import json

    return json.dumps(body).encode()


@pytest.mark.parametrize("mangle, match", [
    (lambda route, body: b"<html>bad gateway</html>" if route == "/v1/completions" else body,
     "non-JSON"),
    (lambda route, body: {"nothing": 1} if route == "/v1/completions" else body, "choices"),
    (_drop_last_entry, "entries for a prompt of"),
    (_nan, "is NaN"),
    (_inf, "non-finite"),
    (_out_of_vocab, "outside"),
    (_few, "log-probs; asked for 8"),
])
def test_garbage_answers_end_the_request_in_one_line(toy, mangle, match):
    model, tokenizer, _ = toy
    tokens, cu = _packed(_sequences(toy, 1))
    with FakeEngine(model, tokenizer) as engine, _client(engine, toy) as client:
        client.set_version(0)
        client.bind()
        engine.mangle = mangle
        rid = client.submit(tokens, cu, np.array([1, 2, 3], np.int32), k=K)
        with pytest.raises(TeacherError, match=match) as err:
            client.wait([rid], timeout_s=10)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_server_that_is_down_is_one_line_and_a_brief_overload_is_retried(toy):
    model, tokenizer, _ = toy
    with FakeEngine(model, tokenizer) as engine:
        url = engine.url
    down = _client(engine, toy, max_retries=1)
    try:
        t0 = time.monotonic()
        with pytest.raises(TeacherUnavailable, match="start the server") as err:
            down.connect(1.0)
        assert time.monotonic() - t0 < 10 and "\n" not in str(err.value) and url in str(err.value)
    finally:
        down.close()
    tokens, cu = _packed(_sequences(toy, 1))
    with FakeEngine(model, tokenizer) as engine, _client(engine, toy) as client:
        client.set_version(0)
        client.bind()
        engine.fail_next = 2  # two 503s, then the answer
        client.wait([client.submit(tokens, cu, np.array([1], np.int32), k=K)], timeout_s=10)
        assert client.counters["retries"] == 2
        engine.fail_next = 10
        rid = client.submit(tokens, cu, np.array([1], np.int32), k=K)
        with pytest.raises(TeacherUnavailable, match="after 4 tries"):
            client.wait([rid], timeout_s=30)


def test_the_api_key_is_read_from_the_variable_and_sent_only_as_a_header(toy, monkeypatch):
    model, tokenizer, _ = toy
    monkeypatch.delenv("MVL_TEST_ENGINE_KEY", raising=False)
    with FakeEngine(model, tokenizer, api_key="sk-test-123456") as engine:
        with pytest.raises(ConfigError, match="MVL_TEST_ENGINE_KEY"):
            _client(engine, toy, api_key_env="MVL_TEST_ENGINE_KEY")
        monkeypatch.setenv("MVL_TEST_ENGINE_KEY", "sk-test-123456")
        with _client(engine, toy, api_key_env="MVL_TEST_ENGINE_KEY") as client:
            assert client.hello.teacher.model == "toy-teacher"
        assert all(h.get("Authorization") == "Bearer sk-test-123456" for h in engine.headers)


# -- through the trainer ----------------------------------------------------------------


def _engine_recipe(tmp_path, engine: FakeEngine, **teacher):
    return make_recipe("opd", tmp_path / "run", cycles=2, sections={"teacher": {
        "model": {"path": engine.model}, "endpoint": engine.url, "api": engine.flavour,
        **teacher}})


def test_a_tokenizer_mismatch_stops_the_run_before_any_rollout(tmp_path, toy):
    from miniverl.student.train.trainer import Trainer

    model, tokenizer, _ = toy
    with FakeEngine(model, tokenizer) as engine:
        engine.tokenize = lambda text, special: [t + 1 for t in tokenizer.encode(text)]
        trainer = Trainer(_engine_recipe(tmp_path, engine), show_progress=False,
                          write_report=False)
        with pytest.raises(TokenizerMismatch, match="cross-tokenizer"), trainer:
            trainer.train()
        scored = [r for r, _ in engine.requests if r == "/v1/completions"]
    run_dirs = list((tmp_path / "run").iterdir())
    assert scored == []  # nothing was scored ...
    for run_dir in run_dirs:  # ... and nothing was sampled
        trajs = run_dir / "trajectories.jsonl"
        assert not trajs.exists() or trajs.read_text().strip() == ""


@pytest.mark.slow
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_opd_updates_with_an_engine_teacher(tmp_path, toy, flavour, monkeypatch):
    from miniverl.student.train.trainer import Trainer
    from tests.toy_kit import events, metrics

    model, tokenizer, _ = toy
    monkeypatch.setenv("MVL_TEST_ENGINE_KEY", "sk-never-written-anywhere")
    with FakeEngine(model, tokenizer, flavour=flavour,
                    api_key="sk-never-written-anywhere") as engine:
        recipe = _engine_recipe(tmp_path, engine, api_key_env="MVL_TEST_ENGINE_KEY")
        with Trainer(recipe, show_progress=False, write_report=False) as trainer:
            result = trainer.train()
        scored = [b for r, b in engine.requests if r in ("/v1/completions", "/generate")
                  and b is not None and ("prompt" in b or "input_ids" in b)]
    assert result.status == "completed" and result.final_version == 2
    rows = [r for r in metrics(result.run_dir) if "loss" in r]
    assert len(rows) >= 2 and all(np.isfinite(r["loss"]) for r in rows)
    assert len(scored) == 2 * 4  # one request per trajectory, four per cycle
    connected = events(result.run_dir, "teacher_connected")
    assert connected[0]["teacher"]["model"] == "toy-teacher"
    for path in result.run_dir.rglob("*"):
        if path.is_file():
            assert b"sk-never-written-anywhere" not in path.read_bytes(), path


def test_an_engine_endpoint_needs_its_api_in_the_recipe(tmp_path):
    with pytest.raises(Exception, match="api: vllm or api: sglang"):
        make_recipe("opd", tmp_path, sections={"teacher": {
            "model": {"path": "m"}, "endpoint": "http://127.0.0.1:8000"}})
    with pytest.raises(Exception, match="for an http"):
        make_recipe("opd", tmp_path, sections={"teacher": {"api": "vllm"}})


@pytest.mark.slow
def test_qualify_teacher_plays_through_the_engine_and_the_gate_reads_its_record(tmp_path, toy):
    from miniverl.cli.qualify_cmds import qualify_endpoint, qualify_recipe
    from miniverl.student.train.trainer import Trainer
    from tests.toy_kit import events, recipe_dict, write_recipe

    model, tokenizer, _ = toy
    with FakeEngine(model, tokenizer) as engine:
        engine_teacher = {"model": {"path": engine.model}, "endpoint": engine.url,
                          "api": "vllm", "min_success": 0.0}
        path = write_recipe(tmp_path / "engine.yaml", recipe_dict(
            "opd", tmp_path / "run", cycles=1, sections={"teacher": engine_teacher}))
        [(record, _)] = qualify_endpoint(path, engine.url, out=tmp_path / "engine.json")
        played = sum(1 for r, _ in engine.requests if r == "/v1/completions")
        # The same teacher weights measured in process: the same episodes, the same result.
        local = write_recipe(tmp_path / "local.yaml", recipe_dict("opd", tmp_path / "local"))
        [(in_process, _)] = qualify_recipe(local, out=tmp_path / "local.json")
        assert record["teacher"]["model"] == "toy-teacher" and record["endpoint"] == engine.url
        assert played > 0 and record["n"] == in_process["n"]
        assert record["success"] == in_process["success"]
        # The run's gate (teacher.min_success) finds the record of the served model.
        with Trainer(make_recipe("opd", tmp_path / "run", cycles=1,
                                 sections={"teacher": engine_teacher}),
                     show_progress=False, write_report=False) as trainer:
            result = trainer.train()
    qualified = events(result.run_dir, "teacher_qualified")
    assert result.status == "completed" and qualified[0]["teacher"]["model"] == "toy-teacher"


@pytest.mark.slow
def test_a_running_student_moves_to_an_engine_and_back_without_a_restart(tmp_path, toy,
                                                                         monkeypatch):
    from miniverl.student.train import loop
    from miniverl.student.train.trainer import Trainer
    from tests.toy_kit import events, started_teacher

    model, tokenizer, _ = toy
    with started_teacher(toy_dir(TEACHER), tmp_path) as served, \
            FakeEngine(model, tokenizer, flavour="sglang") as engine:
        recipe = make_recipe("opd", tmp_path / "run", cycles=3,
                             sections={"teacher": {"endpoint": served.endpoint}})
        trainer = Trainer(recipe, show_progress=False, write_report=False)
        log = loop.log_cycle
        hops = {1: engine.url, 2: served.endpoint}  # after update 1: to the engine; 2: back

        answers = []

        def logging_then_move(state, done):
            from miniverl.protocol.control_socket import RetargetRequest
            from miniverl.student.control import ControlServer

            log(state, done)
            if state.step in hops:  # as `miniverl teacher use RUN ENDPOINT` asks
                control = ControlServer(trainer)
                if state.step == 1:
                    with pytest.raises(ConfigError, match="no path"):
                        control._handle(RetargetRequest(id=1, endpoint=f"{engine.url}/v1"))
                answers.append(control._handle(RetargetRequest(id=2,
                                                               endpoint=hops.pop(state.step))))

        monkeypatch.setattr(loop, "log_cycle", logging_then_move)
        with trainer:
            result = trainer.train()
        scored = [b for r, b in engine.requests if r == "/generate" and "input_ids" in b]
    assert result.status == "completed" and result.final_version == 3
    moves = events(result.run_dir, "teacher_changed")
    assert [(m["how"], m["endpoint"]) for m in moves] == [
        ("retarget", engine.url), ("retarget", served.endpoint)]
    assert moves[0]["new"]["model"] == "toy-teacher"  # SGLang found by its /get_model_info
    assert len(scored) == 4  # the one cycle scored by the engine
    assert not events(result.run_dir, "teacher_swap_refused")
    assert [a.endpoint for a in answers] == [engine.url, served.endpoint]


def test_what_only_our_teacher_applies_is_refused_with_an_engine(tmp_path):
    engine = {"model": {"path": "m"}, "endpoint": "http://127.0.0.1:8000", "api": "vllm"}
    for extra, name in (({"prepare": "t.yaml"}, "prepare"), ({"adapter": "dir"}, "adapter"),
                        ({"scorer": "my_scorer"}, "scorer")):
        with pytest.raises(Exception, match=f"teacher.{name} .* is applied by"):
            make_recipe("opd", tmp_path, sections={"teacher": {**engine, **extra}})


def test_a_temperature_the_engine_cannot_serve_is_refused_before_any_rollout(tmp_path, toy):
    from miniverl.student.train.trainer import Trainer

    model, tokenizer, _ = toy
    with FakeEngine(model, tokenizer) as engine:
        recipe = make_recipe("opd", tmp_path / "run", cycles=1, sections={
            "teacher": {"model": {"path": engine.model}, "endpoint": engine.url, "api": "vllm"},
            "loss": {"temperature": 2.0, "allow_temperature_mismatch": True}})
        trainer = Trainer(recipe, show_progress=False, write_report=False)
        with pytest.raises(ConfigError, match="temperature 1 only"), trainer:
            trainer.train()
        assert not any(r in ("/v1/completions", "/tokenize") for r, _ in engine.requests)


def test_retarget_switches_only_to_a_server_that_validates(toy):
    model, tokenizer, _ = toy
    tokens, cu = _packed(_sequences(toy, 1))
    with FakeEngine(model, tokenizer) as first, FakeEngine(model, tokenizer, name="b") as second, \
            FakeEngine(model, tokenizer, name="c") as alien, _client(first, toy) as client:
        alien.tokenize = lambda text, special: [t + 1 for t in tokenizer.encode(text)]
        with pytest.raises(TokenizerMismatch):
            client.retarget(alien.url)
        assert client.endpoint == first.url  # refused: still the first server
        old = client.bind()
        hello = client.retarget(second.url)
        assert hello.teacher.model == "b" and client.endpoint == second.url
        client.set_version(0)
        assert client.bind() != old
        client.wait([client.submit(tokens, cu, np.array([1], np.int32), k=K)], timeout_s=10)
        assert any(r == "/v1/completions" for r, _ in second.requests)
