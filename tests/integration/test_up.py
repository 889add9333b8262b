"""``miniverl up`` end to end: real supervisor, student and teacher processes over ipc.

What a user relies on, one test each: a run completes with every artifact; a teacher
killed with SIGKILL is restarted and the run completes; ``teacher reload``, a retarget
(``miniverl teacher use``) and a refused retarget (another tokenizer) happen while
training continues; ``miniverl stop`` then ``up --resume`` gives bit-identical final
weights to an uninterrupted run; two students share one ``miniverl teacher serve``;
Ctrl-C exits 130, leaves a checkpoint and no process behind.

Models are 32 wide and 2 layers; a cycle is one rollout of at most 8 new tokens, so
process start-up dominates. Sockets live under a short ``/tmp/mvl*`` folder because
ipc paths are limited to 107 bytes. Every ``up`` runs as a subprocess; the control
commands (``stop``, ``status``, ``teacher use``, ``teacher reload``) run in this
process through typer's runner, which spares an interpreter start per command.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.toy_kit import (
    MINIVERL,
    ONE_TURN,
    TWO_LAYER,
    alien_tokenizer_copy,
    recipe_dict,
    seeded,
    spawn_teacher,
    started_teacher,
    toy_dir,
    write_recipe,
)

pytestmark = pytest.mark.integration

STUDENT = seeded(TWO_LAYER, 0)
TEACHER = seeded(TWO_LAYER, 1)
OTHER = seeded(TWO_LAYER, 2)  # same tokenizer, other weights: the in-place reload target
WAIT_S = 240.0  # generous: the CI machine is small and often shared


def recipe(name: str, *, cycles: int, output_dir: Path) -> dict[str, Any]:
    """A tiny strict-OPD recipe; one rollout per cycle keeps teacher scoring unbatched,
    so two runs of it are bit-identical."""
    sections = {
        "run": {"name": name},
        "teacher": {"memory": "resident"},
        "environment": {"train_tasks": 16, "split_seed": 0},
        "rollout": {**ONE_TURN, "temperature": 1.0, "top_p": 1.0, "batch_size": 1},
        "loss": {"divergence": "forward_kl", "top_k": 4},
        "runtime": {"cpu_threads": 1, "heartbeat_ms": 200, "request_timeout_s": 60,
                    "unavailable_timeout_s": 180, "teacher_startup_timeout_s": 180},
    }
    return recipe_dict("opd", output_dir, student=STUDENT, teacher=TEACHER, cycles=cycles,
                       rollouts_per_cycle=1, sections=sections)


# -- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def work():
    """A short folder for runs, recipes and sockets (ipc paths must fit 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="mvl", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def models(work):
    """Build the toy models once, before any process races to build them."""
    dirs = {name: toy_dir(spec)
            for name, spec in (("student", STUDENT), ("teacher", TEACHER), ("other", OTHER))}
    dirs["alien"] = alien_tokenizer_copy(dirs["teacher"], work / "alien")
    return dirs


def recipe_file(work: Path, name: str, cycles: int) -> Path:
    return write_recipe(work / f"{name}.yaml", recipe(name, cycles=cycles, output_dir=work / "runs"))


@pytest.fixture(scope="module")
def teacher_b(work, models):
    """A shared ``miniverl teacher serve`` of the recipe's own teacher weights."""
    with started_teacher(models["teacher"], work, "b", cli=True, timeout_s=WAIT_S) as served:
        yield served.endpoint, served.proc


# -- helpers ---------------------------------------------------------------------------


class Up:
    """One ``miniverl up`` subprocess and its run directory."""

    def __init__(self, work: Path, recipe_path: Path, run_id: str, *extra: str):
        self.run_dir = work / "runs" / run_id
        self.out = work / f"{run_id}.{len(list(work.glob(run_id + '.*')))}.out"
        cmd = [*MINIVERL, "up", str(recipe_path), "--run-id", run_id, "--quiet", *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.out.open("wb"), stderr=subprocess.STDOUT)

    def output(self) -> str:
        text = self.out.read_text(errors="replace")[-3000:]
        for log in ("student.log", "teacher.stderr.log"):
            path = self.run_dir / "logs" / log
            if path.is_file():
                text += f"\n--- {log}\n" + path.read_text(errors="replace")[-3000:]
        return text

    def wait_for(self, what: str, check: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
        """Poll ``check`` until it returns something truthy; fail if ``up`` exits first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            if self.proc.poll() is not None:
                found = check()
                if found:
                    return found
                pytest.fail(f"`up` exited {self.proc.returncode} before {what}:\n{self.output()}")
            time.sleep(0.05)
        pytest.fail(f"no {what} within {timeout_s:g} s:\n{self.output()}")

    def finish(self, timeout_s: float = WAIT_S) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"`up` did not exit within {timeout_s:g} s:\n{self.output()}")

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_jsonl(self.run_dir / "events.jsonl")
                if name is None or e["event"] == name]

    def steps(self) -> int:
        rows = read_jsonl(self.run_dir / "metrics.jsonl")
        return max((r.get("step", 0) for r in rows), default=0)

    def status(self) -> str:
        return json.loads((self.run_dir / "status.json").read_text())["status"]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().split("\n"):  # not splitlines(): U+2028 is not a row end
        with contextlib.suppress(ValueError):  # a line still being written
            rows.append(json.loads(line))
    return rows


def cli(*args: str, code: int = 0) -> str:
    """Run one ``miniverl`` command in this process; returns its output (and error)."""
    from typer.testing import CliRunner

    from miniverl.cli.app import app

    result = CliRunner().invoke(app, list(args))
    error = "" if result.exception is None else str(result.exception)
    assert result.exit_code == code, f"miniverl {' '.join(args)}: {result.output}{error}"
    return result.output + error


def final_weights(run_dir: Path) -> dict[str, Any]:
    from safetensors.numpy import load_file

    ckpt = max((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    return load_file(str(ckpt / "model.safetensors"))


def descendants(pid: int) -> list[Any]:
    import psutil

    return psutil.Process(pid).children(recursive=True)


# -- tests -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_run(work, models):
    """An uninterrupted ``up`` with a teacher it starts itself (also the resume reference)."""
    path = recipe_file(work, "ref", cycles=8)
    run = Up(work, path, "ref")
    code = run.finish()
    return run, code, path


def test_up_end_to_end(reference_run):
    # A user runs one command and gets a complete run directory, exit code 0.
    run, code, _ = reference_run
    assert code == 0, run.output()
    assert run.status() == "completed"
    names = [e["event"] for e in run.events()]
    for name in ("run_started", "teacher_connected", "eval", "checkpoint", "run_completed"):
        assert name in names, names
    assert names.count("eval") == 2  # before and after
    assert [r["step"] for r in read_jsonl(run.run_dir / "metrics.jsonl")] == list(range(1, 9))
    from miniverl.common.trajectory import read_trajectories

    trajs = read_trajectories(run.run_dir / "trajectories.jsonl")
    assert [t.policy_version for t in trajs] == list(range(8))
    assert (run.run_dir / "report.html").stat().st_size > 0
    assert (run.run_dir / "checkpoints" / "step_8" / "model.safetensors").is_file()
    assert (run.run_dir / "logs" / "teacher.log").stat().st_size > 0
    manifest = json.loads((run.run_dir / "manifest.json").read_text())
    assert [t["how"] for t in manifest["teachers"]] == ["connect"]
    assert "completed" in cli("status", str(run.run_dir))


def test_stop_then_resume_matches_uninterrupted(work, reference_run, teacher_b):
    # `miniverl stop` checkpoints; `up --resume` continues to the very same weights.
    _, code, path = reference_run
    assert code == 0
    endpoint, _ = teacher_b
    first = Up(work, path, "resumed", "--teacher", endpoint)
    first.wait_for("a first update", lambda: first.steps() >= 1)
    assert "stop requested" in cli("stop", str(first.run_dir))
    assert first.finish() == 130, first.output()
    assert first.status() == "interrupted"
    stopped_at = first.events("checkpoint")[-1]["step"]
    assert 1 <= stopped_at < 8, "the stop must land mid-run for this test to mean anything"

    second = Up(work, path, "resumed", "--teacher", endpoint, "--resume")
    assert second.finish() == 0, second.output()
    assert second.status() == "completed"
    assert second.events("resumed")[0]["step"] == stopped_at
    resumed, reference = final_weights(second.run_dir), final_weights(work / "runs" / "ref")
    assert resumed.keys() == reference.keys()
    for name, tensor in reference.items():
        assert resumed[name].tobytes() == tensor.tobytes(), name


def test_two_students_share_one_teacher(work, models, teacher_b):
    # The teacher's memory is paid once: two `up --teacher E` runs complete on it.
    endpoint, proc = teacher_b
    path = recipe_file(work, "pair", cycles=3)
    runs = [Up(work, path, f"pair{i}", "--teacher", endpoint) for i in range(2)]
    for run in runs:
        assert run.finish() == 0, run.output()
        assert run.status() == "completed"
    instances = {r.events("teacher_connected")[0]["teacher"]["instance"] for r in runs}
    assert len(instances) == 1
    assert proc.poll() is None  # attaching never stops a teacher the run did not start


def test_live_teacher_operations(work, models, teacher_b):
    # While one run trains: reload in place, SIGKILL (restart), a refused retarget to
    # another tokenizer and an accepted retarget; each is an event and the run completes.
    b_endpoint, _ = teacher_b
    alien = spawn_teacher(models["alien"], work, "c", cli=True)  # starts while `up` does
    c_endpoint = alien.endpoint
    path = recipe_file(work, "live", cycles=60)
    run = Up(work, path, "live")
    try:
        alien.wait_ready(WAIT_S)
        run.wait_for("a first update", lambda: run.steps() >= 1)
        own = json.loads((run.run_dir / "sockets.json").read_text())["teacher"]

        cli("teacher", "reload", own, "--model", str(models["other"]))
        reload = run.wait_for("teacher_changed(reload)", lambda: [
            e for e in run.events("teacher_changed") if e["how"] == "reload"])[0]
        assert reload["new"]["gen"] == reload["old"]["gen"] + 1

        teacher = [p for p in descendants(run.proc.pid)
                   if "miniverl.teacher_server" in " ".join(p.cmdline())]
        assert len(teacher) == 1
        teacher[0].kill()
        # A mistyped endpoint is refused at once (probed while the student waits for the
        # restarted teacher, so the probe costs no training cycles).
        nowhere = f"ipc://{work}/nowhere.sock"
        assert "no teacher answers" in cli("teacher", "use", str(run.run_dir), nowhere, code=1)
        run.wait_for("teacher_restarted", lambda: run.events("teacher_restarted"))
        restart = run.wait_for("teacher_changed(restart)", lambda: [
            e for e in run.events("teacher_changed") if e["how"] == "restart"])[0]
        assert restart["new"]["instance"] != restart["old"]["instance"]

        # Refused at once, the reason printed, exit 1; the run goes on with its teacher.
        assert "tokenizer" in cli("teacher", "use", str(run.run_dir), c_endpoint,
                                  code=1).lower()
        refused = run.wait_for("teacher_swap_refused", lambda: [
            e for e in run.events("teacher_swap_refused") if e["endpoint"] == c_endpoint])
        assert "tokenizer" in refused[0]["reason"].lower(), refused
        cli("teacher", "use", str(run.run_dir), b_endpoint)
        retarget = run.wait_for("teacher_changed(retarget)", lambda: [
            e for e in run.events("teacher_changed") if e["how"] == "retarget"])[0]
        assert retarget["endpoint"] == b_endpoint
        swapped_at = retarget["version"]

        assert run.finish() == 0, run.output()
    finally:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGINT)
            run.finish()
        alien.stop()
    assert run.status() == "completed"
    rows = read_jsonl(run.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 61))
    # Training went on after the swap, on teacher B (the refused one never scored).
    b_instance = retarget["new"]["instance"]
    assert any(r["teacher"]["instance"] == b_instance for r in rows if r["version"] > swapped_at)
    manifest = json.loads((run.run_dir / "manifest.json").read_text())
    hows = [t["how"] for t in manifest["teachers"]]
    assert hows == ["connect", "reload", "restart", "retarget"], manifest["teachers"]
    ranges = [(t["from_version"], t["to_version"]) for t in manifest["teachers"]]
    assert ranges[-1] == (swapped_at, 59)  # closed at the end: the last version it scored
    for (lo, hi), (nxt, _) in zip(ranges, ranges[1:], strict=False):
        assert lo <= hi and hi in (nxt - 1, nxt), ranges


def test_ctrl_c_leaves_nothing_behind(work, models):
    # Ctrl-C: exit 130, the run is `interrupted` with a checkpoint, no child survives.
    import psutil

    path = recipe_file(work, "sigint", cycles=200)
    run = Up(work, path, "sigint")
    run.wait_for("a first update", lambda: run.steps() >= 1)
    children = descendants(run.proc.pid)
    assert len(children) >= 2, children  # the student and the teacher
    live = json.loads(cli("status", str(run.run_dir), "--json"))
    assert live["live"] and live["status"] == "running" and live["step"] >= 1, live
    assert live["teacher"]["instance"] == run.events("teacher_connected")[0]["teacher"]["instance"]
    run.proc.send_signal(signal.SIGINT)
    assert run.finish(120) == 130, run.output()
    assert run.status() == "interrupted"
    # The stop lands on an update boundary: the checkpoint holds the last logged step.
    assert run.events("checkpoint")[-1]["step"] == run.steps(), run.output()
    assert (run.run_dir / "checkpoints" / f"step_{run.steps()}" / "model.safetensors").is_file()
    time.sleep(0.2)
    alive = [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.cmdline()) for p in alive]


def test_a_second_ctrl_c_stops_at_once(work, models):
    # A student that cannot reach its checkpoint (stopped here with SIGSTOP) would keep
    # `up` waiting for STOP_GRACE_S (120 s) after one Ctrl-C; a second one kills both
    # children now: exit 130, the run `interrupted`, nothing left behind.
    import psutil

    path = recipe_file(work, "sigint2", cycles=200)
    run = Up(work, path, "sigint2")
    run.wait_for("a first update", lambda: run.steps() >= 1)
    children = descendants(run.proc.pid)
    student = [p for p in children if "miniverl.student" in " ".join(p.cmdline())]
    assert len(student) == 1, [p.cmdline() for p in children]
    student[0].suspend()
    run.proc.send_signal(signal.SIGINT)
    time.sleep(1.0)  # two signals sent back to back may arrive as one
    assert run.proc.poll() is None
    t0 = time.monotonic()
    run.proc.send_signal(signal.SIGINT)
    assert run.finish(30) == 130, run.output()
    assert time.monotonic() - t0 < 20
    assert run.status() == "interrupted"
    assert "second Ctrl-C" in run.events("run_interrupted")[-1]["reason"]
    time.sleep(0.2)
    alive = [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
