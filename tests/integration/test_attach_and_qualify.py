"""Attaching to a teacher served from a recipe, and measuring a teacher that is running.

Users rely on (docs/up.md "Attaching to a running teacher", docs/choosing-a-teacher.md):
``miniverl teacher serve --recipe R`` serves what ``R`` means, the teacher its
``teacher.prepare`` makes (prepared once, then reused from the cache), refuses one that
fails ``R``'s own gate, and the prepared teacher's qualification record goes with it,
so a gated student attached to it passes the gate; ``python -m miniverl.teacher_server
--recipe R``, which never trains, refuses with the command that prepares;
``miniverl qualify-teacher R --teacher ENDPOINT`` measures a running teacher over the
wire exactly as loading it in process does, greedy token for greedy token.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.toy_kit import (
    MINIVERL,
    ONE_LAYER,
    TEACHER,
    events,
    recipe_dict,
    seeded,
    started_teacher,
    toy_dir,
    write_recipe,
)

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

PREPARED = seeded(ONE_LAYER, 11)  # the teacher these recipes prepare


def opd(output_dir, split_seed: int, **teacher) -> dict:
    """Strict OPD with two one-turn rollouts a cycle and a warm-up of two steps."""
    return recipe_dict("opd", output_dir, teacher=PREPARED, cycles=1, rollouts_per_cycle=2,
                       sft_warmup_steps=2, sections={
                           "run": {"name": "attach"},
                           "teacher": {"memory": "resident", **teacher},
                           "environment": {"split_seed": split_seed},
                           "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 8,
                                       "batch_size": 2},
                       })


@pytest.fixture(scope="module")
def recipes(tmp_path_factory):
    """prep.yaml (two SFT steps of PREPARED), ok.yaml (gate 0: passes) and strict.yaml
    (gate 1.0: the preparation cannot reach it), all naming the same preparation."""
    folder = tmp_path_factory.mktemp("attach")
    prep = recipe_dict("sft", folder / "prep-runs", student=PREPARED, cycles=2,
                       sections={"run": {"name": "attach-prep"},
                                 "environment": {"split_seed": 7401}})
    write_recipe(folder / "prep.yaml", prep)
    paths = {"folder": folder, "prep": folder / "prep.yaml"}
    for name, gate in (("ok", 0.0), ("strict", 1.0)):
        paths[name] = write_recipe(folder / f"{name}.yaml", opd(
            folder / "runs", 7401, prepare="prep.yaml", min_success=gate))
    return paths


def test_serve_recipe_serves_the_prepared_teacher_and_its_record_travels(
        recipes, capsys, monkeypatch):
    from miniverl.cli.app import run
    from miniverl.common import qualification
    from miniverl.common.errors import ConfigError
    from miniverl.common.recipe import load_recipe
    from miniverl.student.teacher_prep import prepared_dir
    from miniverl.student.train.trainer import Trainer
    from miniverl.teacher_server.__main__ import build_parser, serve

    folder, ok = recipes["folder"], recipes["ok"]
    # The bare teacher process never trains: it names the command that does.
    with pytest.raises(ConfigError, match=f"miniverl teacher serve --recipe {ok}"):
        serve(build_parser().parse_args(["--recipe", str(ok)]))
    # The recipe's own gate refuses its preparation here, before anything is served.
    assert run(["teacher", "serve", "--recipe", str(recipes["strict"])]) == 1
    err = capsys.readouterr().err
    assert "measured success" in err and "below teacher.min_success 1" in err, err
    prepared = prepared_dir(load_recipe(ok), recipes["prep"])
    assert (prepared / "config.json").is_file()  # prepared once, by the refused serve

    endpoint = f"ipc://{folder}/served.sock"
    cmd = [*MINIVERL, "teacher", "serve", "--recipe", str(ok), "--bind", endpoint,
           "--log", str(folder / "served.log"), "--threads", "1"]
    out = folder / "served.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=sink,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        from miniverl.student.teacher_process import wait_until_ready

        wait_until_ready(endpoint, proc, 240.0, log=out)
        assert "(cached" in out.read_text()  # the preparation was reused, not redone
        with Trainer(load_recipe(ok), teacher_endpoint=endpoint, show_progress=False,
                     write_report=False) as trainer:
            result = trainer.train()
    finally:
        from miniverl.student.teacher_process import stop_teacher

        stop_teacher(proc)
    assert result.status == "completed"
    (connected,) = events(result.run_dir, "teacher_connected")
    assert connected["teacher"]["model"] == str(prepared.resolve())  # not the untrained toy
    (qualified,) = events(result.run_dir, "teacher_qualified")
    assert qualified["version"] == 0  # checked before the warm-up

    # The record lives beside the prepared weights too: with the cache's records gone,
    # the same teacher still qualifies.
    monkeypatch.setattr(qualification, "qualifications_dir", lambda: folder / "empty")
    identity = {k: connected["teacher"][k] for k in qualification.IDENTITY_KEYS}
    assert qualification.find_record(load_recipe(ok), identity) is not None


def test_qualify_teacher_measures_a_running_teacher(tmp_path, tmp_path_factory, capsys):
    import json

    from miniverl.cli.app import run
    from miniverl.common.modeling import load_causal_lm, load_tokenizer
    from miniverl.common.recipe import Recipe
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.protocol.sync_client import SyncTeacherClient
    from miniverl.student.eval import evaluate
    from miniverl.student.qualify_remote import RemoteGreedyLM

    data = recipe_dict("opd", tmp_path / "runs", sections={
        "teacher": {"min_success": 0.5}, "environment": {"split_seed": 7402}})
    path = write_recipe(tmp_path / "r.yaml", data)
    model_dir = toy_dir(TEACHER)
    folder = tmp_path_factory.mktemp("q")
    with started_teacher(model_dir, folder, extra=["--dtype", "float32"]) as served:
        assert run(["qualify-teacher", str(path), "--teacher", served.endpoint,
                    "--out", str(tmp_path / "q.json")]) == 1  # a random toy: not qualified
        out = capsys.readouterr().out
        assert "NOT qualified" in out and "on calculator eval (n=2)" in out, out

        # Token for token what the teacher's own weights decode greedily in process.
        recipe = Recipe.model_validate(data)
        tokenizer = load_tokenizer(model_dir)
        fp = fingerprint_tokenizer(tokenizer)
        local = evaluate(load_causal_lm(model_dir, dtype="float32", device="cpu"), tokenizer,
                         recipe, split="eval", policy_version=0, tokenizer_fp=fp)
        with SyncTeacherClient(served.endpoint, tokenizer_fp=fp,
                               vocab_size=len(tokenizer)) as client:
            hello = client.hello
            remote = evaluate(RemoteGreedyLM(client, hello.vocab_size,
                                             max_tokens=hello.limits.max_tokens,
                                             max_inflight=hello.limits.max_inflight),
                              tokenizer, recipe, split="eval", policy_version=0,
                              tokenizer_fp=fp)
    assert [t.tokens for t in remote.trajectories] == [t.tokens for t in local.trajectories]
    assert all(t.spans[-1].type.value.startswith("assistant") for t in local.trajectories)
    record = json.loads((tmp_path / "q.json").read_text())
    assert record["endpoint"] == served.endpoint and record["n"] == 2
    assert record["success"] == local.success and record["min_success"] == 0.5
    # The identity the teacher announced, matched by the content of its directory.
    assert record["teacher"]["model"] == str(model_dir)
    from miniverl.common.qualification import find_record, model_dir_digest

    assert record["model_dir_sha256"] == model_dir_digest(model_dir)
    assert find_record(recipe, record["teacher"]) == record

    # A bad endpoint is one line and exit 1.
    assert run(["qualify-teacher", str(path), "--teacher", "localhost:5555"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: endpoint 'localhost:5555'") and len(err.splitlines()) == 1
