"""Experiment trackers (``run.loggers``): what a toy run writes to each is read back.

A user who picks TensorBoard, W&B, MLflow or trackio relies on seeing the same numbers
there as in ``metrics.jsonl``: each test reads a tracker's files back with that
tracker's own reader (tests/student/tracker_readers.py) and compares metric names and
last values, and the run config (run id, recipe digest). Every tracker runs in its
offline mode: ``WANDB_MODE=offline``, MLflow's local store under the run's output
directory, trackio's local store in ``TRACKIO_DIR``, TensorBoard event files.

A tracker library that is not installed skips its tests with the reason; the others
still run.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from miniverl.common.errors import ConfigError, MissingExtraError
from miniverl.common.recipe import Recipe, recipe_digest
from miniverl.common.rundir import RunDir
from miniverl.student.trackers import Trackers, check_loggers, open_trackers, with_loggers
from tests.extras import missing, needs
from tests.student import tracker_readers as read
from tests.student.report.report_runs import toy_sft_recipe
from tests.toy_kit import make_recipe

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
INSTALLED = [n for n in TRACKERS if missing(n) is None]


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """Offline modes for every tracker, for this module only."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.delenv("WANDB_PROJECT", raising=False)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        store = tmp_path_factory.mktemp("trackio")
        mp.setenv("TRACKIO_DIR", str(store))
        if "trackio" in sys.modules:  # trackio reads TRACKIO_DIR once, when imported
            for name in ("trackio", "trackio.utils", "trackio.sqlite_storage"):
                mp.setattr(sys.modules[name], "TRACKIO_DIR", store)
        yield tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def toy_run(offline) -> Path:
    """A two-step toy SFT run with every installed tracker on.

    Starting every tracker library takes over 10 s, paid by whichever test asks first:
    each test that uses it is marked slow (tests/tiers.py)."""
    from miniverl.student.train.trainer import Trainer

    data = toy_sft_recipe(offline)
    data["run"]["loggers"] = list(INSTALLED)
    with Trainer(Recipe.model_validate(data), show_progress=False) as trainer:
        result = trainer.train()
    assert result.status == "completed"
    return result.run_dir


def _same_numbers(last: dict[str, float], run_dir: Path, rel: float = 0.0) -> None:
    expected = read.expected_last(run_dir)
    assert {"loss", "grad_norm", "bytes_sent", "stale_dropped", "eval/success"} <= set(expected)
    missing = sorted(set(expected) - set(last))
    assert not missing, f"not in the tracker: {missing}"
    for key, value in expected.items():
        assert last[key] == pytest.approx(value, rel=rel, abs=1e-12), key


def _config_names_the_run(config: dict, run_dir: Path) -> None:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    text = json.dumps(config)
    assert run_dir.name in text and manifest["recipe_digest"] in text


@pytest.mark.slow
@needs("tensorboard")
def test_tensorboard_holds_the_metrics_of_metrics_jsonl(toy_run):
    last, config, notes = read.tensorboard(toy_run)
    _same_numbers(last, toy_run, rel=1e-6)  # event files store float32
    _config_names_the_run(config, toy_run)
    assert any("run_completed" in n for n in notes)


@pytest.mark.slow
@needs("wandb")
def test_wandb_offline_holds_the_metrics_of_metrics_jsonl(toy_run):
    last, config, notes = read.wandb(toy_run)
    _same_numbers(last, toy_run)
    _config_names_the_run(config, toy_run)
    assert config["_state"] == "finished"
    assert config["_project"] == "miniverl" and config["_run_id"] == toy_run.name
    assert any(n.startswith("run_completed") for n in notes)


@pytest.mark.slow
@needs("mlflow")
def test_mlflow_local_store_holds_the_metrics_of_metrics_jsonl(toy_run):
    last, config, notes = read.mlflow(toy_run.parent, toy_run.name)
    _same_numbers(last, toy_run)
    _config_names_the_run(config, toy_run)
    assert config["_status"] == "FINISHED"
    assert any("run_completed" in n for n in notes)


@pytest.mark.slow
@needs("trackio")
def test_trackio_local_store_holds_the_metrics_of_metrics_jsonl(toy_run):
    last, config, _ = read.trackio(toy_run.name)
    _same_numbers(last, toy_run)
    _config_names_the_run(config, toy_run)


@pytest.mark.slow
def test_the_trackers_started_event_names_every_logger(tmp_path, monkeypatch, request):
    # The event names every logger of the recipe, jsonl first, and where each one writes:
    # with a recording tracker in place of each library (no extra needed), then in the
    # toy run with every tracker library installed here.
    from miniverl.student import trackers

    class Started(_Good):
        def __init__(self, name):
            super().__init__()
            self.name, self.where = name, f"{name}-store"

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        object() if name in trackers.TRACKER_MODULES else real(name, *a)))
    for name in TRACKERS:
        monkeypatch.setitem(trackers.BACKENDS, name,
                            lambda run, recipe, config, name=name: Started(name))
    recipe = make_recipe("sft", tmp_path, sections={"run": {"loggers": list(TRACKERS)}})
    run = RunDir.create(tmp_path, recipe, run_id="t-started")
    open_trackers(run, recipe).close("completed")
    (started,) = [e for e in run.events() if e["event"] == "trackers_started"]
    assert started["loggers"] == ["jsonl", *TRACKERS]
    assert started["where"] == {name: f"{name}-store" for name in TRACKERS}
    if not INSTALLED:
        return  # the real libraries' part needs at least one tracker extra
    toy_run = request.getfixturevalue("toy_run")
    started = [json.loads(line) for line in (toy_run / "events.jsonl").read_text().splitlines()
               if '"trackers_started"' in line]
    assert started and started[0]["loggers"] == ["jsonl", *INSTALLED]
    assert set(started[0]["where"]) == set(INSTALLED)


# -- teacher changes and events, written by hand into a run directory ---------------------


@pytest.fixture(scope="module")
def teacher_run(offline) -> Path:
    """An opd run directory fed by hand: a connect, a reload, an eval; then closed."""
    recipe = make_recipe("opd", offline, sections={"run": {"loggers": list(INSTALLED)}})
    run = RunDir.create(offline, recipe, run_id="t-opd-teachers")
    trackers = open_trackers(run, recipe)
    old = {"name": "toy-teacher", "instance": "aaaa1111", "gen": 0}
    new = {"name": "toy-teacher", "instance": "aaaa1111", "gen": 1}
    run.event("teacher_connected", teacher=old, version=0, endpoint="ipc:///tmp/x/teacher.sock")
    for step in (1, 2, 3):
        run.metric({"step": step, "version": step, "loss": 1.0 / step, "divergence": 0.5 / step,
                    "stale_dropped": step - 1, "bytes_received": 1000 * step, "mode": "opd",
                    "on_policy": True, "teacher": old if step < 3 else new})
        if step == 2:
            run.event("teacher_changed", how="reload", old=old, new=new, version=2)
    run.event("eval", version=3, split="eval", success=0.75, n=4, by_difficulty={})
    trackers.close("completed")
    assert run.observers == []
    return run.path


def _teacher_notes_ok(notes: list[str]) -> None:
    assert any("teacher reload: toy-teacher instance aaaa1111 gen 0 -> toy-teacher instance "
               "aaaa1111 gen 1 at version 2" in n for n in notes), notes
    assert not any("/tmp/x" in n for n in notes)  # local paths never reach a dashboard


@needs("tensorboard")
def test_tensorboard_annotates_teacher_changes(teacher_run):
    last, config, notes = read.tensorboard(teacher_run)
    assert last["teacher/changes"] == 2 and last["eval/success"] == 0.75
    assert last["stale_dropped"] == 2
    _teacher_notes_ok(notes)
    # Events of one step share one text (TensorBoard shows one per step): none is lost.
    assert any("**trackers_started**" in n and "**teacher_connected**" in n for n in notes)
    assert any('"gen": 1' in t for t in config["teacher"])


@needs("wandb")
def test_wandb_annotates_teacher_changes(teacher_run):
    last, config, notes = read.wandb(teacher_run)
    assert last["teacher/changes"] == 2 and last["eval/success"] == 0.75
    _teacher_notes_ok(notes)
    assert config["teacher_identity"]["gen"] == 1


@needs("mlflow")
def test_mlflow_annotates_teacher_changes(teacher_run):
    last, config, notes = read.mlflow(teacher_run.parent, teacher_run.name)
    assert last["teacher/changes"] == 2 and last["eval/success"] == 0.75
    _teacher_notes_ok(notes)
    assert json.loads(config["_tags"]["teacher"])["gen"] == 1


@needs("trackio")
def test_trackio_alerts_teacher_changes(teacher_run):
    last, _, notes = read.trackio(teacher_run.name)
    assert last["teacher/changes"] == 2 and last["eval/success"] == 0.75
    _teacher_notes_ok(notes)


# -- choosing loggers, missing extras, a tracker that breaks ------------------------------


def test_jsonl_is_always_on_and_logger_names_are_checked(tmp_path):
    recipe = make_recipe("sft", tmp_path, sections={"run": {"loggers": ["wandb", "wandb"]}})
    assert recipe.run.loggers == ["jsonl", "wandb"]
    more = with_loggers(recipe, ["tensorboard", "jsonl"])
    assert more.run.loggers == ["jsonl", "wandb", "tensorboard"]
    with pytest.raises(ConfigError, match=r"--logger 'tensorbord' is not a logger; use one of "
                                          r"jsonl, tensorboard"):
        with_loggers(recipe, ["tensorbord"])
    # Which trackers watch a run changes nothing it learns: resume and checkpoints agree.
    from miniverl.student.train.state import run_digest
    from miniverl.student.train.trainer import recipe_changes

    assert recipe_changes(recipe, more) == []
    assert run_digest(recipe) == run_digest(more)
    assert recipe_digest(recipe) != recipe_digest(more)  # the recipe itself records them
    # A checkpoint written before run.loggers existed recorded this digest: still matches.
    import hashlib

    from miniverl.common.recipe import HASHED_ONLY_WHEN_SET, recipe_dict

    before = recipe_dict(recipe)
    before["run"]["output_dir"] = "-"
    del before["run"]["loggers"]
    # Fields added later still, left out of digests while unset (recipe.HASHED_ONLY_WHEN_SET).
    for dotted in HASHED_ONLY_WHEN_SET:
        *parents, leaf = dotted.split(".")
        node = before
        for part in parents:
            node = (node or {}).get(part)
        if isinstance(node, dict) and node.get(leaf, 0) is None:
            del node[leaf]
    canonical = json.dumps(before, sort_keys=True, separators=(",", ":")).encode()
    assert run_digest(more) == "sha256:" + hashlib.sha256(canonical).hexdigest()


def test_missing_extra_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    # tensorboard is taken as installed, wandb as missing, whatever this machine has.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name == "wandb" else object() if name == "tensorboard" else real(name, *a)))
    with pytest.raises(MissingExtraError) as info:
        check_loggers(["jsonl", "tensorboard", "wandb"])
    assert str(info.value) == ('wandb is not installed; it comes with the \'wandb\' extra: '
                               'pip install -e ".[wandb]"')

    from miniverl.student.train.trainer import Trainer

    recipe = make_recipe("sft", tmp_path / "runs", sections={"run": {"loggers": ["wandb"]}})
    with pytest.raises(MissingExtraError, match=r"\.\[wandb\]"):
        Trainer(recipe, show_progress=False)
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_cli_missing_extra_and_bad_logger_exit_1_with_one_line(tmp_path, monkeypatch, capsys):
    from miniverl.cli.app import run
    from tests.toy_kit import recipe_dict, write_recipe

    path = write_recipe(tmp_path / "r.yaml", recipe_dict("sft", tmp_path / "runs"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    for args, needle in (
        (["train", str(path), "--logger", "mlflow"], 'pip install -e ".[mlflow]"'),
        (["up", str(path), "--logger", "mlflow"], 'pip install -e ".[mlflow]"'),
        (["train", str(path), "--logger", "neptune"], "--logger 'neptune' is not a logger"),
    ):
        code = run(args)
        err = capsys.readouterr().err.strip()
        assert code == 1 and len(err.splitlines()) == 1 and needle in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


class _Broken:
    name, where = "broken", "nowhere"

    def __init__(self):
        self.closed = None

    def log(self, scalars, step):
        raise OSError("disk on fire")

    def annotate(self, event, text, step):
        pass

    def set_teacher(self, identity, step):
        pass

    def close(self, status):
        self.closed = status


class _Good(_Broken):
    """A tracker that keeps what it receives: ``logged`` scalars, and in ``seen`` each
    annotation's ``(event, text)`` and each teacher identity (as ``("teacher", json)``)."""

    name = "good"

    def __init__(self):
        super().__init__()
        self.logged, self.seen = [], []

    def log(self, scalars, step):
        self.logged.append((step, scalars))

    def annotate(self, event, text, step):
        self.seen.append((event, text))

    def set_teacher(self, identity, step):
        self.seen.append(("teacher", json.dumps(identity)))


def test_a_failing_tracker_is_dropped_and_recorded_not_fatal(tmp_path):
    recipe = make_recipe("sft", tmp_path)
    run = RunDir.create(tmp_path, recipe, run_id="t-broken")
    broken, good = _Broken(), _Good()
    trackers = Trackers(run, [broken, good])
    run.observers.append(trackers.observe)
    run.metric({"step": 1, "loss": 1.0})
    run.metric({"step": 2, "loss": 0.5})  # nothing left to fail: no second event
    trackers.close("completed")
    failed = [e for e in run.events() if e["event"] == "tracker_failed"]
    assert len(failed) == 1 and failed[0]["logger"] == "broken"
    assert "disk on fire" in failed[0]["reason"] and broken.closed == "failed"
    assert [r["loss"] for r in run.metrics()] == [1.0, 0.5]
    assert good.logged == [(1, {"loss": 1.0}), (2, {"loss": 0.5})]  # the others go on
    assert good.closed == "completed"


def test_a_tracker_that_cannot_start_stops_the_run_in_one_line(tmp_path, monkeypatch):
    from miniverl.student import trackers

    class NotLoggedIn:
        def __init__(self, run, recipe, config):
            raise RuntimeError("api_key not configured (no-tty)\ncall wandb.login()")

    monkeypatch.setitem(trackers.BACKENDS, "wandb", NotLoggedIn)
    real = importlib.util.find_spec  # wandb taken as installed: it is its start that fails
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "wandb" else real(name, *a))
    recipe = make_recipe("sft", tmp_path, sections={"run": {"loggers": ["wandb"]}})
    run = RunDir.create(tmp_path, recipe, run_id="t-login")
    with pytest.raises(ConfigError) as info:
        open_trackers(run, recipe)
    assert str(info.value) == (
        "run.loggers: wandb could not start (RuntimeError: api_key not configured (no-tty)); "
        "fix its setup (docs/tracking.md) or remove wandb from run.loggers")
    assert run.observers == []


@needs("mlflow")
def test_mlflow_tracking_uri_file_store_and_a_resumed_run_continue_one_mlflow_run(
        tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    store = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in
    recipe = make_recipe("sft", tmp_path / "runs", sections={"run": {"loggers": ["mlflow"]}})
    run = RunDir.create(tmp_path / "runs", recipe, run_id="t-resume")
    client = MlflowClient(tracking_uri=store)
    for step in (1, 2):  # the second open is what a resumed run does
        trackers = open_trackers(run, recipe)
        run.metric({"step": step, "loss": 1.0 / step})
        trackers.close("interrupted" if step == 1 else "completed")
        if step == 1:
            (stopped,) = client.search_runs([client.get_experiment_by_name("miniverl")
                                             .experiment_id])
            assert stopped.info.status == "KILLED"  # an interrupted run is not "finished"
    experiment = client.get_experiment_by_name("miniverl")
    (found,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(found.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 0.5)]
    assert found.info.status == "FINISHED" and not (tmp_path / "runs" / "mlflow.db").exists()


@pytest.mark.integration
@needs("tensorboard")
def test_up_passes_logger_to_the_student_process(tmp_path):
    # `up --logger` reaches the student process, and the run records the choice.
    import subprocess

    import yaml

    from tests.toy_kit import MINIVERL, write_recipe

    path = write_recipe(tmp_path / "r.yaml", toy_sft_recipe(tmp_path / "runs"))
    proc = subprocess.run([*MINIVERL, "up", str(path), "--quiet", "--logger", "tensorboard"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text(encoding="utf-8"))
    assert resolved["run"]["loggers"] == ["jsonl", "tensorboard"]
    last, _, _ = read.tensorboard(run_dir)
    _same_numbers(last, run_dir, rel=1e-6)


def test_events_from_two_threads_all_reach_the_trackers(tmp_path):
    # The control socket's thread writes events (stop_requested, retarget_requested)
    # while the training thread writes metrics: none may be dropped.
    import threading

    recipe = make_recipe("sft", tmp_path)
    run = RunDir.create(tmp_path, recipe, run_id="t-threads")
    counting = _Good()
    trackers = Trackers(run, [counting])
    run.observers.append(trackers.observe)

    def write(name):
        for i in range(100):
            run.event(name, version=i)
            run.metric({"step": i, "loss": float(i)})

    threads = [threading.Thread(target=write, args=(f"e{k}",)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    trackers.close("completed")
    assert sorted(event for event, _ in counting.seen) == sorted(["e0"] * 100 + ["e1"] * 100)
    assert len(counting.logged) == 200


def test_config_annotations_and_teacher_identity_hold_no_secret_or_local_path(tmp_path):
    # Dashboards are shared: the run config, each event's text and the teacher identity
    # a tracker receives are redacted (docs/tracking.md, "What every tracker receives").
    from miniverl.student.trackers import run_config

    recipe = make_recipe("opd", tmp_path)
    run = RunDir.create(tmp_path, recipe, run_id="t-redact")
    config = json.dumps(run_config(run, recipe))
    assert str(tmp_path) not in config and "t-redact" in config
    recording = _Good()
    trackers = Trackers(run, [recording])
    run.observers.append(trackers.observe)
    teacher = {"name": "t", "model": "/home/someone/models/teacher", "gen": 1}
    run.event("teacher_changed", how="reload", old=teacher, new=teacher, version=1)
    run.event("teacher_connected", teacher=teacher, version=0,
              endpoint=f"ipc://{tmp_path}/teacher.sock", admin_token="f" * 64)
    trackers.close("completed")
    seen = "\n".join(text for _, text in recording.seen)
    assert len(recording.seen) == 4 and "teacher.sock" in seen
    for leak in ("/home/someone", str(tmp_path), "f" * 64):
        assert leak not in seen, leak
