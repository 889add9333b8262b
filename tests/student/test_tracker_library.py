"""Why the trackers call each library's own API, not accelerate's tracker API
(docs/tracking.md, "Why not accelerate's trackers").

Each test measures one thing the run's trackers need and accelerate's tracker classes
(``accelerate.tracking``) do not give; if a release of accelerate gives it, its test fails
and the choice is worth making again.
"""

from __future__ import annotations

import inspect
import threading

import pytest
from packaging.version import Version

from tests.extras import needs

accelerate = pytest.importorskip("accelerate")


@needs("mlflow")
def test_accelerates_mlflow_tracker_loses_what_another_thread_logs(tmp_path):
    # The run's events are written from the control socket's thread too; accelerate's
    # MLflowTracker logs through mlflow's per-thread active run, so a second thread's
    # metric does not reach the tracker's run.
    import mlflow
    from accelerate.tracking import MLflowTracker

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        tracker = MLflowTracker(experiment_name="probe", logging_dir=str(tmp_path / "art"),
                                run_name="probe")
        if getattr(tracker, "active_run", None) is None:  # releases that start lazily
            tracker.start()
        tracker.log({"main_thread": 1.0}, step=0)
        other = threading.Thread(target=tracker.log, args=({"other_thread": 2.0},),
                                 kwargs={"step": 1})
        other.start()
        other.join()
        run_id = tracker.active_run.info.run_id
        tracker.finish()
        logged = mlflow.tracking.MlflowClient().get_run(run_id).data.metrics
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(previous)
    assert "main_thread" in logged and "other_thread" not in logged


def test_accelerates_trackers_cannot_end_a_run_as_failed():
    # A failed or interrupted miniverl run ends its tracker run as failed/killed (W&B's
    # exit code, MLflow's run status); accelerate's finish() takes no status.
    from accelerate.tracking import MLflowTracker, WandBTracker

    for tracker in (MLflowTracker, WandBTracker):
        assert list(inspect.signature(tracker.finish).parameters) == ["self"], tracker


def test_the_lowest_supported_accelerate_has_no_trackio_tracker():
    # Runs in the lowest-versions venv (tests/compat), where accelerate is 1.0.0.
    if Version(accelerate.__version__) != Version("1.0.0"):
        pytest.skip("accelerate 1.0.0 (tests/compat/lowest.txt) is checked in the "
                    "lowest-versions venv: bash tests/compat/setup_lowest_venv.sh")
    from accelerate import tracking

    assert not hasattr(tracking, "TrackioTracker")
