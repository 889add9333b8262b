"""The recipe: one YAML file that says everything a run does.

A recipe is plain data validated by pydantic (``extra="forbid"``, bounds on every
field, rules whose messages name the value, the rule and the fix). Its sections live in
:mod:`~miniverl.common.recipe_models` (student, teacher) and
:mod:`~miniverl.common.recipe_sections` (the rest); this module holds the
:class:`Recipe` itself with the rules that read two sections at once, and the helpers
that digest, dump and compare recipes. ``load_recipe(path)`` reports *all* errors at
once, each with its YAML ``line:col`` and dotted field path (see
:mod:`miniverl.common.recipe_io`).

This module does not load models, start processes or know which environments exist;
the CLI checks the environment name against the registry.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .errors import ConfigError
from .names import name_problem
from .recipe_io import load_yaml_model, loads_yaml_model
from .recipe_models import StudentConfig, TeacherConfig
from .recipe_paths import anchor_paths
from .recipe_sections import (
    LOSS_VARIANT_FIELDS,
    CacheConfig,
    DpoConfig,
    EnvironmentConfig,
    EvalConfig,
    LossConfig,
    MixtureEnvironmentConfig,
    RolloutConfig,
    RunConfig,
    RuntimeConfig,
    TrainConfig,
    raise_issues,
)
from .teacher_routes import is_routed, routing_issues

TEACHER_MODES: frozenset[str] = frozenset({"offline_kd", "opd", "replay", "dpo"})
# Modes whose cycles draw fresh episodes through the one cycle draw (student/train/state.py
# TrainTasks.episodes), which is where a mixture of environments is drawn from.
MIXTURE_MODES: frozenset[str] = frozenset({"opd", "rl", "replay", "dpo", "sft"})
# Marks a mixture given beside a single environment (Recipe._one_way_to_name_environments).
BOTH_ENVIRONMENT_FIELDS = "environment and environments"


# -- rules of the loss variants that read the rollout (docs/losses.md) -----------------

# Modes whose updates train on episodes the student sampled (at rollout.temperature).
SAMPLING_MODES: frozenset[str] = frozenset({"opd", "replay"})


def _sampled_term(loss: LossConfig) -> tuple[str, str] | None:
    """``(field, what)`` of the first loss term that treats each trained token as a
    sample of the student at loss.temperature, or None when the loss has none."""
    if loss.estimator == "sampled_token":
        return "estimator", "estimator sampled_token"
    if loss.use_task_rewards:
        return "use_task_rewards", "the task-reward term (a policy gradient)"
    return None


def _temperature_issues(loss: LossConfig, rollout: RolloutConfig, where: str) -> list[tuple]:
    """The loss and the sampler must agree where the student's samples are trained on
    (``where`` says which episodes those are)."""
    issues: list[tuple] = []
    sampled = _sampled_term(loss)
    if loss.temperature != rollout.temperature:
        if sampled is not None:
            issues.append((("temperature",), (
                f"loss.temperature {loss.temperature:g} and rollout.temperature "
                f"{rollout.temperature:g} differ, but {sampled[1]} treats each token of "
                f"{where} as a sample of the student at loss.temperature (the gradient is "
                f"biased otherwise); set both to the same value")))
        elif not loss.allow_temperature_mismatch:
            issues.append((("temperature",), (
                f"loss.temperature {loss.temperature:g} and rollout.temperature "
                f"{rollout.temperature:g} differ: {where} are sampled at one and distilled at "
                "the other; set both to the same value, or loss.allow_temperature_mismatch: "
                "true if that is on purpose")))
    if sampled is not None and rollout.top_p != 1.0:
        issues.append(((sampled[0],), (
            f"{sampled[1]} treats each token of {where} as a sample of the whole student "
            f"distribution, but rollout.top_p {rollout.top_p:g} truncates it; set "
            "rollout.top_p: 1.0 or estimator: full")))
    return issues


def _rl_issues(loss: LossConfig, rollout: RolloutConfig) -> list[tuple]:
    """Mode rl trains on the task reward alone: a baseline needs other episodes, and the
    policy gradient treats each token as a sample of the student at loss.temperature."""
    issues = []
    if loss.use_task_rewards is not None or loss.distillation_loss_coef is not None:
        issues.append((("use_task_rewards",), (
            "mode rl trains on the task reward alone, always; remove use_task_rewards and "
            "distillation_loss_coef (they weigh a reward beside a teacher in opd)")))
    if loss.reward_baseline in (None, "group") and (rollout.group_size or 1) < 2:
        shown = "unset (one episode per task)" if rollout.group_size is None else "1"
        issues.append((("reward_baseline",), (
            f"mode rl compares each episode with the other episodes of its task (reward_baseline "
            f"group), but rollout.group_size is {shown}; set rollout.group_size >= 2 or "
            "reward_baseline: batch")))
    if loss.temperature != rollout.temperature:
        issues.append((("temperature",), (
            f"loss.temperature {loss.temperature:g} and rollout.temperature "
            f"{rollout.temperature:g} differ, but mode rl's policy gradient treats each token "
            "as a sample of the student at loss.temperature; set both to the same value")))
    return issues


def _task_reward_issues(loss: LossConfig, mode: str, rollout: RolloutConfig) -> list[tuple]:
    if mode == "rl":
        return _rl_issues(loss, rollout)
    if not loss.use_task_rewards:
        return [] if loss.reward_baseline is None else [(("reward_baseline",), (
            f"reward_baseline {loss.reward_baseline!r} applies only beside a task reward "
            "(use_task_rewards is unset); set use_task_rewards: true or remove "
            "reward_baseline"))]
    if mode not in SAMPLING_MODES:
        return [(("use_task_rewards",), (
            f"use_task_rewards is a policy gradient on the student's own episodes, which "
            f"mode {mode!r} does not train on; remove it or set run.mode: opd"))]
    if loss.reward_baseline not in (None, "group"):
        return []
    if mode == "replay":
        return [(("reward_baseline",), (
            "reward_baseline group compares the episodes of one task in an update, which "
            "replay's draw from its buffer does not keep together; set reward_baseline: batch"))]
    size = rollout.group_size
    if size is None or size < 2:
        shown = "unset (one episode per task)" if size is None else str(size)
        return [(("reward_baseline",), (
            f"reward_baseline group compares each episode with the other episodes of its "
            f"task, but rollout.group_size is {shown}; set rollout.group_size >= 2 or "
            "reward_baseline: batch"))]
    return []


class Recipe(BaseModel):
    """A complete, validated run description."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    schema_version: Literal[1] = Field(1, description="Recipe schema version.")
    run: RunConfig = Field(description="Name, mode, seed, output directory.")
    student: StudentConfig = Field(description="The policy being trained.")
    teachers: dict[str, TeacherConfig] | None = Field(
        None, min_length=1, max_length=16,
        description="Several teachers instead of teacher: name -> teacher section; each "
        "environment of a mixture names the one that scores its episodes "
        "(docs/several-teachers.md).",
    )
    teacher: TeacherConfig | None = Field(
        None, description="The frozen scorer; required by offline_kd, opd, replay and dpo."
    )
    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig, description="Tool environment and task splits."
    )
    environments: list[MixtureEnvironmentConfig] | None = Field(
        None, min_length=1, max_length=64,
        description="A mixture instead of environment: several environments, each with "
        "its weight, params, difficulty and splits (docs/environments.md, \"Mixtures\").",
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="How episodes are sampled."
    )
    loss: LossConfig = Field(
        default_factory=LossConfig, description="Distillation objective and positions."
    )
    train: TrainConfig = Field(
        default_factory=TrainConfig, description="Cycles, optimizer and schedule."
    )
    cache: CacheConfig = Field(
        default_factory=CacheConfig, description="On-disk cache of teacher targets."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    dpo: DpoConfig = Field(default_factory=DpoConfig, description="DPO settings (mode dpo).")
    runtime: RuntimeConfig = Field(
        default_factory=RuntimeConfig, description="Threads, timeouts and heartbeats."
    )

    @model_validator(mode="before")
    @classmethod
    def _one_way_to_name_environments(cls, data: Any):
        # Both given: the mixture is marked, not refused here, so its field reports it
        # (below) while every other field is still validated: one `validate` shows all.
        if isinstance(data, dict) and data.get("environments") is not None \
                and "environment" in data:
            data = {**data, "environments": {BOTH_ENVIRONMENT_FIELDS: data["environments"]}}
        return data

    @field_validator("environments", mode="before")
    @classmethod
    def _not_beside_environment(cls, mixture: Any):
        if isinstance(mixture, dict) and BOTH_ENVIRONMENT_FIELDS in mixture:
            raise_issues([((), (
                "environment and environments both name the run's tool environments; keep "
                "one: environment for one, environments (a list of {name, weight, ...}) for "
                "a mixture"))])
        return mixture

    # Cross-section rules are field validators on the later field, reading earlier
    # validated fields from ``info.data``: they still run when an unrelated section is
    # broken, so one `validate` shows every problem.

    @field_validator("teachers", mode="before")
    @classmethod
    def _teacher_names(cls, teachers: Any):
        # A name becomes a socket folder and a log file (common/names.py): checked first,
        # alone, so `../../../../s` is one line and nothing downstream reads it.
        if isinstance(teachers, dict):
            raise_issues([((), problem) for problem in (
                name_problem(name, "teacher") for name in teachers) if problem is not None])
        return teachers

    @field_validator("teacher")
    @classmethod
    def _teacher_needed(cls, teacher: TeacherConfig | None, info: ValidationInfo):
        run, teachers = info.data.get("run"), info.data.get("teachers")
        if "teachers" not in info.data:  # broken, and reported: its section is there
            return teacher
        if teacher is not None and teachers is not None:
            raise_issues([((), "teacher and teachers both name the run's teachers; keep one: "
                               "teacher for one, teachers (name -> section) for several")])
        if run is not None and (teacher or teachers) is not None and run.mode == "rl":
            raise_issues([((), "mode 'rl' trains on the task reward alone and asks no teacher; "
                               "remove the teacher section, or set run.mode: opd")])
        if run is not None and teacher is None and teachers is None \
                and run.mode in TEACHER_MODES:
            raise_issues([((), f"mode {run.mode!r} needs a teacher section (teacher: "
                               "{model: ...}); add one or set run.mode: sft",
                           ("/teachers", "/teacher"))])
        return teacher

    @field_validator("environments")
    @classmethod
    def _mixture_rules(cls, mixture: list[MixtureEnvironmentConfig] | None,
                       info: ValidationInfo):
        run, teacher = info.data.get("run"), info.data.get("teacher")
        teachers = info.data.get("teachers")
        # Routes read the teacher sections: while one is broken (reported at its own
        # field), its routes are not judged, so one mistake gives one error.
        sections_ok = "teacher" in info.data and "teachers" in info.data
        issues: list[tuple] = [
            (*issue, ("/teacher", "/teachers"))
            for issue in routing_issues(run, teacher, teachers, mixture)] if sections_ok else []
        if mixture is None:
            raise_issues(issues)
            return mixture
        total = sum(member.weight for member in mixture)
        if not total > 0.0:
            issues.append(((), (
                f"the weights sum to {total:g}, so no environment would be "
                "drawn; give at least one environment a weight above 0")))
        seen: set[str] = set()
        for i, member in enumerate(mixture):
            if member.name in seen:
                issues.append(((i, "name"), (
                    f"{member.name!r} is named twice; each episode is tagged "
                    "with its environment's name, so name each environment once (put its "
                    "difficulties in one entry with difficulty: mixed)")))
            seen.add(member.name)
        if run is not None and run.mode not in MIXTURE_MODES:
            issues.append(((), (
                f"a mixture mixes the fresh episodes of opd, rl, replay and dpo cycles and "
                f"sft's oracle traces; mode {run.mode!r} reads one environment's tasks; use "
                "environment: with one environment, or run.mode: opd")))
        if teacher is not None and not is_routed(teacher, teachers):  # else routing_issues
            for field, value, why in (
                ("mode", teacher.mode if teacher.mode != "standard" else None,
                 "views each task through one environment's privileged context"),
                ("min_success", teacher.min_success, "is gated on one environment's record"),
                ("min_recovery", teacher.min_recovery, "is gated on one environment's record"),
            ):
                if value is not None:
                    issues.append(((), (
                        f"a mixture cannot go with teacher.{field} {value!r}, which {why}; "
                        "remove it or use environment: with one environment")))
        raise_issues(issues)
        return mixture

    @field_validator("rollout")
    @classmethod
    def _fits_toy(cls, rollout: RolloutConfig, info: ValidationInfo):
        issues: list[tuple[tuple[str | int, ...], str]] = []
        roles = {"student": info.data.get("student"), "teacher": info.data.get("teacher"),
                 **{f"teachers.{name}": section
                    for name, section in (info.data.get("teachers") or {}).items()}}
        for role, placement in roles.items():
            toy = placement.model.toy if placement is not None else None
            if toy is not None and rollout.max_total_tokens > toy.max_positions:
                issues.append((("max_total_tokens",), f"max_total_tokens "
                               f"{rollout.max_total_tokens} exceeds {role}.model.toy."
                               f"max_positions {toy.max_positions}; lower it or raise "
                               "max_positions"))
        raise_issues(issues)
        return rollout

    @field_validator("rollout")
    @classmethod
    def _view_prepares_a_teacher(cls, rollout: RolloutConfig, info: ValidationInfo):
        run = info.data.get("run")
        if rollout.view is not None and run is not None and run.mode != "sft":
            raise_issues([(
                ("view",),
                f"rollout.view {rollout.view} shows the model each task's answer; it prepares a "
                f"privileged-context teacher by SFT (run.mode: sft), not a {run.mode} run; "
                "remove rollout.view (a student plays the plain view)",
            )])
        if rollout.view is not None and info.data.get("environments") is not None:
            raise_issues([(("view",), (
                f"rollout.view {rollout.view} prepares one privileged teacher of one "
                "environment, and this recipe names a mixture (environments:); prepare it "
                "with environment: and one environment"))])
        return rollout

    @field_validator("rollout")
    @classmethod
    def _engine_samples_the_student(cls, rollout: RolloutConfig, info: ValidationInfo):
        student = info.data.get("student")
        if rollout.engine != "vllm":
            raise_issues([((knob,), f"rollout.{knob} sets up the vllm engine; remove it or set "
                           "rollout.engine: vllm")
                          for knob in ("engine_memory", "engine_check")
                          if getattr(rollout, knob) is not None])
        elif student is not None:
            raise_issues(_vllm_student_issues(student))
        return rollout

    @field_validator("loss")
    @classmethod
    def _loss_reads_the_rollout(cls, loss: LossConfig, info: ValidationInfo):
        run, rollout = info.data.get("run"), info.data.get("rollout")
        if run is None or rollout is None:
            return loss
        issues = _task_reward_issues(loss, run.mode, rollout)
        if run.mode in SAMPLING_MODES:
            issues += _temperature_issues(loss, rollout, f"mode {run.mode}'s episodes")
        raise_issues(issues)
        return loss

    @field_validator("loss")
    @classmethod
    def _cross_tokenizer_loss(cls, loss: LossConfig, info: ValidationInfo):
        # Every teacher section: teacher:, or each of teachers: (several teachers).
        sections = ({f"teachers.{name}": t for name, t in info.data["teachers"].items()}
                    if info.data.get("teachers") else {"teacher": info.data.get("teacher")})
        other = [where for where, t in sections.items()
                 if t is not None and t.tokenizer == "other"]
        if loss.cross_vocab is not None and not other:
            raise_issues([(("cross_vocab",), f"loss.cross_vocab: {loss.cross_vocab} is the "
                           "target of a teacher with another tokenizer; set "
                           "teacher.tokenizer: other or drop loss.cross_vocab")])
        run = info.data.get("run")
        if not other or run is None:
            return loss
        if run.mode != "opd":
            raise_issues([((), f"{other[0]}.tokenizer: other trains by on-policy "
                                f"distillation (xvocab targets per fresh episode), not "
                                f"run.mode {run.mode!r}; set run.mode: opd or "
                                f"{other[0]}.tokenizer: same")])
        variants = [f"loss.{name}" for name in LOSS_VARIANT_FIELDS
                    if getattr(loss, name) is not None]
        drop = f", and drop {', '.join(variants)}" if variants else ""
        if loss.cross_vocab in ("hybrid", "uld"):
            if loss.estimator != "full" or loss.divergence != "forward_kl" or variants:
                raise_issues([(("cross_vocab",), f"loss.cross_vocab: {loss.cross_vocab} "
                               "trains on the teacher's top-k (the exact groups by forward "
                               f"KL, the rest by ULD), not loss.estimator {loss.estimator} / "
                               f"divergence {loss.divergence}: set estimator: full and "
                               f"divergence: forward_kl{drop}")])
            return loss
        if loss.estimator != "sampled_token" or loss.divergence != "reverse_kl" or variants:
            raise_issues([(("estimator",), f"{other[0]}.tokenizer: other trains with the group "
                           "sampled-token estimator (docs/cross-tokenizer.md): set "
                           "loss.estimator: sampled_token and divergence: reverse_kl"
                           + drop + ", or loss.cross_vocab: hybrid or uld")])
        return loss

    @field_validator("train")
    @classmethod
    def _student_set_temperature(cls, train: TrainConfig, info: ValidationInfo):
        run, rollout, loss = (info.data.get(k) for k in ("run", "rollout", "loss"))
        if run is None or rollout is None or loss is None or run.mode != "offline_kd":
            return train
        # Both offline_kd sets the student samples: the frozen one and GKD's fresh share.
        for field, value, where in (
            ("fixed_set", train.fixed_set == "student", "the fixed_set student episodes"),
            ("on_policy_fraction", bool(train.on_policy_fraction),
             "the fresh on_policy_fraction episodes"),
        ):
            if value:
                # The loss fields are named in full: the rule is reported at this field.
                raise_issues([((field,), f"{field} {getattr(train, field)}: {msg}")
                              for _, msg in _temperature_issues(loss, rollout, where)])
        return train

    @field_validator("train")
    @classmethod
    def _mode_rules(cls, train: TrainConfig, info: ValidationInfo):
        run = info.data.get("run")
        if run is None:
            return train
        issues: list[tuple[tuple[str | int, ...], str]] = []
        mode = run.mode
        if mode == "opd" and train.updates_per_batch != 1:
            issues.append(
                (
                    ("updates_per_batch",),
                    f"updates_per_batch {train.updates_per_batch} breaks "
                    "strict on-policy distillation (exactly one optimizer step per fresh rollout "
                    "batch); set updates_per_batch: 1, or run.mode: replay with max_lag >= 1",
                )
            )
        if mode == "replay" and train.max_lag < 1:
            issues.append(
                (
                    ("max_lag",),
                    f"max_lag {train.max_lag}: replay reuses older rollouts and needs "
                    "max_lag >= 1; raise it, or use run.mode: opd for strict on-policy",
                )
            )
        oldest = train.updates_per_batch - 1  # versions behind at a batch's last update
        if mode == "replay" and oldest > train.max_lag:
            issues.append(
                (
                    ("updates_per_batch",),
                    f"updates_per_batch {train.updates_per_batch} with max_lag "
                    f"{train.max_lag}: the last update of a batch would train on targets "
                    f"{oldest} versions old; raise max_lag to at least {oldest} or lower "
                    "updates_per_batch",
                )
            )
        if mode in ("opd", "sft", "offline_kd") and train.max_lag != 0:
            issues.append(
                (
                    ("max_lag",),
                    f"max_lag {train.max_lag} applies only to replay (mode {mode!r} "
                    "allows no lag); set max_lag: 0 or run.mode: replay",
                )
            )
        if train.trajectories is not None and mode != "offline_kd":
            issues.append(
                (
                    ("trajectories",),
                    f"trajectories is an offline_kd source (mode {mode!r}); "
                    "remove it or set run.mode: offline_kd",
                )
            )
        if train.fixed_set == "teacher" and mode not in ("offline_kd", "sft"):
            issues.append((("fixed_set",), (
                f"fixed_set 'teacher' is an offline_kd or sft (SeqKD) source (mode {mode!r}); "
                "remove it or set run.mode: offline_kd or sft")))
        elif train.fixed_set is not None and mode != "offline_kd" and train.fixed_set != "teacher":
            issues.append(
                (
                    ("fixed_set",),
                    f"fixed_set is an offline_kd source (mode {mode!r}); "
                    "remove it or set run.mode: offline_kd",
                )
            )
        teachers = info.data.get("teachers")
        if train.fixed_set == "teacher" and teachers:  # each teacher plays its environments
            for name, section in teachers.items():
                issues.extend(((field,), f"teachers.{name}: {text}") for (field,), text in
                              _teacher_set_issues(section, info.data.get("rollout")))
        elif train.fixed_set == "teacher" and "teacher" in info.data \
                and "teachers" in info.data:  # absent: reported
            issues.extend(_teacher_set_issues(info.data.get("teacher"), info.data.get("rollout")))
        if mode == "sft" and train.fixed_set != "teacher" \
                and is_routed(info.data.get("teacher"), teachers):
            issues.append((("fixed_set",), (
                "several teachers in mode sft play SeqKD's episodes, each its own "
                "environments'; set train.fixed_set: teacher, or run.mode: opd")))
        issues.extend(_mixing_issues(train, mode))
        issues.extend(_group_issues(train, mode, info.data.get("rollout")))
        if train.score_fixed_set == "drawn" and (mode != "offline_kd"
                                                 or train.fixed_set == "student"):
            issues.append((("score_fixed_set",), (
                f"score_fixed_set 'drawn' scores offline_kd's oracle, teacher or trajectories "
                f"set as it is drawn (mode {mode!r}, fixed_set {train.fixed_set!r}); the "
                "frozen student set is scored whole; remove it or set run.mode: offline_kd "
                "with another fixed_set")))
        env = info.data.get("environment")
        if train.oracle_tasks is not None and env is not None \
                and train.oracle_tasks > env.train_tasks:
            issues.append((("oracle_tasks",), (
                f"oracle_tasks {train.oracle_tasks} is more than the "
                f"{env.train_tasks} training tasks (environment.train_tasks); lower it to at "
                "most that, or null for all")))
        if info.data.get("environments") is not None:
            # Oracle traces of a mixture: drawn by weight, each in its own environment;
            # what reads one environment's tasks or view stays with environment:.
            # SeqKD's teacher set (fixed_set: teacher) is played per environment, each by
            # its own teacher (docs/several-teachers.md, "SeqKD from several teachers").
            for field, value, why in (
                ("oracle_tasks", train.oracle_tasks, "counts one environment's first tasks"),
                ("fixed_set", train.fixed_set if train.fixed_set != "teacher" else None,
                 "plays or reads one environment's set"),
            ):
                if value is not None:
                    issues.append(((field,), (
                        f"{field} {value!r} {why}, and this recipe names a mixture "
                        f"(environments:); drop {field}, or use environment: with one "
                        "environment")))
        if train.sft_epochs is not None and mode != "sft":
            issues.append(
                (
                    ("sft_epochs",),
                    f"sft_epochs applies only to mode sft (got {mode!r}); remove "
                    "it, or use sft_warmup_steps for SFT before distilling",
                )
            )
        # The replay rule reads max_lag too: a broken max_lag is dropped, not judged at 0.
        raise_issues(issues, {"updates_per_batch": ("max_lag",)} if mode == "replay" else None)
        return train

    @field_validator("rollout")
    @classmethod
    def _group_needs_fresh_episodes(cls, rollout: RolloutConfig, info: ValidationInfo):
        run = info.data.get("run")
        if rollout.group_size is not None and run is not None and run.mode not in GROUP_MODES:
            raise_issues([(
                ("group_size",),
                f"rollout.group_size {rollout.group_size} groups the fresh episodes of a cycle "
                f"by task; mode {run.mode!r} samples none (opd, replay and dpo do); remove it",
            )])
        return rollout

    @field_validator("dpo")
    @classmethod
    def _one_dpo_group_size(cls, dpo: DpoConfig, info: ValidationInfo):
        rollout, run = info.data.get("rollout"), info.data.get("run")
        size = rollout.group_size if rollout is not None else None
        if size is None or run is None or run.mode != "dpo":
            return dpo
        if "group_size" in dpo.model_fields_set and dpo.group_size != size:
            raise_issues([(("group_size",), (
                f"dpo.group_size {dpo.group_size} and rollout.group_size {size} both size "
                "dpo's groups; keep one of them"))])
        if size < 2:
            raise_issues([(("group_size",), (
                f"rollout.group_size {size}: dpo pairs a success and a failure of one task, "
                "so a group needs at least 2 episodes; raise it to 2 or more"))])
        return dpo

    # -- derived facts used by plans and manifests -------------------------------------

    @property
    def on_policy(self) -> bool:
        """True when every update trains only on rollouts of the current version."""
        return self.run.mode in ("opd", "rl")

    @property
    def needs_teacher(self) -> bool:
        return self.run.mode in TEACHER_MODES

    @property
    def fp32_head(self) -> bool:
        """``loss.fp32_head`` resolved: null is on for the modes that distil from a teacher."""
        return self.needs_teacher if self.loss.fp32_head is None else self.loss.fp32_head


# -- rules of the batch-side variants (train.fixed_set teacher, on_policy_fraction,
# rollout.group_size), read by Recipe._mode_rules ------------------------------------

# Modes whose cycles sample fresh episodes, so rollout.group_size can group them.
GROUP_MODES: frozenset[str] = frozenset({"opd", "replay", "dpo", "rl"})


def on_policy_episodes(n: int, fraction: float) -> int:
    """How many of a batch's ``n`` episodes ``train.on_policy_fraction`` samples fresh:
    ``floor(fraction * n + 1/2)`` (half rounds up, unlike Python's ``round``)."""
    return int(fraction * n + 0.5)


def _mixing_issues(train: TrainConfig, mode: str) -> list[tuple]:
    fraction = train.on_policy_fraction
    if fraction is None:
        return []
    if mode != "offline_kd":
        return [(("on_policy_fraction",), (
            f"on_policy_fraction {fraction:g} mixes fresh episodes into offline_kd's fixed-set "
            f"batches (mode {mode!r}); remove it or set run.mode: offline_kd"))]
    if train.fixed_set == "student":
        return [(("on_policy_fraction",), (
            f"on_policy_fraction {fraction:g} mixes fresh student episodes into a set that is "
            "already the student's own (fixed_set 'student'); mix with fixed_set oracle or "
            "teacher, or train.trajectories"))]
    n = train.rollouts_per_cycle
    fresh = on_policy_episodes(n, fraction)
    if fraction == 1.0:
        return [(("on_policy_fraction",), (
            "on_policy_fraction 1 leaves no room for the fixed set; that is strict on-policy "
            "distillation: set run.mode: opd and remove on_policy_fraction"))]
    if fraction > 0.0 and fresh in (0, n):
        return [(("on_policy_fraction",), (
            f"on_policy_fraction {fraction:g} of rollouts_per_cycle {n} rounds to {fresh} "
            f"fresh episodes, so a batch would not mix; raise rollouts_per_cycle or move the "
            "fraction away from 0 and 1"))]
    return []


def _group_issues(train: TrainConfig, mode: str, rollout: RolloutConfig | None) -> list[tuple]:
    size = rollout.group_size if rollout is not None else None
    if size is None or mode not in ("opd", "replay", "rl") or train.rollouts_per_cycle % size == 0:
        return []
    return [(("rollouts_per_cycle",), (
        f"rollouts_per_cycle {train.rollouts_per_cycle} is not a multiple of "
        f"rollout.group_size {size}: every task of a batch is played group_size times; make "
        "rollouts_per_cycle a multiple of it"))]


def _teacher_set_issues(teacher: TeacherConfig | None, rollout: RolloutConfig | None) -> list:
    """fixed_set teacher: the student process plays the episodes with teacher.model's
    weights, so they must be weights it can load as they are (mvl-score/1 has no
    generation message)."""
    if teacher is None:
        return [(("fixed_set",), (
            "fixed_set 'teacher' plays its episodes with the teacher's weights; add a teacher "
            "section (teacher: {model: ...})"))]
    blockers = {
        "prepare": (teacher.prepare, "names a preparation this process does not run; prepare "
                    "it first and give its directory as teacher.model.path"),
        "adapter": (teacher.adapter, "is merged only by the teacher server; merge it into the "
                    "weights and give that directory as teacher.model.path"),
        "mode": (teacher.mode if teacher.mode != "standard" else None, "shows the teacher a "
                 "view the student never sees; use a standard teacher"),
        "scorer": (teacher.scorer if teacher.scorer != "causal_lm" else None, "is not a model "
                   "that can play; use scorer: causal_lm"),
    }
    issues = [(("fixed_set",), f"fixed_set 'teacher' plays episodes with teacher.model's "
               f"weights, but teacher.{name} {value!r} {fix}")
              for name, (value, fix) in blockers.items() if value is not None]
    if rollout is not None and rollout.view is not None:
        issues.append((("fixed_set",), (
            f"fixed_set 'teacher' trains on the plain view, rollout.view {rollout.view} on "
            "the privileged one; remove one of them")))
    return issues


def _vllm_student_issues(student: StudentConfig) -> list[tuple]:
    """rollout.engine vllm loads the student's plain weights on the first CUDA device or
    the CPU: a quantized student or another CUDA device cannot be sampled there."""
    issues: list[tuple] = []
    if student.quantization != "none":
        issues.append((("engine",), (
            f"rollout.engine vllm loads the student's weights into vLLM, which does not "
            f"take a {student.quantization} student's LoRA merge; set rollout.engine: hf "
            "or student.quantization: none")))
    if student.device.startswith("cuda:") and student.device != "cuda:0":
        issues.append((("engine",), (
            f"rollout.engine vllm runs on the first CUDA device or the CPU, not "
            f"student.device {student.device}; set student.device: cuda (or cpu), or "
            "rollout.engine: hf")))
    return issues


# -- helpers --------------------------------------------------------------------------


def check_vocab(recipe: Recipe, vocab_size: int) -> None:
    """Check rules that need the tokenizer's vocabulary size; raise ConfigError."""
    loss = recipe.loss
    if loss.objective == "exact_full_vocab" and vocab_size > loss.exact_max_vocab:
        raise ConfigError(
            f"loss.objective: exact_full_vocab sends {vocab_size} log-probs per position but "
            f"loss.exact_max_vocab is {loss.exact_max_vocab}; use objective: bucketed_topk_tail "
            "or raise exact_max_vocab"
        )
    if loss.objective == "bucketed_topk_tail" and loss.top_k > vocab_size:
        raise ConfigError(
            f"loss.top_k: {loss.top_k} exceeds the vocabulary size {vocab_size}; lower top_k"
        )


def recipe_dict(recipe: Recipe) -> dict[str, Any]:
    """The fully resolved recipe as JSON-compatible data (defaults filled in); a mixture's
    has no ``environment`` section (a recipe names one or the other)."""
    data = recipe.model_dump(mode="json")
    if recipe.environments is not None:
        del data["environment"]
    return data


# Optional fields added after recipes were cached and checkpointed: left out of the
# digest while unset, so a recipe that does not use them keeps its digest (its prepared
# teacher stays cached, its checkpoints still resume).
HASHED_ONLY_WHEN_SET = (
    "train.fixed_set", "teacher.min_recovery",
    "student.model.toy.init_std", "student.model.toy.rope_theta",
    "teacher.model.toy.init_std", "teacher.model.toy.rope_theta",
    "runtime.warmup_cpu_threads", "rollout.view",
    *(f"loss.{name}" for name in LOSS_VARIANT_FIELDS),
    "train.on_policy_fraction", "rollout.group_size", "eval.samples", "eval.temperature",
    "train.oracle_tasks", "train.score_fixed_set", "eval.before", "teacher.tokenizer",
    "loss.cross_vocab", "environments", "teachers", "teacher.adapters",
    "loss.fp32_head", "train.micro_batch_tokens", "train.gradient_checkpointing",
    "rollout.engine", "rollout.engine_memory", "rollout.engine_check",
)


def recipe_digest(recipe: Recipe, leave_out: tuple[str, ...] = ()) -> str:
    """``sha256:<hex>`` of the canonical resolved JSON; equal recipes give equal digests.

    ``leave_out`` names dotted fields dropped before hashing (``"run.loggers"``), so a
    digest that ignores them equals one taken before those fields existed; the fields of
    ``HASHED_ONLY_WHEN_SET`` are dropped while they are null.
    """
    data = recipe_dict(recipe)
    for member in data.get("environments") or ():  # routes: added after mixtures were hashed
        for leaf in ("teacher", "adapter"):
            if member.get(leaf) is None:
                member.pop(leaf, None)
    for dotted in (*leave_out, *HASHED_ONLY_WHEN_SET):
        *parents, leaf = dotted.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or (dotted not in leave_out and node.get(leaf) is not None):
            continue
        node.pop(leaf, None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def dump_resolved(recipe: Recipe) -> str:
    """The resolved recipe as YAML (what ``recipe.resolved.yaml`` holds)."""
    header = f"# resolved recipe, {recipe_digest(recipe)}\n"
    return header + yaml.safe_dump(recipe_dict(recipe), sort_keys=False, allow_unicode=True)


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema of the recipe (``miniverl schema recipe``)."""
    return Recipe.model_json_schema()


def dotted_items(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted-key view of a nested mapping (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``);
    lists and empty mappings are leaves. Trackers, the comparison report and the verl
    bridge all read recipes and configs this way."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(dotted_items(value, path + "."))
        else:
            out[path] = value
    return out


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):  # an empty mapping contributes no paths
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def diff_recipes(a: Recipe, b: Recipe) -> list[str]:
    """Dotted paths of the fields whose resolved values differ, sorted."""
    flat_a: dict[str, Any] = {}
    flat_b: dict[str, Any] = {}
    _flatten(recipe_dict(a), "", flat_a)
    _flatten(recipe_dict(b), "", flat_b)
    missing = object()
    keys = set(flat_a) | set(flat_b)
    return sorted(k for k in keys if flat_a.get(k, missing) != flat_b.get(k, missing))


def load_recipe(path: str | Path) -> Recipe:
    """Parse and validate a recipe file; ConfigError lists every error with its location.

    The paths the recipe reads (model directories, adapters) are made absolute against
    the recipe's own folder, as ``prepare:`` always was (common/recipe_paths.py)."""
    return anchor_paths(load_yaml_model(path, Recipe), Path(path).resolve().parent)


def loads_recipe(text: str, source: str = "<string>") -> Recipe:
    """Like :func:`load_recipe` for YAML text; ``source`` names it in messages."""
    return loads_yaml_model(text, source, Recipe)
