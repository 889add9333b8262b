"""Below each mode's cycle, a stage's signature is its contract: it takes the objects it
uses (the policy, the runner, the teacher side or link, the tasks, the settings it
reads), never the run's whole :class:`TrainState` (docs/architecture.md).
A reader who opens a stage sees everything it reads in its parameters; the cycle is the
one place that unpacks the state.

The list below is every function a cycle calls, directly or through another stage, on
the way from the cycle to the formula, named one by one, so a stage added to the path
is added here too (and a stage that starts taking the state fails here, naming it)."""

from __future__ import annotations

import inspect

import pytest

from miniverl.student.train import state as state_module
from miniverl.student.train import steps, updates
from miniverl.student.train.fixed_sets import TeacherBatches
from miniverl.student.train.modes import dpo, offline_kd, sft
from miniverl.student.train.objectives import by_kind, objective
from miniverl.student.train.objectives.group_sampled_token import GroupSampledToken
from miniverl.student.train.objectives.group_uld import ByteGroupObjective, GroupULD
from miniverl.student.train.objectives.variants import TaskReward, WithVariants, step_inputs
from miniverl.student.train.teacher.link import PrivilegedLink, TeacherLink, TeacherSide
from miniverl.student.train.teacher.routed import RoutedLink
from miniverl.student.train.teacher.xvocab import XvocabLink

# Every function on the per-update path below the modes' cycles (OpdMode.cycle,
# ReplayMode.cycle, OfflineKdMode.cycle and mixed_cycle, RlMode.cycle, SftMode.cycle and
# the warm-up's warmup_step, DpoMode.cycle).
PER_UPDATE_PATH = [
    # Which tasks and seeds a cycle plays.
    state_module.TrainTasks.episodes, state_module.TrainTasks.of_cycle,
    state_module.TrainTasks.oracle, state_module.episode_seed, state_module.group_size,
    state_module.fixed_draw,
    # Sample, each episode to the teacher; collect its targets.
    steps.sample, steps.collect,
    # The teacher links an update calls.
    TeacherSide.counters,
    TeacherLink.begin_update, TeacherLink.submit, TeacherLink.collect, TeacherLink.counters,
    TeacherLink._request, TeacherLink._submit, TeacherLink._scored,
    PrivilegedLink._request,
    XvocabLink._request, XvocabLink._scored, XvocabLink.counters,
    RoutedLink.begin_update, RoutedLink.submit, RoutedLink.collect, RoutedLink.counters,
    # The early forward and the optimizer step.
    updates.first_micro_batch, updates.micro_batches, updates.early_forward,
    updates.EarlyForward.covers, updates.hidden_at_positions, updates.pad_batch,
    updates.distill_step, updates.sft_step, updates.finish_step,
    # The objective, chunk by chunk, to the formula.
    objective.Objective.step_inputs, objective.Objective.batch_loss, objective.targets_of,
    objective.next_tokens, objective.TeacherTargets.from_arrays,
    objective.TeacherTargets.with_inputs, objective.Objective.loss,
    objective.Objective.check, objective.Objective.chunks, objective.Objective.over_chunks,
    objective.TeacherTargets.rows, objective.BucketedTopkTail.per_position,
    objective.ExactFullVocab.per_position, objective.SampledToken.per_position,
    objective.CrossEntropy.per_position,
    by_kind.ByKind.batch_loss, by_kind.kind_parts,
    WithVariants.per_position, WithVariants.step_inputs, step_inputs,
    TaskReward.per_position, TaskReward.step_inputs,
    ByteGroupObjective.loss, GroupULD.over_groups, GroupULD.per_position,
    GroupSampledToken.over_groups, GroupSampledToken.per_position,
    # The modes' own stages.
    offline_kd.fixed_batch, offline_kd.LazyScoredSet.draw, offline_kd.split,
    sft.OracleBatches.batch, TeacherBatches.batch,
    dpo.build_pairs, dpo.score_reference, dpo.dpo_step, dpo.sequence_logprobs,
]


def _takes_the_state(function) -> list[str]:
    """The parameters of ``function`` that are the run's state (by type or by name)."""
    return [name for name, param in inspect.signature(function).parameters.items()
            if "TrainState" in str(param.annotation) or name == "state"]


@pytest.mark.parametrize("function", PER_UPDATE_PATH, ids=lambda f: f.__qualname__)
def test_no_stage_below_the_cycle_takes_the_train_state(function):
    # A stage's parameters say what it reads; the whole state would say nothing.
    assert _takes_the_state(function) == [], (
        f"{function.__module__}.{function.__qualname__} takes the run's state; pass it "
        "the objects it uses (the cycle unpacks the state)")


def test_the_check_can_fail():
    # The check sees a state parameter by its type and by its name.
    def by_type(state_of_run: state_module.TrainState) -> None: ...

    def by_name(state) -> None: ...

    assert _takes_the_state(by_type) == ["state_of_run"]
    assert _takes_the_state(by_name) == ["state"]


def test_distill_step_takes_at_most_seven_parameters():
    # The step reads the policy, the optimizer and its schedule, the batch, the
    # objective (which carries its own loss settings) and the train section.
    assert len(inspect.signature(updates.distill_step).parameters) <= 7
