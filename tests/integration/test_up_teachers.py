"""``miniverl up`` with several teachers (docs/several-teachers.md): real processes.

A two-domain strict-OPD run (calculator and jsonnav) under ``up`` with two teachers,
one process each: each domain's episodes are scored by its own teacher, each teacher
keeps its own counters; ``kill -9`` of one teacher mid-run restarts that teacher only
(the other keeps its process and its connection, and its domain keeps training while
the killed one's episodes are held back), and ``teacher use --route`` moves the
other route to a third teacher; the run completes with no stale reply trained on, every
update trained once, and each domain's success before and after in the eval events.
One teacher process serving two adapters runs under ``up`` the same way, and so does a
teacher with another tokenizer beside one with the student's.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from tests.integration.test_up import WAIT_S, Up, read_jsonl
from tests.toy_kit import (
    ONE_TURN,
    TWO_LAYER,
    recipe_dict,
    seeded,
    started_teacher,
    toy_dir,
    write_recipe,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STUDENT = seeded(TWO_LAYER, 0)
CALC = seeded(TWO_LAYER, 1)
NAV = seeded(TWO_LAYER, 2)


@pytest.fixture(scope="module")
def work():
    path = Path(tempfile.mkdtemp(prefix="mvt", dir="/tmp"))  # ipc paths fit 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def two_teacher_recipe(work: Path, cycles: int, rollouts: int = 2) -> Path:
    for spec in (STUDENT, CALC, NAV):
        toy_dir(spec)  # built once here, not raced by three processes
    data = recipe_dict("opd", work / "runs", student=STUDENT, teacher=CALC, cycles=cycles,
                       rollouts_per_cycle=rollouts, sections={
                           "run": {"name": "two"},
                           "rollout": {**ONE_TURN, "batch_size": min(rollouts, 4)},
                           "loss": {"divergence": "forward_kl", "top_k": 4},
                           "eval": {"before": True},
                           "runtime": {"cpu_threads": 1, "heartbeat_ms": 200,
                                       "request_timeout_s": 60, "unavailable_timeout_s": 180,
                                       "teacher_startup_timeout_s": 180}})
    teacher = data.pop("teacher")
    teacher["memory"] = "resident"
    del data["environment"]
    data["teachers"] = {"calc": teacher, "nav": {**teacher, "model": {"toy": NAV}}}
    data["environments"] = [
        {"name": "calculator", "train_tasks": 16, "eval_tasks": 2, "test_tasks": 2,
         "teacher": "calc"},
        {"name": "jsonnav", "train_tasks": 16, "eval_tasks": 2, "test_tasks": 2,
         "teacher": "nav"}]
    return write_recipe(work / "two.yaml", data)


def test_two_teachers_under_up_one_killed_and_one_swapped_mid_run(work):
    from tests.integration.test_up import cli

    # An upper bound: the run is stopped once it has shown everything checked here (a
    # run of fixed length could end while the killed teacher restarts, since the other
    # domain no longer waits for it).
    cycles = 2000
    # 8 episodes an update: with run.seed 0 every update before cycle 192 draws both
    # domains (mixture.draw is seeded), so the update nav's kill lands in has calc
    # episodes to train on, and nav's are held back rather than waited for.
    path = two_teacher_recipe(work, cycles=cycles, rollouts=8)
    with started_teacher(toy_dir(seeded(TWO_LAYER, 3)), work, "calc2",
                         timeout_s=WAIT_S) as other:
        run = Up(work, path, "two")
        sockets = run.wait_for("both teachers' sockets", lambda: all(
            (run.run_dir / f"teacher-{n}.sock").exists() for n in ("calc", "nav")))
        assert sockets
        run.wait_for("two updates", lambda: run.steps() >= 2)
        calc_pid = _teacher_pid(run.run_dir, "calc")
        os.kill(_teacher_pid(run.run_dir, "nav"), signal.SIGKILL)
        # calc's domain trains on while nav's episodes are held back ...
        run.wait_for("nav's episodes held back", lambda: run.events("route_held_back"))
        run.wait_for("nav's restart", lambda: run.events("teacher_restarted"))
        # ... until nav's route binds its restarted teacher.
        run.wait_for("nav's route rebound", lambda: [
            e for e in run.events("teacher_changed") if e.get("route") == "nav"])
        assert _teacher_pid(run.run_dir, "calc") == calc_pid  # calc kept its process
        # `teacher use --route calc`: calc's route moves to another teacher; nav's stays.
        said = cli("teacher", "use", str(run.run_dir), other.endpoint, "--route", "calc")
        assert "retarget of calc to" in said
        run.wait_for("the swap", lambda: [e for e in run.events("teacher_changed")
                                          if e.get("how") == "retarget"])
        swapped_at = run.steps()
        run.wait_for("two updates after the swap", lambda: run.steps() >= swapped_at + 2)
        assert "stop requested" in cli("stop", str(run.run_dir))
        assert run.finish() == 130, run.output()
    assert run.status() == "interrupted"
    # Only nav was restarted; calc kept its process throughout.
    restarted = run.events("teacher_restarted")
    assert [e["teacher"] for e in restarted] == ["nav"], restarted
    changed = [(e["route"], e["how"]) for e in run.events("teacher_changed")]
    assert changed == [("nav", "restart"), ("calc", "retarget")], changed
    assert [e["route"] for e in run.events("retarget_requested")] == ["calc"]
    rows = [r for r in read_jsonl(run.run_dir / "metrics.jsonl") if r.get("phase") == "train"]
    steps = rows[-1]["step"]
    assert steps < cycles and [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(r["stale_dropped"] == 0 for r in rows)  # a killed teacher sends nothing late
    last = rows[-1]["by_teacher"]
    trajs = read_jsonl(run.run_dir / "trajectories.jsonl")
    per_env = {env: sum(t["environment"] == env for t in trajs) for env in ("calculator",
                                                                          "jsonnav")}
    assert last["calc"]["episodes"] == per_env["calculator"] > 0
    # While nav's teacher was down its episodes were held back and calc's trained on:
    # every jsonnav episode was either trained on once or held back, none both.
    held = run.events("route_held_back")
    assert {e["route"] for e in held} == {"nav"}, held
    assert last["nav"]["held_back"] == sum(e["episodes"] for e in held) == rows[-1]["held_back"]
    assert last["nav"]["episodes"] + last["nav"]["held_back"] == per_env["jsonnav"]
    assert last["nav"]["episodes"] > 0 and last["calc"]["held_back"] == 0
    calc = {r["version"] - 1: r["by_teacher"]["calc"]["episodes"] for r in rows}
    for event in held:  # each update that held nav's episodes back trained on calc's
        v = event["version"]
        assert calc[v] > calc.get(v - 1, 0), (event, calc)
    evals = run.events("eval")
    assert evals[0]["version"] == 0
    assert set(evals[0]["by_environment"]) == {"calculator", "jsonnav"}


def _teacher_pid(run_dir: Path, name: str) -> int:
    """The pid of the teacher process ``up`` runs for ``name``."""
    import psutil

    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "--recipe-teacher" in cmd and cmd[cmd.index("--recipe-teacher") + 1] == name \
                and str(run_dir) in " ".join(cmd):
            return proc.info["pid"]
    pytest.fail(f"no teacher process for {name}")


def test_one_teacher_process_serving_two_adapters_under_up(work):
    pytest.importorskip("peft")
    from tests.teacher_server.test_adapters import make_lora

    path = two_teacher_recipe(work, cycles=4)
    import yaml

    data = yaml.safe_load(path.read_text())
    base = toy_dir(CALC)
    teacher = data.pop("teachers")["calc"]
    teacher["adapters"] = {
        "calc": make_lora(base, work / "adapters" / "calc", seed=1, targets=["q_proj"]),
        "nav": make_lora(base, work / "adapters" / "nav", seed=2, targets=["v_proj"])}
    data["teacher"] = teacher
    for member in data["environments"]:
        member["adapter"] = member.pop("teacher")
    path = write_recipe(work / "adapters.yaml", data)
    run = Up(work, path, "adapters")
    assert run.finish() == 0, run.output()
    assert run.status() == "completed"
    connected = run.events("teacher_connected")
    assert [e["route"] for e in connected] == ["teacher/calc", "teacher/nav"]
    # One process: one instance behind both routes, each route its own adapter's identity.
    assert len({e["teacher"]["instance"] for e in connected}) == 1
    digests = {e["route"]: e["teacher"]["adapter_sha256"] for e in connected}
    assert len(set(digests.values())) == 2 and None not in digests.values()
    rows = [r for r in read_jsonl(run.run_dir / "metrics.jsonl") if r.get("phase") == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["stale_dropped"] == 0 for r in rows)
    by_teacher = rows[-1]["by_teacher"]
    assert set(by_teacher) == {"teacher/calc", "teacher/nav"}
    assert sum(c["episodes"] for c in by_teacher.values()) == 8


def test_a_teacher_with_another_tokenizer_beside_one_with_the_students_under_up(work):
    # teachers.nav.tokenizer: other under `up`: nav's own process serves xvocab (its
    # model directory has a chat template), calc's scores token ids; each route's
    # counters say how its episodes went (docs/several-teachers.md).
    import yaml

    path = two_teacher_recipe(work, cycles=2, rollouts=8)
    data = yaml.safe_load(path.read_text())
    data["teachers"]["nav"]["tokenizer"] = "other"
    data["loss"] = {"estimator": "sampled_token", "divergence": "reverse_kl", "top_k": 4}
    # A few SFT steps first: a random byte-level student writes bytes that are not
    # UTF-8, which no rendering holds (such an episode is sent nothing).
    data["train"].update(sft_warmup_steps=60, sft_warmup_lr=1e-2)
    path = write_recipe(work / "xroute.yaml", data)
    run = Up(work, path, "xroute")
    assert run.finish() == 0, run.output()
    assert run.status() == "completed"
    rows = [r for r in read_jsonl(run.run_dir / "metrics.jsonl") if r.get("phase") == "train"]
    assert len(rows) == 2 and all(r["stale_dropped"] == 0 for r in rows)
    nav, calc = rows[-1]["by_teacher"]["nav"], rows[-1]["by_teacher"]["calc"]
    assert nav["episodes"] > 0 and calc["episodes"] > 0
    assert nav["xvocab_sent"] + nav["xvocab_unaligned"] == nav["episodes"]
    assert nav["xvocab_sent"] > 0 and "xvocab_sent" not in calc
