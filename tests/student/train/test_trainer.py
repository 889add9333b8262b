"""Trainer equivalences and the strict on-policy guarantee, on toy models in process.

- Injected stale, duplicate and wrong-generation SCORE_OK replies reach the real
  ``SyncTeacherClient`` (``miniverl.testing``'s fake teacher) and never the loss: what the
  loss saw is compared with the teacher's true targets for the current version.
- Resume is exact: N cycles, stop, resume for the rest gives bitwise the parameters
  of an uninterrupted run (CPU, deterministic mode); another recipe is refused with
  the differing fields named.
- Pipelined and serial OPD give the same parameters, in whatever order episodes end.
"""

from __future__ import annotations

import pytest
import torch

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe
from miniverl.student.train.trainer import Trainer
from miniverl.testing import answer, reload, stale, wrong_id
from tests.student.train.trainer_kit import (
    LossRecorder,
    parameters,
    poison,
    same_parameters,
    scripted_client,
    scripted_teacher,
)
from tests.toy_kit import events, make_recipe, metrics, recipe_dict

torch.set_num_threads(1)


def run_and_record(recipe, client, monkeypatch, **kw):
    trainer = Trainer(recipe, client=client, show_progress=False, write_report=False, **kw)
    recorder = LossRecorder(trainer).install(monkeypatch)
    with trainer:
        result = trainer.train()
    return trainer, result, recorder


def assert_true_targets(toy, recorder, k, gen=0):
    """Everything that reached the loss is the honest teacher's answer for the version
    that is being updated."""
    assert recorder.calls
    for call in recorder.calls:
        for traj, positions, arrays, version, teacher in call["scored"]:
            assert version == call["version"] == traj.policy_version
            assert teacher["gen"] == gen
            ref = toy.reference(traj, positions, k=k)
            for name in ("ids", "logprobs", "tail_logmass", "target_logprobs"):
                assert (arrays[name] == ref[name]).all(), name


# -- strict OPD against a misbehaving teacher --------------------------------------------


@pytest.mark.slow
def test_stale_duplicate_and_unknown_replies_never_reach_the_loss(tmp_path, toy, monkeypatch):
    teacher = scripted_teacher(toy)
    # Before the honest reply: two for other student versions, one for an id nobody
    # asked about. After it: a duplicate of the same id with poisoned numbers.
    teacher.default = (stale(scorer=poison) + stale(lag=2, scorer=poison)
                       + wrong_id(scorer=poison) + answer() + answer(scorer=poison))
    recipe = make_recipe("opd", tmp_path, cycles=3)
    client = scripted_client(teacher)
    _, result, recorder = run_and_record(recipe, client, monkeypatch)
    assert result.status == "completed" and result.final_version == 3
    assert_true_targets(toy, recorder, recipe.loss.top_k)
    n_scores = len(teacher.scores)
    assert n_scores == 3 * 4
    # Four bad replies per SCORE, each dropped and counted.
    assert client.counters["stale_dropped"] == 4 * n_scores
    assert metrics(result.run_dir)[-1]["stale_dropped"] == 4 * n_scores


@pytest.mark.slow
def test_reply_from_another_teacher_generation_is_never_trained_on(tmp_path, toy, monkeypatch):
    # The teacher reloads (gen 0 -> 1) while cycle 1 is being scored: the first reply
    # of that update comes from gen 1 and a poisoned gen-0 reply trails it. The update
    # is rebound to gen 1 and scored again as a whole; nothing else reaches the loss.
    teacher = scripted_teacher(toy)
    # Cycle 0 sends four SCOREs; the first of cycle 1 meets the reload.
    teacher.script(*[answer()] * 4,
                   reload() + answer(scorer=poison) + answer(scorer=poison, gen=0))
    recipe = make_recipe("opd", tmp_path, cycles=3)
    client = scripted_client(teacher)
    _, result, recorder = run_and_record(recipe, client, monkeypatch)
    assert result.status == "completed"
    gens = [{s[4]["gen"] for s in call["scored"]} for call in recorder.calls]
    assert gens == [{0}, {1}, {1}]
    for call in recorder.calls:
        for traj, positions, arrays, version, _ in call["scored"]:
            assert version == call["version"]
            ref = toy.reference(traj, positions, k=recipe.loss.top_k)
            assert (arrays["logprobs"] == ref["logprobs"]).all()
    assert client.counters["stale_dropped"] >= 1
    changed = events(result.run_dir, "teacher_changed")
    assert [(e["how"], e["version"], e["new"]["gen"]) for e in changed] == [("reload", 1, 1)]


# -- resume ------------------------------------------------------------------------------


def stop_after(monkeypatch, trainer: Trainer, cycles: int) -> None:
    """Ask ``trainer`` to stop at the update boundary after ``cycles`` cycles."""
    from miniverl.student.train import loop

    log = loop.log_cycle

    def logging_then_stop(state, done):
        log(state, done)
        if state is trainer.state and state.cycle + 1 >= cycles:
            trainer.stop_event.set()

    monkeypatch.setattr(loop, "log_cycle", logging_then_stop)


@pytest.mark.parametrize("mode", ["sft", "opd", "replay", "offline_kd"])
@pytest.mark.slow
def test_resume_is_bitwise_equal_to_an_uninterrupted_run(tmp_path, toy, mode, monkeypatch):
    extra = {"max_lag": 2} if mode == "replay" else {}
    recipe = make_recipe(mode, tmp_path, cycles=4, **extra)

    def client():
        return toy.fake_client() if mode != "sft" else None

    opts = dict(show_progress=False, write_report=False)
    with Trainer(recipe, client=client(), run_id="whole", **opts) as trainer:
        whole = trainer.train()
        expected = parameters(trainer)
    assert whole.status == "completed"

    first = Trainer(recipe, client=client(), run_id="split", **opts)
    stop_after(monkeypatch, first, 2)
    with first:
        stopped = first.train()
    assert (stopped.status, stopped.final_version) == ("interrupted", 2)
    with Trainer(recipe, client=client(), run_id="split", resume=True, **opts) as second:
        resumed = second.train()
        got = parameters(second)
    assert (resumed.status, resumed.final_version, resumed.steps) == ("completed", 4, 4)
    assert same_parameters(expected, got)
    assert resumed.eval["success"] == whole.eval["success"]
    assert len(events(resumed.run_dir, "resumed")) == 1


def test_resume_with_another_recipe_names_the_differing_fields(tmp_path):
    recipe = make_recipe("sft", tmp_path, cycles=2)
    with Trainer(recipe, run_id="r", show_progress=False, write_report=False) as trainer:
        trainer.train()
    changed = recipe_dict("sft", tmp_path, cycles=2, lr=5e-4)
    changed["run"]["seed"] = 7
    with pytest.raises(ConfigError) as info:
        Trainer(Recipe.model_validate(changed), run_id="r", resume=True)
    message = str(info.value)
    assert "run.seed" in message and "train.lr" in message and "rollout" not in message


@pytest.mark.slow
def test_resume_needs_a_run_id_a_checkpoint_and_an_unfinished_run(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="--run-id"):
        Trainer(make_recipe("sft", tmp_path), resume=True)
    recipe = make_recipe("sft", tmp_path, cycles=3)
    opts = dict(show_progress=False, write_report=False)
    first = Trainer(recipe, run_id="nockpt", checkpoints=False, **opts)
    stop_after(monkeypatch, first, 1)
    with first:
        assert first.train().status == "interrupted"
    with Trainer(recipe, run_id="nockpt", resume=True, **opts) as trainer, pytest.raises(
        ConfigError, match="no checkpoint"
    ):
        trainer.train()
    with Trainer(recipe, run_id="done", **opts) as trainer:
        trainer.train()
    with Trainer(recipe, run_id="done", resume=True, **opts) as trainer, pytest.raises(
        ConfigError, match="'completed'"
    ):
        trainer.train()


def test_a_new_run_id_that_exists_is_refused(tmp_path):
    recipe = make_recipe("sft", tmp_path, cycles=1)
    with Trainer(recipe, run_id="taken", show_progress=False, write_report=False) as trainer:
        trainer.train()
    with pytest.raises(ConfigError, match="already exists"):
        Trainer(recipe, run_id="taken")


# -- pipelining --------------------------------------------------------------------------


def train_params(recipe, client, **kw):
    with Trainer(recipe, client=client, show_progress=False, write_report=False, **kw) as t:
        t.train()
        return parameters(t)


@pytest.mark.parametrize("mode", ["opd", "replay"])
@pytest.mark.slow
def test_pipelined_and_serial_give_the_same_parameters(tmp_path, toy, mode):
    extra = {"max_lag": 1} if mode == "replay" else {}
    runs = {}
    for pipelining in (True, False):
        recipe = make_recipe(mode, tmp_path / str(pipelining), cycles=3,
                             pipelining=pipelining, **extra)
        runs[pipelining] = train_params(recipe, toy.fake_client())
    assert same_parameters(runs[True], runs[False])


@pytest.mark.slow
def test_pipelined_equals_serial_when_episodes_finish_out_of_order(tmp_path, toy, monkeypatch):
    # With a trained student, episodes end at different turns and their SCOREs leave
    # in finishing order; the update must not depend on that order.
    from miniverl.student.rollout.runner import RolloutRunner

    real_run = RolloutRunner.run

    def reversed_finish(self, tasks, *, policy_version, seeds=None, greedy=False,
                        on_finished=None):
        trajs = real_run(self, tasks, policy_version=policy_version, seeds=seeds,
                         greedy=greedy)
        if on_finished is not None:
            for traj in reversed(trajs):
                on_finished(traj)
        return trajs

    monkeypatch.setattr(RolloutRunner, "run", reversed_finish)
    runs = {}
    for pipelining in (True, False):
        recipe = make_recipe("opd", tmp_path / str(pipelining), cycles=2,
                             pipelining=pipelining, grad_accum=2)
        runs[pipelining] = train_params(recipe, toy.fake_client())
    assert same_parameters(runs[True], runs[False])


@pytest.mark.slow
def test_pipelined_update_runs_its_forward_while_the_teacher_scores(tmp_path, toy, monkeypatch):
    # The update's forward needs no targets, so a pipelined cycle runs it before waiting
    # for the last reply, and the update reuses it instead of a second forward.
    from miniverl.student.train import updates

    fake = toy.fake_client()
    events: list[str] = []
    real_wait, real_hidden = fake.wait, updates.hidden_at_positions

    def wait(*args, **kw):
        events.append("wait")
        return real_wait(*args, **kw)

    def hidden(*args, **kw):
        events.append("forward")
        return real_hidden(*args, **kw)

    fake.wait = wait
    monkeypatch.setattr(updates, "hidden_at_positions", hidden)
    train_params(make_recipe("opd", tmp_path / "on", cycles=2), fake)
    assert events == ["forward", "wait"] * 2
    events.clear()
    train_params(make_recipe("opd", tmp_path / "off", cycles=2, pipelining=False), fake)
    assert events == ["wait", "forward"] * 2


def test_pipelining_submits_each_episode_before_the_rollout_ends(tmp_path, toy, monkeypatch):
    # Pipelining means the first SCORE leaves while other episodes still sample: with a
    # batch of 2 and 4 rollouts, the first two are submitted before the last two start.
    from miniverl.student.rollout.runner import RolloutRunner
    from miniverl.student.train import loop

    fake = toy.fake_client()
    order: list[str] = []
    real_start = RolloutRunner._start
    real_submit = fake.submit

    def start(self, task, seed):
        order.append("start")
        return real_start(self, task, seed)

    def submit(*args, **kw):
        order.append("submit")
        return real_submit(*args, **kw)

    monkeypatch.setattr(RolloutRunner, "_start", start)
    # Only the training rollout's order matters: no eval passes.
    monkeypatch.setattr(loop, "evaluate_now", lambda state: _NoEval())
    fake.submit = submit
    recipe_d = recipe_dict("opd", tmp_path, cycles=1)
    recipe_d["rollout"]["batch_size"] = 2
    with Trainer(Recipe.model_validate(recipe_d), client=fake, show_progress=False,
                 write_report=False) as trainer:
        trainer.train()
    assert order.index("submit") < len(order) - 1 - order[::-1].index("start")


class _NoEval:
    split, success, n = "eval", 0.0, 0

    def to_dict(self):
        return {"split": "eval", "success": 0.0, "n": 0}


@pytest.mark.slow
def test_a_version_is_evaluated_once_when_eval_every_divides_the_cycles(tmp_path, monkeypatch):
    from miniverl.student.train import loop

    calls = []
    real = loop.evaluate_now

    def counting(state):
        calls.append(state.version)
        return real(state)

    monkeypatch.setattr(loop, "evaluate_now", counting)
    recipe_d = recipe_dict("sft", tmp_path, cycles=2)
    recipe_d["train"]["eval_every"] = 2
    with Trainer(Recipe.model_validate(recipe_d), show_progress=False,
                 write_report=False) as trainer:
        result = trainer.train()
    assert calls == [0, 2]  # before, and the periodic eval at the end, reused as the final
    evals = events(result.run_dir, "eval")
    assert [e["version"] for e in evals] == [0, 2]
    assert result.eval["success"] == evals[-1]["success"]


@pytest.mark.slow
def test_eval_before_false_skips_the_start_and_reports_no_before(tmp_path, monkeypatch):
    from miniverl.student.benchmark.results import cell_result_from_run
    from miniverl.student.train import loop

    calls = []
    real = loop.evaluate_now
    monkeypatch.setattr(loop, "evaluate_now",
                        lambda state: calls.append(state.version) or real(state))
    recipe_d = recipe_dict("sft", tmp_path, cycles=2)
    recipe_d["eval"] = {"before": False}
    with Trainer(Recipe.model_validate(recipe_d), show_progress=False,
                 write_report=False) as trainer:
        result = trainer.train()
    assert calls == [2] and result.eval_before is None
    cell = cell_result_from_run(result.run_dir)
    assert cell.success_before is None and cell.success_after == result.eval["success"]
