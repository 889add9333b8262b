"""The import whitelist: one handler per verl field that miniverl understands.

Each handler reads one verl value, writes what it means into the recipe dict and
records a :class:`Finding` labelled ``exact``, ``derived``, ``informational`` or
``unsupported`` (see :mod:`miniverl.bridge.importer` for the labels and for what
happens to fields that are not listed here).

This module maps single values; it does not walk configs, refuse unknown fields,
validate the recipe or write files (:mod:`miniverl.bridge.importer` does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from miniverl.bridge.import_paths import Refused, Trusted, check_location
from miniverl.bridge.profile import PROFILE, VERL_LOGGERS, set_dotted

QWEN3_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Finding:
    field: str
    label: str  # exact | derived | informational | unsupported | refused
    value: object
    target: str | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return {
            "field": self.field,
            "label": self.label,
            "value": self.value,
            "target": self.target,
            "note": self.note,
        }


@dataclass
class ImportResult:
    recipe: dict
    findings: list[Finding] = field(default_factory=list)
    # Local model directories must lie under this folder (the verl config's own).
    base_dir: Path = field(default_factory=Path.cwd)
    # Values kept between fields (lengths, batch sizes) for rules that need two of them.
    seen: dict = field(default_factory=dict)
    # A miniverl bundle's provenance (import_bundle.BundleFacts) when importing one.
    bundle: object | None = None

    def add(
        self, key: str, label: str, value: object, target: str | None = None, note: str = ""
    ) -> None:
        """Record one field's finding."""
        self.findings.append(Finding(key, label, value, target, note))

    @property
    def refused(self) -> list[Finding]:
        return [f for f in self.findings if f.label in ("unsupported", "refused")]

    def report(self, source_name: str) -> dict:
        return {
            "profile": PROFILE,
            "source": source_name,
            "ok": not self.refused,
            "fields": [f.to_dict() for f in self.findings],
            "counts": {
                label: sum(1 for f in self.findings if f.label == label)
                for label in ("exact", "derived", "informational", "unsupported", "refused")
            },
        }


def exact(target: str, kind: type | tuple, note: str = "", check=None):
    def handler(key, value, result, *_):
        if (
            isinstance(value, bool)
            and kind is not bool
            or not isinstance(value, kind)
            or (check and not check(value))
        ):
            result.add(key, "unsupported", value, target, f"expected {note or kind}")
            return
        set_dotted(result.recipe, target, value)
        result.add(key, "exact", value, target, note)

    return handler


def _info(note: str):
    def handler(key, value, result, *_):
        result.add(key, "informational", value, None, note)

    return handler


def required_value(expected: object, note: str):
    def handler(key, value, result, *_):
        label = "exact" if value == expected else "unsupported"
        why = note if label == "exact" else f"only {expected!r} is supported: {note}"
        result.add(key, label, value, None, why)

    return handler


def _length(name: str, target: str):
    def handler(key, value, result, lora, seen, *_):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            result.add(key, "unsupported", value, target, "expected a positive integer")
            return
        seen[name] = value
        if target:
            set_dotted(result.recipe, target, value)
            result.add(
                key,
                "derived",
                value,
                target,
                "verl's whole-response budget becomes the per-turn cap",
            )
        else:
            result.add(key, "derived", value, None, "counts towards rollout.max_total_tokens")

    return handler


def _model(section: str):
    def handler(key, value, result, lora, seen, revision, teacher_revision):
        student = section == "student"
        verdict = check_location(
            value,
            key=key,
            base_dir=result.base_dir,
            revision=revision if student else teacher_revision,
            revision_flag="--revision" if student else "--teacher-revision",
        )
        if isinstance(verdict, Trusted):
            result.recipe[section]["model"] = verdict.source
        result.add(key, verdict.label, value, f"{section}.model", verdict.note)

    return handler


def _lora_adapter_path(key, value, result, *_):
    if value is None:
        result.add(key, "informational", value, None, "no starting adapter, as in miniverl")
        return
    # Checked first so a URL or an escape is named as such in the report.
    verdict = check_location(
        value, key=key, base_dir=result.base_dir, revision=None, revision_flag="--revision"
    )
    note = verdict.note if isinstance(verdict, Refused) else (
        "miniverl starts the student's LoRA from scratch; remove the field, or merge the "
        "adapter into a local model directory and name that as the model path"
    )
    label = verdict.label if isinstance(verdict, Refused) else "unsupported"
    result.add(key, label, value, None, note)


def _lora_rank(key, value, result, lora, *_):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        result.add(key, "unsupported", value, "student.lora.r", "expected an integer >= 0")
    elif value == 0:
        result.recipe["student"]["lora"] = None
        result.add(key, "exact", value, "student.lora", "0 = full fine-tune (lora: null)")
    else:
        lora["r"] = value
        result.add(key, "exact", value, "student.lora.r")


def _lora_alpha(key, value, result, lora, *_):
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        result.add(key, "unsupported", value, "student.lora.alpha", "expected a positive number")
    else:
        lora["alpha"] = value
        result.add(key, "exact", value, "student.lora.alpha")


def _target_modules(key, value, result, lora, *_):
    if value == "all-linear":
        lora["target_modules"] = list(QWEN3_LINEAR)
        result.add(
            key,
            "derived",
            value,
            "student.lora.target_modules",
            "all-linear expanded to the Qwen3 attention and MLP projections",
        )
    elif isinstance(value, list) and value and all(isinstance(m, str) for m in value):
        lora["target_modules"] = list(value)
        result.add(key, "exact", value, "student.lora.target_modules")
    else:
        result.add(
            key,
            "unsupported",
            value,
            "student.lora.target_modules",
            "expected 'all-linear' or a list of module names",
        )


def _freq(target: str):
    def handler(key, value, result, *_):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            set_dotted(result.recipe, target, value)
            result.add(key, "exact", value, target)
        elif value in (-1, 0, None):
            result.add(
                key, "informational", value, target, "disabled in verl; miniverl keeps its default"
            )
        else:
            result.add(key, "unsupported", value, target, "expected a positive integer or -1")

    return handler


def _experiment_name(key, value, result, *_):
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(value)).strip("-") or "imported-from-verl"
    result.recipe["run"]["name"] = name
    label = "exact" if name == value else "derived"
    result.add(
        key,
        label,
        value,
        "run.name",
        "" if label == "exact" else "characters outside [A-Za-z0-9_.-] replaced",
    )


def _loggers(key, value, result, *_):
    """verl's trainer.logger -> run.loggers: the trackers both know; console is jsonl."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        result.add(key, "unsupported", value, "run.loggers", "expected a list of logger names")
        return
    back = {verl: ours for ours, verl in VERL_LOGGERS.items()}
    kept = [back[n] for n in names if n in back]
    dropped = [n for n in names if n not in back]
    result.recipe["run"]["loggers"] = list(dict.fromkeys(["jsonl", *kept]))
    note = "console = miniverl's metrics.jsonl and events.jsonl (always on)"
    if dropped:
        note += f"; no miniverl tracker for {', '.join(dropped)}: not carried"
    result.add(key, "derived" if dropped else "exact", value, "run.loggers", note)


def _distillation_enabled(key, value, result, *_):
    if value is True:
        result.add(
            key, "derived", value, "run.mode", "distillation on the student's own rollouts = opd"
        )
    else:
        result.add(
            key, "unsupported", value, "run.mode", "only on-policy distillation configs import"
        )


_LOSS_MODES = {
    "forward_kl_topk": ("forward_kl", None, "top-k forward KL; miniverl adds the tail bucket"),
    "k1": ("reverse_kl", "sampled_token", "single-sample reverse-KL estimator"),
    "kl": ("reverse_kl", "sampled_token", "single-sample reverse-KL estimator"),
    "k3": ("reverse_kl", "sampled_token", "low-variance single-sample reverse-KL estimator"),
    "low_var_kl": (
        "reverse_kl",
        "sampled_token",
        "low-variance single-sample reverse-KL estimator",
    ),
}


def _loss_mode(key, value, result, *_):
    if value not in _LOSS_MODES:
        result.add(
            key, "unsupported", value, "loss.divergence", f"supported: {sorted(_LOSS_MODES)}"
        )
        return
    divergence, estimator, note = _LOSS_MODES[value]
    result.recipe["loss"]["divergence"] = divergence
    if estimator:
        result.recipe["loss"]["estimator"] = estimator
    result.add(key, "derived", value, "loss.divergence", note)


def _null_only(key, value, result, *_):
    if value is None:
        result.add(key, "exact", value, None, "no clamp, as in miniverl")
    else:
        result.add(key, "unsupported", value, None, "miniverl does not clamp the distillation loss")


HANDLERS = {
    "data.train_files": _info(
        "verl Parquet files are not read; tasks come from the recipe's environment"
    ),
    "data.val_files": _info(
        "verl Parquet files are not read; tasks come from the recipe's environment"
    ),
    "data.prompt_key": required_value("prompt", "miniverl rows keep chat messages under 'prompt'"),
    "data.max_prompt_length": _length("max_prompt_length", ""),
    "data.max_response_length": _length("max_response_length", "rollout.max_new_tokens_per_turn"),
    "data.seed": exact("run.seed", int, "an integer seed"),
    "actor_rollout_ref.model.path": _model("student"),
    "actor_rollout_ref.model.lora_adapter_path": _lora_adapter_path,
    "actor_rollout_ref.model.enable_gradient_checkpointing": _info(
        "memory knob; miniverl decides per device"
    ),
    "actor_rollout_ref.model.lora_rank": _lora_rank,
    "actor_rollout_ref.model.lora_alpha": _lora_alpha,
    "actor_rollout_ref.model.target_modules": _target_modules,
    "actor_rollout_ref.actor.optim.lr": exact(
        "train.lr", (int, float), "a positive learning rate", lambda v: v > 0
    ),
    "trainer.save_freq": _freq("train.save_every"),
    "trainer.test_freq": _freq("train.eval_every"),
    "trainer.project_name": _info(
        "experiment-tracker project; miniverl's trackers use project miniverl (docs/tracking.md)"
    ),
    "trainer.logger": _loggers,
    "trainer.experiment_name": _experiment_name,
    "trainer.total_epochs": _info(
        "miniverl counts cycles of fresh rollouts, not passes over a fixed dataset"
    ),
    "distillation.enabled": _distillation_enabled,
    "distillation.distillation_loss.topk": exact(
        "loss.top_k", int, "a positive integer", lambda v: v >= 1
    ),
    "distillation.distillation_loss.loss_mode": _loss_mode,
    "distillation.distillation_loss.use_policy_gradient": required_value(
        False, "the divergence is backpropagated directly"
    ),
    "distillation.distillation_loss.use_task_rewards": required_value(
        False, "miniverl OPD uses no task reward"
    ),
    "distillation.distillation_loss.distillation_loss_coef": required_value(
        1.0, "the loss is the divergence alone"
    ),
    "distillation.distillation_loss.loss_max_clamp": _null_only,
    "distillation.distillation_loss.log_prob_min_clamp": _null_only,
    "distillation.teacher_models.teacher_model.model_path": _model("teacher"),
}

WHITELIST = tuple(HANDLERS)
