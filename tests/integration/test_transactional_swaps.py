"""The competence gate applied early, and teacher swaps that are all or nothing.

Users rely on: a student checks its teacher (tokenizer and ``teacher.min_success``)
when it says HELLO, before it spends its SFT warm-up; a swap the run would refuse
(``teacher reload`` onto an unqualified teacher, ``teacher use`` of a teacher with
another tokenizer or without a qualification) is refused before it takes effect, the
command exits 1 with the reason, and training goes on with the old teacher; and when a
refusal happens anyway mid-run (a teacher without a gate reloaded under a gated
student), or the teacher is gone for good, the run checkpoints before it fails.

Real teacher processes over ipc (started once per module, concurrently); the trainer
runs in this process, and the commands run in this process too (``cli.app.run``) from
inside an update, so they land mid-run at a known version. Qualification records are
written for environments no other test uses (``split_seed``), in the session cache the
teacher processes read too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.toy_kit import (
    ONE_LAYER,
    TEACHER,
    alien_tokenizer_copy,
    events,
    metrics,
    recipe_dict,
    seeded,
    spawn_teacher,
    toy_dir,
    write_recipe,
)

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

OTHER = seeded(ONE_LAYER, 7)  # same tokenizer, other weights
THIRD = seeded(ONE_LAYER, 8)
# Environments (split seeds) whose records this module alone writes.
GATED = 7301  # the gated teacher's recipe: TEACHER and OTHER qualified
NO_RECORDS = 7302  # nothing qualified
SECOND = 7303  # another recipe: THIRD qualified, OTHER not


def recipe(output_dir: Path, split_seed: int, *, min_success: float | None = 0.5,
           **train) -> dict:
    """Strict OPD with a gate; two one-turn rollouts a cycle keep the updates cheap."""
    return recipe_dict("opd", output_dir, rollouts_per_cycle=2, sections={
        "run": {"name": "swaps"},
        "teacher": {"memory": "resident", "min_success": min_success},
        "environment": {"split_seed": split_seed},
        "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 8, "batch_size": 2},
    }, **train)


def qualify(data: dict, model_dir: Path, success: float) -> None:
    """A qualification record of ``model_dir`` for the environment of recipe ``data``."""
    from miniverl.common.qualification import (
        RECORD_KIND,
        environment_signature,
        model_dir_digest,
        save_record,
    )
    from miniverl.common.recipe import Recipe

    save_record({
        "kind": RECORD_KIND,
        "teacher": {"name": model_dir.name, "model": str(model_dir), "revision": None,
                    "adapter_sha256": None},
        "model_dir": str(model_dir), "model_dir_sha256": model_dir_digest(model_dir),
        "environment": environment_signature(Recipe.model_validate(data)), "split": "eval",
        "n": 2, "success": success, "by_difficulty": {}, "stop_reasons": {},
        "date": "2026-01-01T00:00:00+00:00", "miniverl_version": "test",
    })


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("swap")
    found = {"teacher": toy_dir(TEACHER), "other": toy_dir(OTHER), "third": toy_dir(THIRD)}
    found["alien"] = alien_tokenizer_copy(found["teacher"], folder / "alien")
    found["folder"] = folder
    gated = recipe(folder / "runs", GATED)
    found["gate_recipe"] = write_recipe(folder / "gate.yaml", gated)
    qualify(gated, found["teacher"], 1.0)
    qualify(gated, found["other"], 1.0)
    qualify(recipe(folder / "runs", SECOND), found["third"], 1.0)
    return found


@pytest.fixture(scope="module")
def teachers(dirs):
    """gated: TEACHER with the gate recipe's gate; third: THIRD, no gate; alien: another
    tokenizer. Started together: their imports overlap."""
    folder = dirs["folder"]
    served = {
        "gated": spawn_teacher(dirs["teacher"], folder, "gated",
                               extra=["--gate", str(dirs["gate_recipe"])]),
        "third": spawn_teacher(dirs["third"], folder, "third"),
        "alien": spawn_teacher(dirs["alien"], folder, "alien"),
    }
    try:
        for teacher in served.values():
            teacher.wait_ready()
        yield served
    finally:
        for teacher in served.values():
            teacher.stop()


def train(data: dict, endpoint: str, *, control: bool = False, during=None):
    """Train ``data`` against ``endpoint``; ``during(trainer)`` runs inside each update."""
    import miniverl.student.train.updates as steps_module
    from miniverl.common.recipe import Recipe
    from miniverl.student.control import ControlServer
    from miniverl.student.train.trainer import Trainer

    real_step = steps_module.distill_step
    trainer = Trainer(Recipe.model_validate(data), teacher_endpoint=endpoint,
                      show_progress=False, write_report=False)

    def step(*args, **kwargs):
        stats = real_step(*args, **kwargs)
        if during is not None and kwargs["objective"].kind != "none":  # distillation updates only
            during(trainer)
        return stats

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(steps_module, "distill_step", step)
        with trainer:
            if control:
                with ControlServer(trainer):
                    return trainer, trainer.train()
            return trainer, trainer.train()


def miniverl(capsys, *args: str) -> tuple[int, str]:
    """One ``miniverl`` command in this process: ``(exit code, stdout + stderr)``."""
    from miniverl.cli.app import run

    capsys.readouterr()
    code = run(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_gate_refuses_before_the_warm_up_is_spent(dirs, teachers, tmp_path):
    from miniverl.common.errors import TokenizerMismatch
    from miniverl.common.qualification import TeacherNotQualified

    runs = tmp_path / "runs"
    unqualified = recipe(runs, NO_RECORDS, sft_warmup_steps=50)
    with pytest.raises(TeacherNotQualified, match="no qualification record"):
        train(unqualified, teachers["gated"].endpoint)
    alien = recipe(runs, GATED, sft_warmup_steps=50)
    with pytest.raises(TokenizerMismatch):
        train(alien, teachers["alien"].endpoint)
    # Neither run took a single warm-up step (before, both failed after all 50).
    for run_dir in runs.iterdir():
        assert not (run_dir / "metrics.jsonl").exists() or not metrics(run_dir), run_dir
        assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"

    # A qualified teacher: gated at version 0, before the warm-up, then trained on.
    trainer, result = train(recipe(runs, GATED, sft_warmup_steps=3, cycles=1),
                            teachers["gated"].endpoint)
    assert result.status == "completed" and result.steps == 4
    (ok,) = events(result.run_dir, "teacher_qualified")
    assert ok["version"] == 0 and ok["success"] == 1.0
    assert [r["phase"] for r in metrics(result.run_dir)] == ["sft_warmup"] * 3 + ["train"]


def test_refused_swaps_leave_training_on_the_old_teacher(dirs, teachers, tmp_path, capsys):
    gated = teachers["gated"]
    answers: dict[str, tuple[int, str]] = {}

    def swaps(trainer):
        if trainer.version != 1 or answers:
            return
        run_dir = str(trainer.run.path)
        answers["reload"] = miniverl(capsys, "teacher", "reload", gated.endpoint,
                                     "--model", str(dirs["third"]))
        answers["alien"] = miniverl(capsys, "teacher", "use", run_dir,
                                    teachers["alien"].endpoint)
        answers["unqualified"] = miniverl(capsys, "teacher", "use", run_dir,
                                          teachers["third"].endpoint)

    trainer, result = train(recipe(tmp_path / "runs", GATED, cycles=4), gated.endpoint,
                            control=True, during=swaps)
    # Each swap exits 1 with the reason, in one line.
    code, out = answers["reload"]
    assert code == 1 and "no qualification record" in out and "keeps serving (gen 0)" in out
    code, out = answers["alien"]
    assert code == 1 and "tokenizer" in out.lower(), out
    code, out = answers["unqualified"]
    assert code == 1 and "no qualification record" in out, out
    assert all(len(out.strip().splitlines()) == 1 for _, out in answers.values()), answers
    # ...and training went on to the end with the teacher it had.
    assert result.status == "completed" and result.steps == 4
    rows = metrics(result.run_dir)
    assert len({(r["teacher"]["instance"], r["teacher"]["gen"]) for r in rows}) == 1
    assert rows[0]["teacher"]["gen"] == 0
    assert events(result.run_dir, "teacher_changed") == []
    refused = events(result.run_dir, "teacher_swap_refused")
    assert [e["endpoint"] for e in refused] == [teachers["alien"].endpoint,
                                                teachers["third"].endpoint]
    assert "reload_failed" in gated.events() and "reloaded" not in gated.events()


def test_a_refusal_mid_run_checkpoints_first(dirs, teachers, tmp_path, capsys):
    # The teacher has no gate of its own, so the reload happens; the student's gate
    # refuses the new teacher at the next update, and the training done is kept.
    from miniverl.common.qualification import TeacherNotQualified

    third = teachers["third"]
    reloaded = []

    def reload(trainer):
        if trainer.version == 1 and not reloaded:
            reloaded.append(miniverl(capsys, "teacher", "reload", third.endpoint,
                                     "--model", str(dirs["other"])))

    data = recipe(tmp_path / "runs", SECOND, cycles=5)
    try:
        with pytest.raises(TeacherNotQualified, match="no qualification record"):
            train(data, third.endpoint, during=reload)
    finally:
        code, _ = miniverl(capsys, "teacher", "reload", third.endpoint,
                           "--model", str(dirs["third"]))
    assert reloaded[0][0] == 0 and code == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    (checkpoint,) = events(run_dir, "checkpoint")
    assert checkpoint["step"] == 2 and Path(checkpoint["path"]).is_dir()
    assert (Path(checkpoint["path"]) / "model.safetensors").is_file()


def test_a_teacher_gone_for_good_checkpoints_first(tmp_path):
    # The same guarantee for a teacher that never comes back (unavailable_timeout_s ran
    # out): the steps already taken are in a checkpoint when the run fails.
    from miniverl.common.errors import TeacherUnavailable
    from miniverl.common.recipe import Recipe
    from miniverl.student.train.trainer import Trainer
    from tests.student.train.trainer_kit import load_toy_teacher

    client = load_toy_teacher().fake_client()
    real_wait = client.wait

    def wait(ids, timeout_s=None):
        if client.scored_versions and client.scored_versions[-1] == 3:
            raise TeacherUnavailable("no handshake with the teacher within 20 s")
        return real_wait(ids, timeout_s)

    client.wait = wait
    data = recipe(tmp_path / "runs", NO_RECORDS, min_success=None, cycles=6)
    with Trainer(Recipe.model_validate(data), client=client, show_progress=False,
                 write_report=False) as trainer, pytest.raises(TeacherUnavailable):
        trainer.train()
    (checkpoint,) = events(trainer.run.path, "checkpoint")
    assert checkpoint["step"] == 3 and (Path(checkpoint["path"]) / "model.safetensors").is_file()
