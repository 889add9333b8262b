"""Several teachers for one student where a teacher has another tokenizer
(docs/several-teachers.md, "Teachers with another tokenizer").

Each route keeps its own tokenizer rule: ``teachers.NAME.tokenizer: other`` makes that
route's link an xvocab one (each episode rendered with its own environment's tools,
group targets over the byte alignment), while a route with the student's tokenizer asks
for token-id targets as before. A run with routes of both kinds trains each episode by
the objective of its own kind (``mixed``). The teacher with another tokenizer is the
real ``TeacherServer`` of ``conftest.py`` (``other_teacher``); the one with the
student's is the toy behind a ``FakeTeacherClient``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from miniverl.common.recipe import Recipe
from miniverl.testing.fake_teacher import FakeTeacherClient
from tests.student.train.trainer_kit import load_toy_teacher
from tests.toy_kit import events, metrics, recipe_dict

pytestmark = [pytest.mark.integration, pytest.mark.slow]

torch.set_num_threads(1)

SAMPLED = {"estimator": "sampled_token", "divergence": "reverse_kl"}


def _recipe(tmp_path, calc: str, nav: str) -> Recipe:
    data = recipe_dict("opd", tmp_path / "run", cycles=3, rollouts_per_cycle=8,
                       sft_warmup_steps=60, sft_warmup_lr=1e-2)
    teacher = data.pop("teacher")
    del data["environment"]
    data["teachers"] = {"calc": {**teacher, "tokenizer": calc},
                        "nav": {**teacher, "tokenizer": nav}}
    # calculator without units shows one tool: an episode rendered with the default
    # schemas would not be its own tokens (teacher/xvocab.py, XvocabRequests).
    data["environments"] = [
        {"name": "calculator", "teacher": "calc", "train_tasks": 8, "eval_tasks": 2,
         "test_tasks": 2, "params": {"units": False}},
        {"name": "jsonnav", "teacher": "nav", "train_tasks": 8, "eval_tasks": 2,
         "test_tasks": 2}]
    data["loss"].update(SAMPLED)
    return Recipe.model_validate(data)


def _train(recipe, monkeypatch, **endpoints):
    from miniverl.student.train import updates
    from miniverl.student.train.trainer import Trainer

    seen, real = [], updates.distill_step

    def recording(policy, *args, **kw):  # each OPD update: the kinds it trained on
        if kw["objective"].kind != "none":
            scored = args[2]
            seen.append((kw["objective"].kind, [(s.traj.environment, s.kind, sorted(s.arrays))
                                      for s in scored if len(s.positions_P)]))
            before = [p.detach().clone() for p in policy.model.parameters()]
            out = real(policy, *args, **kw)
            seen[-1] += (any(not torch.equal(a, p) for a, p in
                             zip(before, policy.model.parameters(), strict=True)),)
            return out
        return real(policy, *args, **kw)

    monkeypatch.setattr(updates, "distill_step", recording)
    clients = endpoints.pop("clients", None)
    trainer = Trainer(recipe, teacher_endpoints=endpoints, route_clients=clients,
                      show_progress=False, write_report=False, checkpoints=False)
    with trainer:
        result = trainer.train()
    return trainer, result, seen


def test_a_route_with_another_tokenizer_beside_one_with_the_students(tmp_path, other_teacher,
                                                                      monkeypatch):
    endpoint, teacher_fp = other_teacher
    toy = load_toy_teacher()
    calc = FakeTeacherClient(toy.model, toy.tokenizer_fp, toy.vocab_size, name="calc-teacher")
    trainer, result, seen = _train(_recipe(tmp_path, "same", "other"), monkeypatch,
                                   nav=endpoint, clients={"calc": calc})
    assert result.status == "completed" and trainer.state.objective.kind == "mixed"
    sides = trainer.state.teacher.routes
    assert sides["nav"].client.hello.tokenizer_fp == teacher_fp
    assert sides["calc"].client.hello.tokenizer_fp == toy.tokenizer_fp
    assert len(seen) == 3 and all(kind == "mixed" and moved for kind, _, moved in seen)
    trained = [row for _, rows, _ in seen for row in rows]
    # Each episode's targets are its own route's kind: token ids from calc, byte groups
    # from nav.
    assert {env for env, _, _ in trained} == {"calculator", "jsonnav"}
    for env, kind, arrays in trained:
        if env == "calculator":
            assert kind == "topk" and "ids" in arrays and "group_first" not in arrays
        else:
            assert kind == "xvocab" and "group_first" in arrays and "ids" not in arrays
    by_teacher = result.counters["by_teacher"]
    assert by_teacher["nav"]["xvocab_sent"] > 0 and "xvocab_sent" not in by_teacher["calc"]
    assert result.counters["xvocab_sent"] == by_teacher["nav"]["xvocab_sent"]
    # calc was asked for its own environment's episodes only, as token ids.
    calculator = sum(env == "calculator" for env, _, _ in trained)
    assert len(calc.scored_versions) >= calculator > 0
    rows = metrics(result.run_dir)
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert all(r["stale_dropped"] == 0 for r in rows if r.get("phase") == "train")
    connected = {e["route"]: e["teacher"]["name"] for e in events(result.run_dir,
                                                                     "teacher_connected")}
    assert connected == {"calc": "calc-teacher", "nav": "byte-fallback-teacher"}


def test_two_routes_with_another_tokenizer_render_each_episode_with_its_own_tools(
        tmp_path, other_teacher, monkeypatch):
    endpoint, _ = other_teacher
    trainer, result, seen = _train(_recipe(tmp_path, "other", "other"), monkeypatch,
                                   calc=endpoint, nav=endpoint)
    assert result.status == "completed" and trainer.state.objective.kind == "xvocab"
    assert len(seen) == 3 and all(kind == "xvocab" and moved for kind, _, moved in seen)
    assert {env for _, rows, _ in seen for env, _, _ in rows} == {"calculator", "jsonnav"}
    by_teacher = result.counters["by_teacher"]
    for name in ("calc", "nav"):
        links = trainer.state.teacher.routes[name].link
        # Each route renders with every environment's own params; calculator's is one tool.
        assert links.xvocab.env_params["calculator"] == {"units": False}
        assert by_teacher[name]["xvocab_sent"] > 0
    # A calculator episode rendered with the default (two-tool) schemas never aligns, so
    # calc's sent episodes were rendered with calculator's own params.
    calc = trainer.state.teacher.routes["calc"].link.xvocab
    assert calc.sent > 0, (calc.sent, calc.unaligned)
