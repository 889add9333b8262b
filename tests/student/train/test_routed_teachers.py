"""Several teachers for one student (docs/several-teachers.md): a recipe routes each
environment of a mixture to its own teacher (``teachers:``) or adapter
(``teacher.adapters``); ``miniverl validate`` refuses a bad route in one line before any
process starts; a routed OPD run sends each episode to its own environment's teacher
only, keeps per-teacher counters in every metrics row and per-route teacher ranges in
the manifest, and a reload of one teacher re-sends only that teacher's episodes."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from miniverl.cli.app import app
from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe
from miniverl.common.teacher_routes import route_of_environment, routes
from miniverl.common.trajectory import read_trajectories
from miniverl.testing.fake_teacher import FakeTeacherClient
from tests.toy_kit import events, recipe_dict

ENVS = [{"name": "calculator", "train_tasks": 8, "eval_tasks": 2, "test_tasks": 2},
        {"name": "jsonnav", "train_tasks": 8, "eval_tasks": 2, "test_tasks": 2}]


def _data(tmp_path, *, adapters: bool = False, **train):
    data = recipe_dict("opd", tmp_path, **train)
    teacher = data.pop("teacher")
    del data["environment"]
    if adapters:
        data["teacher"] = {**teacher, "adapters": {"calc": "adapters/calc", "nav": "adapters/nav"}}
        data["environments"] = [{**ENVS[0], "adapter": "calc"}, {**ENVS[1], "adapter": "nav"}]
    else:
        data["teachers"] = {"calc": copy.deepcopy(teacher), "nav": copy.deepcopy(teacher)}
        data["environments"] = [{**ENVS[0], "teacher": "calc"}, {**ENVS[1], "teacher": "nav"}]
    return data


def _problems(data) -> str:
    try:
        Recipe.model_validate(data)
    except (ConfigError, ValidationError) as exc:
        return str(exc)
    raise AssertionError("the recipe was accepted")


def test_routes_name_each_teacher_and_adapter(tmp_path):
    recipe = Recipe.model_validate(_data(tmp_path))
    assert route_of_environment(recipe) == {"calculator": "calc", "jsonnav": "nav"}
    recipe = Recipe.model_validate(_data(tmp_path, adapters=True))
    assert {n: (r.teacher, r.adapter) for n, r in routes(recipe).items()} == {
        "teacher/calc": ("teacher", "calc"), "teacher/nav": ("teacher", "nav")}
    # A single teacher without adapters routes nothing: the plain path.
    plain = recipe_dict("opd", tmp_path)
    assert routes(Recipe.model_validate(plain)) == {}


@pytest.mark.parametrize("change, says", [
    (lambda d: d["environments"][1].pop("teacher"),
     "'jsonnav' is routed to no teacher; set environments[1].teacher to one of calc, nav"),
    (lambda d: d["environments"][1].update(teacher="sql"),
     "'jsonnav' is routed to teacher 'sql', not one of teachers:"),
    (lambda d: d["environments"][1].update(teacher="calc"),
     "teachers.nav scores no environment; route one to it"),
    (lambda d: d["environments"][0].update(adapter="calc"),
     "'calculator' names adapter 'calc', but teacher 'calc' serves no adapters"),
    (lambda d: d.update(teacher=d["teachers"]["calc"]),
     "teacher and teachers both name the run's teachers"),
    (lambda d: d["teachers"]["nav"].update(memory="swap"),
     "teachers.nav.memory 'swap'"),
    (lambda d: d["run"].update(mode="replay"), "mode 'replay' is not routed"),
    (lambda d: d["teachers"]["nav"]["model"]["toy"].update(max_positions=64),
     "max_total_tokens 640 exceeds teachers.nav.model.toy.max_positions 64; lower it"),
    (lambda d: (d.update(environment=d.pop("environments")[0] | {"teacher": None}),
                d["environment"].pop("teacher")),
     "teachers: routes each environment of a mixture to its own teacher, and this recipe "
     "has one environment"),
])
def test_a_bad_route_is_one_line_naming_the_field_and_the_fix(tmp_path, change, says):
    data = _data(tmp_path)
    change(data)
    assert says in _problems(data)


@pytest.mark.parametrize("change, says", [
    (lambda d: d["environments"][1].update(adapter="sql"),
     "'jsonnav' names adapter 'sql', which teacher 'teacher' does not serve; set "
     "environments[1].adapter to one of calc, nav"),
    (lambda d: d["environments"][1].pop("adapter"), "'jsonnav' names no adapter"),
    (lambda d: d["environments"][1].update(teacher="teacher"),
     "'jsonnav' names teacher 'teacher', but the recipe has one teacher: section"),
    (lambda d: d["teacher"]["adapters"].update({"bad name": "x"}),
     "adapter name 'bad name' must be 1-64 letters"),
    (lambda d: d["teacher"].update(adapter="adapters/one"),
     "adapters (one process serving several) cannot go with adapter 'adapters/one'"),
    (lambda d: d["teacher"].update(min_success=0.5),
     "teacher.min_success 0.5 would gate each adapter of that process"),
])
def test_a_bad_adapter_route_is_one_line(tmp_path, change, says):
    data = _data(tmp_path, adapters=True)
    change(data)
    assert says in _problems(data)


SAMPLED = {"estimator": "sampled_token", "divergence": "reverse_kl"}


@pytest.mark.parametrize("change, says", [
    (lambda d: d["teachers"]["nav"].update(tokenizer="other"),
     "teachers.nav.tokenizer: other trains with the group sampled-token estimator"),
    (lambda d: (d["teachers"]["nav"].update(tokenizer="other"), d["loss"].update(SAMPLED),
                d["run"].update(mode="sft"), d["train"].update(fixed_set="teacher")),
     "teachers.nav.tokenizer: other trains by on-policy distillation"),
    (lambda d: (d["teachers"]["nav"].update(tokenizer="other"), d["loss"].update(SAMPLED),
                d["teachers"]["nav"].update(mode="privileged_context")),
     "tokenizer: other cannot go with mode: privileged_context"),
    (lambda d: d["loss"].update(cross_vocab="uld"),
     "loss.cross_vocab: uld is the target of a teacher with another tokenizer"),
])
def test_a_route_with_another_tokenizer_keeps_the_rules_of_one(tmp_path, change, says):
    data = _data(tmp_path)
    change(data)
    assert says in _problems(data)


def test_each_route_keeps_its_own_tokenizer_rule(tmp_path):
    # One route with another tokenizer beside one with the student's, and each of a
    # teacher's adapters with another tokenizer (the same base serves them).
    data = _data(tmp_path)
    data["teachers"]["nav"]["tokenizer"] = "other"
    data["loss"].update(SAMPLED)
    recipe = Recipe.model_validate(data)
    assert [(r.name, r.config.tokenizer) for r in routes(recipe).values()] == [
        ("calc", None), ("nav", "other")]
    import yaml

    path = tmp_path / "routed.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any("teacher      nav: " in line and "another tokenizer" in line for line in lines)
    assert not any("teacher      calc: " in line and "another" in line for line in lines)
    assert any(line.strip().startswith("across       sampled_token over byte groups")
               for line in lines)
    data = _data(tmp_path, adapters=True)
    data["teacher"]["tokenizer"] = "other"
    data["loss"].update(cross_vocab="uld")
    assert Recipe.model_validate(data).teacher.tokenizer == "other"


@pytest.mark.slow  # starts a trainer
def test_a_route_with_another_tokenizer_refuses_a_teacher_without_xvocab(tmp_path, toy):
    # nav's teacher has the student's tokenizer but no xvocab kind: its route is refused
    # at connect, before any rollout, as a single teacher with another tokenizer is.
    from miniverl.common.errors import TokenizerMismatch
    from miniverl.student.train.trainer import Trainer

    data = _data(tmp_path, cycles=1)
    data["teachers"]["nav"]["tokenizer"] = "other"
    data["loss"].update(SAMPLED)
    trainer = Trainer(Recipe.model_validate(data), route_clients=_clients(toy),
                      show_progress=False, write_report=False, checkpoints=False)
    with trainer, pytest.raises(TokenizerMismatch, match="teacher 'nav-teacher' does not serve"):
        trainer.train()
    assert trainer.state.cycle == 0 and trainer.version == 0


def test_weights_that_sum_to_zero_are_refused_with_routes(tmp_path):
    data = _data(tmp_path)
    for member in data["environments"]:
        member["weight"] = 0
    assert "the weights sum to 0" in _problems(data)


def test_validate_refuses_a_bad_route_before_any_process_starts(tmp_path):
    import yaml

    data = _data(tmp_path)
    data["environments"][1]["teacher"] = "sql"
    path = tmp_path / "routed.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    assert "environments[1].teacher: 'jsonnav' is routed to teacher 'sql'" in lines[0]
    assert "Traceback" not in result.output
    data["environments"][1]["teacher"] = "nav"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "teacher      calc: " in result.output
    assert "(easy, weight 1, teacher nav)" in result.output


def test_the_trainer_refuses_a_teacher_it_cannot_reach(tmp_path):
    from miniverl.student.train.trainer import Trainer

    recipe = Recipe.model_validate(_data(tmp_path))
    with pytest.raises(ConfigError, match="teacher 'calc' has no endpoint: set "
                                          "teachers.calc.endpoint, pass --teacher calc="):
        Trainer(recipe, show_progress=False)
    with pytest.raises(ConfigError, match="names one teacher, and this recipe routes to 2"):
        Trainer(recipe, teacher_endpoint="ipc:///tmp/x", show_progress=False)
    with pytest.raises(ConfigError, match="--teacher sql=... names no teacher"):
        Trainer(recipe, teacher_endpoints={"sql": "ipc:///tmp/x"}, show_progress=False)


@pytest.fixture
def records(tmp_path, monkeypatch):
    """A private qualifications folder (the session cache is shared by every test)."""
    from miniverl.common import qualification

    folder = tmp_path / "qualifications"
    monkeypatch.setattr(qualification, "qualifications_dir", lambda: folder)
    return folder


def _qualify(recipe, route_name, environment, success):
    """A qualification record of route ``route_name``'s fake teacher on ``environment``."""
    from miniverl.common.qualification import (
        RECORD_KIND,
        environment_signature,
        save_record,
    )
    from miniverl.common.teacher_routes import route_view

    view = route_view(recipe, routes(recipe)[route_name], environment)
    save_record({
        "kind": RECORD_KIND, "environment": environment_signature(view), "split": "eval",
        "teacher": {"name": f"{route_name}-teacher", "model": "toy", "revision": None,
                    "adapter_sha256": None},
        "model_dir_sha256": None, "n": 8, "success": success, "by_difficulty": {},
        "date": "2026-12-01T00:00:00+00:00", "miniverl_version": "test"})


@pytest.mark.slow  # toy OPD runs
def test_each_route_is_gated_on_its_own_environments_before_the_warm_up(tmp_path, toy,
                                                                        records):
    from miniverl.common.qualification import TeacherNotQualified
    from miniverl.student.train.trainer import Trainer

    data = _data(tmp_path, cycles=1, rollouts_per_cycle=4)
    data["teachers"]["nav"]["min_success"] = 0.5  # calc has no gate
    data["train"]["sft_warmup_steps"] = 2
    recipe = Recipe.model_validate(data)  # validate accepts a gate per teacher

    def train(clients=None):
        with Trainer(recipe, route_clients=clients or _clients(toy), show_progress=False,
                     write_report=False, checkpoints=False) as trainer:
            return trainer.train()

    with pytest.raises(TeacherNotQualified, match=(
            "route nav, environment jsonnav: teacher nav-teacher \\(toy\\) has no "
            "qualification record for jsonnav")):
        train()
    _qualify(recipe, "nav", "calculator", 0.9)  # another environment's record: no use
    _qualify(recipe, "nav", "jsonnav", 0.4)
    with pytest.raises(TeacherNotQualified, match="measured success 0.400 on jsonnav eval"):
        train()
    # Refused before the warm-up's first step: no run wrote a metrics row.
    assert not any(m.read_text().strip() for m in tmp_path.rglob("metrics.jsonl"))
    _qualify(recipe, "nav", "jsonnav", 0.75)
    clients = _clients(toy)
    clients["nav"].reload_before_next_wait = True  # gated again when it reloads
    result = train(clients)
    assert result.status == "completed"
    said = [(e["route"], e["environment"], e["success"], e["min_success"], e["teacher"]["gen"])
            for e in events(result.run_dir, "teacher_qualified")]
    assert said == [("nav", "jsonnav", 0.75, 0.5, 0), ("nav", "jsonnav", 0.75, 0.5, 1)]


def _clients(toy):
    return {name: FakeTeacherClient(toy.model, toy.tokenizer_fp, toy.vocab_size,
                                    name=f"{name}-teacher")
            for name in ("calc", "nav")}


@pytest.mark.slow  # two toy OPD runs
def test_a_routed_run_scores_each_episode_by_its_own_teacher(tmp_path, toy):
    from miniverl.student.train.trainer import Trainer

    recipe = Recipe.model_validate(_data(tmp_path, cycles=3, rollouts_per_cycle=8))
    clients = _clients(toy)
    clients["nav"].reload_before_next_wait = True  # nav's teacher reloads during update 1
    with Trainer(recipe, route_clients=clients, show_progress=False, write_report=False,
                 checkpoints=False) as trainer:
        result = trainer.train()
    assert result.status == "completed" and result.final_version == 3
    trajs = read_trajectories(result.run_dir / "trajectories.jsonl")
    per_env = {env: sum(t.environment == env for t in trajs) for env in ("calculator", "jsonnav")}
    assert per_env["calculator"] and per_env["jsonnav"]
    # Each teacher was asked for its own environment's episodes only; nav's reload
    # re-sent its own (one update's worth), calc's count is exactly its episodes.
    assert len(clients["calc"].scored_versions) == per_env["calculator"]
    assert len(clients["nav"].scored_versions) > per_env["jsonnav"]
    rows = [json.loads(line) for line in
            (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r.get("phase") == "train"]
    last = train_rows[-1]["by_teacher"]
    assert last["calc"]["episodes"] == per_env["calculator"]
    assert last["nav"]["episodes"] == per_env["jsonnav"]
    assert all(r["stale_dropped"] == 0 for r in train_rows)
    connected = events(result.run_dir, "teacher_connected")
    assert [(e["route"], e["environments"]) for e in connected] == [
        ("calc", ["calculator"]), ("nav", ["jsonnav"])]
    changed = events(result.run_dir, "teacher_changed")
    assert [e["route"] for e in changed] == ["nav"] and changed[0]["how"] == "reload"
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    ranges = [(t["route"], t["name"], t["from_version"], t["to_version"], t["how"])
              for t in manifest["teachers"]]
    assert ranges == [("calc", "calc-teacher", 0, 2, "connect"),
                      ("nav", "nav-teacher", 0, 0, "connect"),
                      ("nav", "nav-teacher", 0, 2, "reload")]  # reloaded in update 0
    final = events(result.run_dir, "run_completed")[-1]["teacher_counters"]
    assert set(final["by_teacher"]) == {"calc", "nav"}
    # The report's summary and `miniverl status` show each teacher.
    from miniverl.cli.run_status import finished_lines, finished_summary
    from miniverl.common.rundir import RunDir
    from miniverl.student.report.load import load_run
    from miniverl.student.report.summary import summary_rows

    rows = dict(summary_rows(load_run(result.run_dir)))
    assert rows["by teacher"].startswith("calc: ") and "; nav: " in rows["by teacher"]
    assert f"of {per_env['jsonnav']} episodes" in rows["by teacher"]
    lines = finished_lines(finished_summary(RunDir.open(result.run_dir)))
    assert any(line.startswith("  teachers   calc: ") for line in lines)
    assert any(line.strip().startswith("nav: ") for line in lines)
    # ... and so does the summary the student process prints when it ends.
    from miniverl.student.api import summary_lines

    printed = summary_lines(result)
    assert any(line.startswith("  calc: ") and "episodes" in line for line in printed)
    assert any(line.startswith("  nav: ") for line in printed)


@pytest.mark.slow  # one toy OPD run
def test_teacher_use_moves_one_route_and_leaves_the_other(tmp_path, toy, monkeypatch):
    from miniverl.student.train import loop
    from miniverl.student.train.teacher import connect as teacher
    from miniverl.student.train.trainer import Trainer

    recipe = Recipe.model_validate(_data(tmp_path, cycles=3, rollouts_per_cycle=8))
    clients = _clients(toy)
    vetted = []
    monkeypatch.setattr(teacher, "vet_route",
                        lambda state, route, endpoint: vetted.append((route.route.name, endpoint)))
    log = loop.log_cycle

    def logging_then_retarget(state, done):
        log(state, done)
        if state.step == 1:
            trainer.request_retarget("ipc:///tmp/nav-2.sock", trainer.route_to_retarget("nav"))

    monkeypatch.setattr(loop, "log_cycle", logging_then_retarget)
    trainer = Trainer(recipe, route_clients=clients, show_progress=False, write_report=False,
                      checkpoints=False)
    with pytest.raises(ConfigError, match=r"several teachers \(calc, nav\) and the request "
                                          "names no route; pass --route"):
        trainer.route_to_retarget(None)
    with pytest.raises(ConfigError, match="names route 'sql'"):
        trainer.route_to_retarget("sql")
    with trainer:
        result = trainer.train()
    assert result.status == "completed"
    assert vetted == [("nav", "ipc:///tmp/nav-2.sock")]
    changed = events(result.run_dir, "teacher_changed")
    assert [(e["route"], e["how"], e["version"]) for e in changed] == [("nav", "retarget", 1)]
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    assert [(t["route"], t["from_version"], t["to_version"]) for t in manifest["teachers"]] == [
        ("calc", 0, 2), ("nav", 0, 0), ("nav", 1, 2)]
    rows = [json.loads(line) for line in
            (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["stale_dropped"] == 0 for r in rows if r.get("phase") == "train")


class _Dying(FakeTeacherClient):
    """nav's teacher: down when the update of version ``down_at`` begins (the test's
    hook says so), up again for the next, and going down in the middle of scoring
    version ``dies_at``."""

    down_at = 1
    dies_at = 2

    def wait(self, ids, timeout_s=None):
        if self._version == self.dies_at:
            self.connected = False  # its socket went silent while the others answered
        return super().wait(ids, timeout_s)


@pytest.mark.slow  # one toy OPD run
def test_a_failed_teacher_holds_back_only_its_own_domain(tmp_path, toy):
    from miniverl.student.train import loop
    from miniverl.student.train.trainer import Trainer

    recipe = Recipe.model_validate(_data(tmp_path, cycles=4, rollouts_per_cycle=8))
    clients = _clients(toy)
    clients["nav"] = _Dying(toy.model, toy.tokenizer_fp, toy.vocab_size, name="nav-teacher")
    steps = []
    log = loop.log_cycle

    def logging(state, done):
        log(state, done)
        steps.append((state.version - 1, [t.environment for t in done.trajs],
                      [s.traj.environment for s in done.scored]))
        # The next update begins with nav down (killed), or up again (restarted).
        clients["nav"].connected = state.version != clients["nav"].down_at

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "log_cycle", logging)
        with Trainer(recipe, route_clients=clients, show_progress=False, write_report=False,
                     checkpoints=False) as trainer:
            result = trainer.train()
    assert result.status == "completed" and result.final_version == 4  # no update lost
    held = {v: played.count("jsonnav") for v, played, _ in steps if v in (1, 2)}
    assert all(held.values()), steps  # both updates had nav episodes to hold back
    said = [(e["route"], e["version"], e["episodes"], e["why"])
            for e in events(result.run_dir, "route_held_back")]
    assert said == [
        ("nav", 1, held[1], "its teacher was not connected when the update began"),
        ("nav", 2, held[2], "its teacher went down while scoring")]
    for version, played, trained in steps:
        # calc's domain trained every update; nav's only while its teacher answered.
        want = [e for e in played if e == "calculator" or version not in held]
        assert trained == want, (version, played, trained)
    # nav was never asked for version 1 (down when it began); what it was asked for
    # version 2 was forgotten, not trained on.
    assert 1 not in clients["nav"].scored_versions and 2 in clients["nav"].scored_versions
    assert not clients["nav"]._pending
    rows = [json.loads(line) for line in
            (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r.get("phase") == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    last = train_rows[-1]
    played = sum(p.count("jsonnav") for _, p, _ in steps)
    assert last["by_teacher"]["nav"]["held_back"] == sum(held.values()) == last["held_back"]
    assert last["by_teacher"]["nav"]["episodes"] == played - sum(held.values())
    assert last["by_teacher"]["calc"]["held_back"] == 0
    assert all(r["stale_dropped"] == 0 for r in train_rows)
    from miniverl.student.report.summary import fmt_by_teacher

    calc_line, nav_line = fmt_by_teacher(last["by_teacher"])
    assert nav_line.endswith(f", {sum(held.values())} episodes held back (teacher down)")
    assert "held back" not in calc_line


@pytest.mark.slow  # one toy SFT run, two teachers played in process
def test_seqkd_from_two_teachers_plays_each_environment_with_its_own(tmp_path, monkeypatch):
    # SFT on the specialists' own samples: train.fixed_set: teacher with teachers: plays
    # each environment's tasks with its route's teacher, in this process (no server).
    from miniverl.student import teacher_play
    from miniverl.student.train import fixed_sets
    from miniverl.student.train.trainer import Trainer

    data = _data(tmp_path, cycles=2, rollouts_per_cycle=8)
    data["run"]["mode"] = "sft"
    data["train"]["fixed_set"] = "teacher"
    nav_toy = {**data["teachers"]["nav"]["model"]["toy"], "seed": 5}
    data["teachers"]["nav"]["model"] = {"toy": nav_toy}
    recipe = Recipe.model_validate(data)
    played = []
    real = teacher_play.play_as_teacher

    def recording(view, tasks, seeds, *args, **kw):
        played.append((view.environment.name, view.teacher.model.toy.seed,
                       len(tasks), kw.get("gate")))
        return real(view, tasks, seeds, *args, **kw)

    monkeypatch.setattr(fixed_sets, "play_as_teacher", recording)
    with Trainer(recipe, show_progress=False, write_report=False, checkpoints=False) as trainer:
        result = trainer.train()  # no --teacher: nothing to connect to
    assert result.status == "completed" and result.steps == 2
    calc_seed = data["teachers"]["calc"]["model"]["toy"].get("seed")
    assert sorted(p[:2] for p in played) == sorted([("calculator", calc_seed), ("jsonnav", 5)])
    assert all(gate for *_, gate in played)  # each route's own gate, when it has one
    trajs = read_trajectories(result.run_dir / "trajectories.jsonl")
    teacher = [t for t in trajs if t.source == "teacher"]
    assert {t.environment for t in teacher} == {"calculator", "jsonnav"}
    assert len(teacher) == sum(n for _, _, n, _ in played)
    # Bad input: several teachers in sft without SeqKD's set, one line naming the fix.
    del data["train"]["fixed_set"]
    assert "set train.fixed_set: teacher, or run.mode: opd" in _problems(data)


class _StubLink:
    """A route's link for RoutedLink alone: its teacher answers at once while its client
    is connected, and never while it is not (ScoreTimeout at each poll)."""

    def __init__(self, client):
        self.client, self.jobs, self.begun, self.wait_s = client, [], [], 0.0

    def counters(self):
        return {}

    def begin_update(self, version, lag=0):
        self.client.connected = True  # bind() waits until the teacher is back
        self.begun.append(version)
        self.jobs = []

    def submit(self, traj, positions_P):
        self.jobs.append(traj)

    def collect(self, timeout_s=None):
        from miniverl.protocol.scoring_client import ScoreTimeout

        if not self.client.connected:
            raise ScoreTimeout("down")
        out, self.jobs = [SimpleNamespace(traj=t, positions_P=[0]) for t in self.jobs], []
        return out

    def hold_back(self):
        held, self.jobs = self.jobs, []
        return held


def _routed(names, down=()):
    from miniverl.common.teacher_routes import Route
    from miniverl.student.train.teacher.routed import RoutedLink, RouteSide

    sides, said = {}, []
    for name in names:
        client = SimpleNamespace(connected=name not in down, counters={})
        route = Route(name=name, teacher=name, adapter=None, environments=(name,), config=None)
        sides[name] = RouteSide(route, None, client=client, link=_StubLink(client))
    link = RoutedLink(sides, {n: n for n in names},
                      on_held=lambda route, n, why: said.append((route, n, why)))
    return link, sides, said


def _episodes(link, envs):
    trajs = [SimpleNamespace(environment=env, i=i) for i, env in enumerate(envs)]
    for traj in trajs:
        link.submit(traj, [0])
    return trajs


def test_a_down_teacher_with_the_whole_update_is_waited_for():
    link, sides, said = _routed(["calc", "nav"], down={"nav"})
    link.begin_update(5)
    assert sides["nav"].link.begun == []  # not bound while down
    trajs = _episodes(link, ["nav", "nav"])  # nothing of calc's to train on
    scored = link.collect()
    assert [s.traj for s in scored] == trajs and said == []
    assert sides["nav"].link.begun == [5]  # bound at collect, waiting for its teacher


def test_every_failed_teacher_is_held_back_while_one_answers():
    link, sides, said = _routed(["calc", "nav", "sql"])
    link.begin_update(3)
    trajs = _episodes(link, ["nav", "calc", "sql", "nav"])
    sides["nav"].client.connected = sides["sql"].client.connected = False  # both die
    scored = link.collect()
    assert [s.traj for s in scored] == [trajs[1]]
    assert sorted((r, n) for r, n, _ in said) == [("nav", 2), ("sql", 1)]
    assert (sides["nav"].held_back, sides["sql"].held_back, sides["calc"].held_back) == (2, 1, 0)
    assert link.counters()["held_back"] == 3


def test_export_verl_takes_a_run_of_several_teachers(tmp_path):
    # A run of several teachers exports (tests/bridge/test_mixture_bundle.py); this one has
    # no checkpoint yet, which is what the export asks for first.
    from miniverl.bridge.bundle import export_verl
    from miniverl.common.recipe import dump_resolved

    run = tmp_path / "routed-run"
    run.mkdir()
    (run / "recipe.resolved.yaml").write_text(dump_resolved(Recipe.model_validate(
        _data(tmp_path))))
    with pytest.raises(ConfigError, match=r"has no checkpoints/step_N/"):
        export_verl(run, tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()


def test_status_shows_each_teacher(tmp_path, toy):
    from miniverl.protocol.control_socket import StatusReply
    from miniverl.student.control import status_snapshot
    from miniverl.student.train.trainer import Trainer

    recipe = Recipe.model_validate(_data(tmp_path))
    with Trainer(recipe, route_clients=_clients(toy), show_progress=False,
                 write_report=False, checkpoints=False) as trainer:
        snapshot = status_snapshot(trainer)
    reply = StatusReply(id=1, **snapshot)
    assert list(reply.by_teacher) == ["calc", "nav"]
    assert reply.by_teacher["calc"]["episodes"] == 0 and "sent" in reply.by_teacher["nav"]
    # Before the first cycle connects them: no one has answered yet.
    assert reply.by_teacher["calc"]["teacher"] is None


@pytest.mark.slow  # one toy run
def test_a_routed_run_warms_up_on_both_domains_then_connects_each_teacher(tmp_path, toy):
    from miniverl.student.train.trainer import Trainer

    recipe = Recipe.model_validate(_data(tmp_path, cycles=1, rollouts_per_cycle=8,
                                         sft_warmup_steps=2))
    clients = _clients(toy)
    with Trainer(recipe, route_clients=clients, show_progress=False, write_report=False,
                 checkpoints=False) as trainer:
        result = trainer.train()
    assert (result.status, result.steps) == ("completed", 3)
    assert [e["route"] for e in events(result.run_dir, "teacher_connected")] == ["calc", "nav"]
    assert sum(len(c.scored_versions) for c in clients.values()) == 8


def test_the_two_teacher_example_validates_and_routes_each_domain():
    from pathlib import Path

    from miniverl.common.recipe import load_recipe

    folder = Path(__file__).resolve().parents[3] / "examples" / "several_teachers"
    recipe = load_recipe(folder / "two_teachers.yaml")
    assert route_of_environment(recipe) == {"calculator": "calc", "jsonnav": "nav"}
    for name, section in recipe.teachers.items():  # each teacher's preparation is there
        prep = load_recipe((folder / section.prepare).resolve())
        assert prep.run.mode == "sft" and prep.student.model == section.model, name
        assert prep.environment.name == next(
            e.name for e in recipe.environments if e.teacher == name)


@pytest.mark.slow  # one toy OPD run
def test_a_privileged_route_sees_its_own_environments_privileged_view(tmp_path, toy):
    # teachers.nav.mode privileged_context: nav's requests carry each jsonnav episode
    # as the privileged teacher sees it (its task's context in the system message),
    # calc's carry the calculator episodes' own tokens, and no request of one route
    # holds the other's environment.
    import numpy as np

    from miniverl.student.train.trainer import Trainer

    data = _data(tmp_path, cycles=2, rollouts_per_cycle=8)
    data["teachers"]["nav"]["mode"] = "privileged_context"
    recipe = Recipe.model_validate(data)
    clients = _clients(toy)
    sent: dict[str, list[tuple[int, ...]]] = {"calc": [], "nav": []}
    for name, client in clients.items():
        def recording(tokens_N, cu, positions, *, _real=client.submit, _name=name, **kw):
            sent[_name].append(tuple(np.asarray(tokens_N).tolist()))
            return _real(tokens_N, cu, positions, **kw)

        client.submit = recording
    from miniverl.student.rollout.privileged import PrivilegedViews, task_lookup

    with Trainer(recipe, route_clients=clients, show_progress=False, write_report=False,
                 checkpoints=False) as trainer:
        result = trainer.train()
        policy, of = trainer.state.policy, trainer.state.tasks.mixture.environment_of
        tasks = [t for t in trainer.state.tasks.all if of[t.id] == "jsonnav"]
        entries = trainer.state.cache.keys()  # sorted EntryKeys (a cache is not a mapping)
        keyed = {key.teacher for key in entries}
    # Each route's targets are on record under what its teacher was shown: nav's
    # privileged view is another entry than the plain episode's (targets_entries.py).
    assert keyed == {"calc-teacher", "nav-teacher+privileged_context"}
    assert result.status == "completed" and result.final_version == 2
    trajs = read_trajectories(result.run_dir / "trajectories.jsonl")
    own = {env: {tuple(t.tokens) for t in trajs if t.environment == env}
           for env in ("calculator", "jsonnav")}
    assert sent["calc"] and set(sent["calc"]) <= own["calculator"]
    # nav was sent exactly the privileged views of the jsonnav episodes, made here the
    # way a single privileged teacher's are, from each episode's own jsonnav task.
    member = recipe.environments[1]
    views = PrivilegedViews(
        policy.tokenizer, tokenizer_fp=policy.tokenizer_fp, env_name="jsonnav",
        env_params=member.params,
        task_of=task_lookup("jsonnav", member.params, member.difficulty, member.split_seed,
                            {"train": member.train_tasks}, known=tasks))
    expected = {tuple(views.view(t).tokens.tolist()) for t in trajs if t.environment == "jsonnav"}
    assert sent["nav"] and set(sent["nav"]) <= expected
    assert not set(sent["nav"]) & (own["jsonnav"] | own["calculator"])
    # A privileged route may not play SeqKD's episodes (the student trains on the plain
    # view): one line, as for one teacher.
    data["run"]["mode"] = "sft"
    data["train"]["fixed_set"] = "teacher"
    assert "teachers.nav: fixed_set 'teacher' plays episodes" in _problems(data)
