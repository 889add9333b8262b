"""The competence gate and the privileged-context mode, through the real trainer loop.

Users rely on: ``teacher.min_success`` refuses a teacher that was never qualified or
measured too low (the one-line error carries the measured value), accepts one that
measured high enough, and matches records to the *same* teacher only (same weights,
adapter and environment); ``teacher.mode: privileged_context`` trains end to end on
every environment, the teacher being sent its own view (privileged system message)
while the loss stays on the student's positions.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from miniverl.common.recipe import Recipe  # noqa: E402
from miniverl.student import qualify  # noqa: E402
from miniverl.student.qualify import (  # noqa: E402
    TeacherNotQualified,
    find_record,
    measure,
    require_qualified,
    save_record,
)
from miniverl.student.train.trainer import Trainer  # noqa: E402
from tests.toy_kit import TEACHER, events, metrics, recipe_dict, toy_dir  # noqa: E402

FAKE_IDENTITY = {"name": "toy-teacher", "model": "toy", "revision": None, "adapter_sha256": None}


@pytest.fixture
def records(tmp_path, monkeypatch):
    """A private qualifications folder (the session cache is shared by every test)."""
    from miniverl.common import qualification

    folder = tmp_path / "qualifications"
    monkeypatch.setattr(qualification, "qualifications_dir", lambda: folder)
    return folder


def _recipe(tmp_path, **teacher):
    data = recipe_dict("opd", tmp_path / "runs", cycles=1)
    data["teacher"].update(memory="resident", **teacher)
    return Recipe.model_validate(data)


def _record(recipe, success, identity=FAKE_IDENTITY, split="eval", **over):
    return {
        "kind": qualify.RECORD_KIND, "teacher": dict(identity), "model_dir": None,
        "model_dir_sha256": None, "environment": qualify.environment_signature(recipe),
        "split": split, "n": 8, "success": success, "by_difficulty": {},
        "date": "2026-01-01T00:00:00+00:00", "miniverl_version": "test", **over,
    }


def test_measure_writes_a_record_that_matches_only_the_same_teacher(toy, tmp_path, records):
    from miniverl.common.modeling import load_tokenizer

    recipe = _recipe(tmp_path)
    model_dir = toy_dir(TEACHER)
    identity = {"name": "toy-teacher", "model": str(model_dir), "revision": None,
                "adapter_sha256": None}
    record = measure(toy.model, load_tokenizer(model_dir), recipe, identity=identity,
                     model_dir=model_dir, split="eval", tokenizer_fp=toy.tokenizer_fp)
    assert record["n"] == 2 and 0.0 <= record["success"] <= 1.0
    assert record["model_dir_sha256"].startswith("sha256:")
    assert set(record) >= {"teacher", "split", "by_difficulty", "date", "miniverl_version"}
    paths = save_record(record, out=tmp_path / "q.json")
    assert json.loads((tmp_path / "q.json").read_text()) == record
    assert paths[0].parent == records
    assert find_record(recipe, identity) == record
    # Another adapter, another environment, another revision: not this record.
    assert find_record(recipe, {**identity, "adapter_sha256": "sha256:ab"}) is None
    other_env = recipe.model_copy(update={"environment": recipe.environment.model_copy(
        update={"difficulty": "hard"})})
    assert find_record(other_env, identity) is None
    # The same path with other weights is another teacher: the digest decides.
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in model_dir.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    assert find_record(recipe, {**identity, "model": str(copy)}) == record  # same content
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    assert find_record(recipe, {**identity, "model": str(copy)}) is None
    with pytest.raises(Exception, match="held-out split"):
        measure(toy.model, None, recipe, identity=identity, model_dir=model_dir, split="train")


def test_a_privileged_teacher_is_measured_and_gated_in_the_view_it_scores_with(
        toy, tmp_path, records):
    # A privileged_context teacher scores with the task's privileged context in its
    # system message; measured without it, the gate would vouch for a view nobody scores.
    from miniverl.common.modeling import load_tokenizer
    from miniverl.common.trajectory import read_trajectories
    from miniverl.student.environments import get_environment, make_tasks
    from miniverl.student.eval import evaluate
    from miniverl.student.rollout.privileged import teacher_system

    plain = _recipe(tmp_path, min_success=0.5)
    privileged = _recipe(tmp_path, min_success=0.5, mode="privileged_context")
    assert "view" not in qualify.environment_signature(plain)  # old plain records still match
    assert qualify.environment_signature(privileged)["view"] == "privileged_context"
    tokenizer = load_tokenizer(toy_dir(TEACHER))
    evaluate(toy.model, tokenizer, privileged, split="eval", policy_version=0,
             out_dir=tmp_path / "priv", tokenizer_fp=toy.tokenizer_fp, privileged=True)
    evaluate(toy.model, tokenizer, plain, split="eval", policy_version=0,
             out_dir=tmp_path / "plain", tokenizer_fp=toy.tokenizer_fp)
    cfg = plain.environment
    env = get_environment(cfg.name, **cfg.params)
    tasks = {t.id: t for t in make_tasks(cfg.name, "eval", cfg.eval_tasks, cfg.difficulty,
                                         cfg.split_seed, params=cfg.params)}
    for view, want in (("priv", True), ("plain", False)):
        (traj, *_rest) = read_trajectories(tmp_path / view / "eval-v0.trajectories.jsonl")
        system = traj.messages[0]["content"]
        hint = env.privileged_context(tasks[traj.task_id])
        assert (system == teacher_system(env.system_prompt(), hint)) is want
        assert (hint in tokenizer.decode(traj.tokens[: traj.spans[0].end])) is want
    record = measure(toy.model, tokenizer, privileged, identity=FAKE_IDENTITY, model_dir=None,
                     split="eval", tokenizer_fp=toy.tokenizer_fp)
    assert record["environment"]["view"] == "privileged_context"
    # A plain-view record (a preparation's, say) does not qualify the privileged teacher...
    save_record(_record(plain, 0.9))
    assert require_qualified(plain, FAKE_IDENTITY)["success"] == 0.9
    with pytest.raises(TeacherNotQualified, match="in its privileged_context view"):
        require_qualified(privileged, FAKE_IDENTITY)
    # ...its own view's record does, and the two never mix.
    save_record(_record(privileged, 0.6))
    assert require_qualified(privileged, FAKE_IDENTITY)["success"] == 0.6
    assert require_qualified(plain, FAKE_IDENTITY)["success"] == 0.9


def test_gate_prefers_eval_and_the_latest_record(tmp_path, records):
    recipe = _recipe(tmp_path, min_success=0.5)
    save_record(_record(recipe, 0.9, split="test"))
    save_record(_record(recipe, 0.2, date="2025-01-01T00:00:00+00:00"))
    with pytest.raises(TeacherNotQualified, match="measured success 0.200 on calculator eval"):
        require_qualified(recipe, FAKE_IDENTITY)
    save_record(_record(recipe, 0.7, date="2026-02-01T00:00:00+00:00",
                        miniverl_version="newer"))
    assert require_qualified(recipe, FAKE_IDENTITY)["success"] == 0.7
    # Without min_success there is no gate at all.
    assert require_qualified(_recipe(tmp_path), {"name": "x", "model": "y"}) is None


def test_train_refuses_an_unqualified_teacher(toy, tmp_path, records):
    recipe = _recipe(tmp_path, min_success=0.5)
    with Trainer(recipe, client=toy.fake_client(), show_progress=False,
                 write_report=False) as trainer, pytest.raises(
            TeacherNotQualified, match=r"has no qualification record .* qualify-teacher"):
        trainer.train()
    assert trainer.step == 0  # refused before any update


def test_train_refuses_an_under_qualified_teacher_with_the_measured_value(toy, tmp_path, records):
    recipe = _recipe(tmp_path, min_success=0.5)
    save_record(_record(recipe, 0.25))
    with Trainer(recipe, client=toy.fake_client(), show_progress=False,
                 write_report=False) as trainer, pytest.raises(
            TeacherNotQualified, match=r"measured success 0.250 .* below teacher.min_success 0.5"):
        trainer.train()
    assert "\n" not in str(TeacherNotQualified("x"))


def test_train_accepts_a_qualified_teacher(toy, tmp_path, records):
    recipe = _recipe(tmp_path, min_success=0.5)
    save_record(_record(recipe, 0.75))
    with Trainer(recipe, client=toy.fake_client(), show_progress=False,
                 write_report=False) as trainer:
        result = trainer.train()
    assert result.status == "completed" and result.steps == 1
    (ok,) = events(result.run_dir, "teacher_qualified")
    assert ok["success"] == 0.75 and ok["min_success"] == 0.5


@pytest.mark.parametrize("env_name", ["calculator", "jsonnav", "sqlite"])
@pytest.mark.slow
def test_privileged_context_opd_end_to_end(toy, tmp_path, env_name):
    from miniverl.common.trajectory import read_trajectories
    from miniverl.student.environments import get_environment, make_tasks
    from miniverl.student.targets_cache import TargetsCache

    data = recipe_dict("opd", tmp_path / "runs", cycles=2, rollouts_per_cycle=2)
    data["teacher"].update(memory="resident", mode="privileged_context")
    data["environment"].update(name=env_name)
    data["rollout"].update(max_total_tokens=900)
    recipe = Recipe.model_validate(data)
    client = toy.fake_client()
    sent = []
    real_submit = client.submit

    def spy(tokens_N, cu_seqlens, positions_P, **kw):
        sent.append((np.array(tokens_N), np.array(positions_P)))
        return real_submit(tokens_N, cu_seqlens, positions_P, **kw)

    client.submit = spy
    with Trainer(recipe, client=client, show_progress=False, write_report=False) as trainer:
        result = trainer.train()
    assert result.status == "completed" and result.steps == 2
    rows = [r for r in metrics(result.run_dir) if r.get("phase") == "train"]
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows)
    assert sent, "the teacher was never asked"
    env = get_environment(env_name)
    tasks = {t.id: t for t in make_tasks(env_name, "train", 8, "easy", 0)}
    trajs = read_trajectories(result.run_dir / "trajectories.jsonl")
    for tokens, positions in sent:
        # Each request is some trajectory's privileged view: its system segment carries
        # the task's privileged context, the rest is the student's ids verbatim.
        match = [t for t in trajs
                 if tokens[len(tokens) - (len(t.tokens) - t.spans[0].end):].tolist()
                 == t.tokens[t.spans[0].end:]]
        assert match
        traj = match[0]
        head = toy_text(tokens[: len(tokens) - (len(traj.tokens) - traj.spans[0].end)])
        assert env.privileged_context(tasks[traj.task_id]) in head
        assert positions.min() >= len(tokens) - len(traj.tokens)
    # The cache keeps the student's positions (what the loss uses), keyed by mode.
    cache = TargetsCache(result.run_dir / "targets")
    by_id = {t.id: t for t in trajs}
    entries = cache.keys()
    assert entries
    for key in entries:
        assert key.teacher.endswith("+privileged_context")
        cached = cache.get(key)["positions"]
        assert cached.max() < len(by_id[key.trajectory_id].tokens) - 1


def toy_text(ids) -> str:
    from miniverl.common.toy import build_toy_tokenizer

    return build_toy_tokenizer().decode(np.asarray(ids).tolist())


def test_a_prepared_teacher_is_qualified_by_its_own_held_out_eval(tmp_path, records, monkeypatch):
    # `up` prepares the teacher and then gates it: a preparation that did not make the
    # teacher competent is refused with the success it measured, not served silently.
    from miniverl.common import toy as toy_stack
    from miniverl.student import teacher_prep

    monkeypatch.setattr(toy_stack, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(teacher_prep, "cache_root", lambda: tmp_path / "cache")
    prep = recipe_dict("sft", tmp_path / "prep-runs", cycles=2)
    prep["student"]["model"] = {"toy": dict(recipe_dict("opd", tmp_path)["teacher"]["model"]["toy"])}
    prep_path = tmp_path / "prep.yaml"
    prep_path.write_text(json.dumps(prep), encoding="utf-8")  # JSON is YAML
    recipe = _recipe(tmp_path, prepare=str(prep_path), min_success=0.5)
    prepared = teacher_prep.prepare_teacher(recipe, prep_path, show_progress=False)
    assert not prepared.cached
    identity = {"name": prepared.model_dir.name, "model": str(prepared.model_dir),
                "revision": None, "adapter_sha256": None}
    record = find_record(recipe, identity)
    assert record is not None and record["split"] == "eval" and record["n"] == 2
    assert record["success"] == prepared.record["eval"]["success"]
    assert (prepared.model_dir / qualify.RECORD_FILE).is_file()
    assert record["success"] < 0.5  # two SFT steps: the toy teacher cannot solve anything yet
    with pytest.raises(TeacherNotQualified, match=f"measured success {record['success']:.3f}"):
        require_qualified(recipe, identity)


def test_a_prepared_teacher_is_qualified_before_it_is_published(tmp_path, records, monkeypatch):
    # Another process that finds the prepared directory uses it at once (no lock on the
    # cached path) and gates it: the record must exist before the directory appears. It
    # used to be written after the rename, while the digest of a large directory was
    # computed, and a gate in that window found "no qualification record".
    from miniverl.common import toy as toy_stack
    from miniverl.student import teacher_prep

    monkeypatch.setattr(toy_stack, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(teacher_prep, "cache_root", lambda: tmp_path / "cache")
    prep = recipe_dict("sft", tmp_path / "prep-runs", cycles=1)
    prep["student"]["model"] = {"toy": dict(recipe_dict("opd", tmp_path)["teacher"]["model"]["toy"])}
    prep_path = tmp_path / "prep.yaml"
    prep_path.write_text(json.dumps(prep), encoding="utf-8")
    recipe = _recipe(tmp_path, prepare=str(prep_path), min_success=0.5)
    final = teacher_prep.prepared_dir(recipe, prep_path)
    seen = []
    real_replace = teacher_prep.os.replace

    def publishing(src, dst):
        if Path(dst) == final:
            kept = [json.loads(p.read_text()) for p in records.glob("*.json")
                    if p.name != "model_dirs.json"]
            seen.append(((Path(src) / qualify.RECORD_FILE).is_file(),
                         (Path(src) / teacher_prep.PREPARED_FILE).is_file(),
                         [r["teacher"]["model"] for r in kept]))
        return real_replace(src, dst)

    monkeypatch.setattr(teacher_prep.os, "replace", publishing)
    prepared = teacher_prep.prepare_teacher(recipe, prep_path, show_progress=False)
    assert seen == [(True, True, [str(final)])]
    identity = {"name": final.name, "model": str(final), "revision": None, "adapter_sha256": None}
    record = find_record(recipe, identity)  # the digest taken before the move matches after it
    assert record is not None and record["model_dir"] == qualify.stored_dir(final)
    assert record["success"] == prepared.record["eval"]["success"]


def test_a_privileged_preparation_trains_and_qualifies_the_view_its_teacher_scores(
        tmp_path, records, monkeypatch):
    # rollout.view in the preparation: SFT on privileged-view oracle traces, the held-out
    # eval in that view, and a record the privileged recipe's gate reads (a plain one can't).
    from miniverl.common import toy as toy_stack
    from miniverl.student import teacher_prep
    from miniverl.student.rollout.runner import RolloutRunner
    from miniverl.student.train.modes import sft as sft_mode

    monkeypatch.setattr(toy_stack, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(teacher_prep, "cache_root", lambda: tmp_path / "cache")
    prep = recipe_dict("sft", tmp_path / "prep-runs", cycles=2)
    prep["student"]["model"] = {"toy": dict(recipe_dict("opd", tmp_path)["teacher"]["model"]["toy"])}
    prep["rollout"]["view"] = "privileged_context"
    prep_path = tmp_path / "prep.yaml"
    prep_path.write_text(json.dumps(prep), encoding="utf-8")  # JSON is YAML
    recipe = _recipe(tmp_path, prepare=str(prep_path), min_success=0.0,
                     mode="privileged_context")
    seen: dict[str, list] = {"trained": [], "evaluated": []}
    real_oracle, real_run = sft_mode.oracle_trajectories, RolloutRunner.run

    def oracle_spy(*args, **kwargs):
        out = real_oracle(*args, **kwargs)
        seen["trained"] += out
        return out

    def run_spy(self, *args, **kwargs):
        out = real_run(self, *args, **kwargs)
        seen["evaluated"] += out
        return out

    monkeypatch.setattr(sft_mode, "oracle_trajectories", oracle_spy)
    monkeypatch.setattr(RolloutRunner, "run", run_spy)
    prepared = teacher_prep.prepare_teacher(recipe, prep_path, show_progress=False)
    identity = {"name": prepared.model_dir.name, "model": str(prepared.model_dir),
                "revision": None, "adapter_sha256": None}
    assert require_qualified(recipe, identity)["environment"]["view"] == "privileged_context"
    plain = _recipe(tmp_path, prepare=str(prep_path), min_success=0.0)
    assert find_record(plain, identity) is None
    assert seen["trained"] and seen["evaluated"]  # what it trained on and what measured it
    assert all("The answer is" in traj.messages[0]["content"] for traj in seen["trained"])
    assert all("The answer is" in traj.messages[0]["content"] for traj in seen["evaluated"])
