"""Fail-closed import of a verl config into a miniverl recipe (Level 2).

Only a whitelist of fields is understood. Each one is labelled in ``import-report.json``:

- ``exact``: same meaning, value copied;
- ``derived``: computed by a documented rule (the report says which);
- ``informational``: recorded, changes nothing (verl bookkeeping with no miniverl twin);
- ``unsupported``: a known field whose value miniverl cannot honour — the import fails.

Everything else fails too, one line per field: critic, PPO/GRPO estimators, Ray
resources, FSDP/Megatron placement, vLLM/SGLang placement, async rollout, any ``${...}``
interpolation (the value would depend on code outside the file) and unknown fields. A
partial import that silently dropped the critic would train a different algorithm
under the same name; refusing is the point.

This module maps values; it does not read verl's defaults, run Hydra or contact a hub.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from miniverl.bridge.hashing import write_json
from miniverl.bridge.profile import PROFILE, flatten
from miniverl.common.errors import ConfigError

QWEN3_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_INTERP = re.compile(r"\$\{")

# (pattern on the dotted key, family) — checked after the whitelist, first match wins.
REFUSED_FAMILIES: list[tuple[str, str]] = [
    (r"^critic(\.|$)", "critic: miniverl trains no value model"),
    (r"^reward\.reward_model(\.|$)", "critic: a learned reward model is not supported"),
    (
        r"^algorithm(\.|$)",
        "PPO/GRPO estimator: miniverl has no advantage estimator or KL-in-reward",
    ),
    (
        r"^actor_rollout_ref\.(actor|ref)\.(ppo_|clip_ratio|entropy_|use_kl_loss|kl_loss|loss_agg_mode|policy_loss|use_dynamic_bsz)",
        "PPO/GRPO estimator: PPO actor-loss settings",
    ),
    (
        r"^(ray_init|ray_kwargs|global_profiler)(\.|$)",
        "Ray resources: miniverl runs one process per role, no Ray",
    ),
    (
        r"^(trainer\.(nnodes|n_gpus_per_node|device|resource_pool)|.*\.(nnodes|n_gpus_per_node|num_replicas)$)",
        "Ray resources: node/GPU counts",
    ),
    (
        r"(^|\.)(fsdp_config|megatron|strategy|ulysses_sequence_parallel_size|model_engine|fsdp_size)(\.|$)",
        "FSDP/Megatron placement: miniverl trains on one device",
    ),
    (
        r"^actor_rollout_ref\.rollout\.(mode|agent|multi_turn|async|update_weights_bucket)",
        "async rollout: miniverl rolls out in the training process",
    ),
    (
        r"^(async_training|rollout)(\.|$)",
        "async rollout: fully-async and standalone rollout are not supported",
    ),
    (
        r"^actor_rollout_ref\.rollout(\.|$)",
        "vLLM/SGLang placement: miniverl generates with the student model itself",
    ),
    (
        r"^distillation\.teacher_models\.[^.]+\.inference(\.|$)",
        "vLLM/SGLang placement: teacher inference engine",
    ),
    (
        r"^(defaults|hydra)(\.|$)",
        "interpolation: Hydra composition (defaults/hydra) pulls values from outside the file",
    ),
]


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


# ------------------------------------------------------------------------- mapping


def _model_source(value: object, revision: str | None, key: str) -> tuple[dict | None, str, str]:
    """``(ModelSource dict | None, label, note)`` for a verl model path."""
    if not isinstance(value, str) or not value:
        return None, "unsupported", f"{key} must be a non-empty string"
    if value.startswith(("/", "~", ".")) or "\\" in value:
        return {"path": value}, "exact", "local model directory"
    if value.count("/") == 1:
        if revision is None or not _HEX40.match(revision):
            return (
                None,
                "unsupported",
                (
                    f"hub id {value!r} needs a pinned 40-hex revision; pass --revision "
                    "(--teacher-revision for the teacher) with the commit to use"
                ),
            )
        return (
            {"hub_id": value, "revision": revision},
            "derived",
            "hub id pinned with the given revision",
        )
    return {"path": value}, "exact", "local model directory"


def _map(flat: dict, revision: str | None, teacher_revision: str | None) -> ImportResult:
    recipe: dict = {
        "schema_version": 1,
        "run": {"name": "imported-from-verl", "mode": "opd"},
        "student": {},
        "teacher": {},
        "loss": {"objective": "bucketed_topk_tail", "divergence": "forward_kl"},
        "train": {},
        "rollout": {},
    }
    result = ImportResult(recipe)
    add = result.findings.append
    lora: dict = {}
    seen_lengths: dict[str, int] = {}

    for key, value in flat.items():
        if isinstance(value, str) and _INTERP.search(value):
            add(
                Finding(
                    key,
                    "refused",
                    value,
                    note="interpolation: ${...} resolves outside the file; write the value",
                )
            )
            continue
        handler = _WHITELIST.get(key)
        if handler is None:
            family = next(
                (why for pattern, why in REFUSED_FAMILIES if re.search(pattern, key)), None
            )
            add(
                Finding(
                    key,
                    "refused",
                    value,
                    note=family or "unknown field: not in the import whitelist",
                )
            )
            continue
        handler(key, value, result, lora, seen_lengths, revision, teacher_revision)

    if lora:
        recipe["student"]["lora"] = lora
    if "max_prompt_length" in seen_lengths and "max_response_length" in seen_lengths:
        total = seen_lengths["max_prompt_length"] + seen_lengths["max_response_length"]
        recipe["rollout"]["max_total_tokens"] = total
        add(
            Finding(
                "data.max_prompt_length+data.max_response_length",
                "derived",
                total,
                "rollout.max_total_tokens",
                "sum: verl bounds prompt and response separately, miniverl bounds the whole episode",
            )
        )
    for section in ("student", "teacher"):
        if "model" not in recipe[section] and not any(
            f.target == f"{section}.model" for f in result.findings
        ):
            src = (
                "actor_rollout_ref.model.path"
                if section == "student"
                else "distillation.teacher_models.teacher_model.model_path"
            )
            add(
                Finding(
                    src,
                    "unsupported",
                    None,
                    f"{section}.model",
                    f"required: set {src} to the {section} model",
                )
            )
    return result


def _set(recipe: dict, dotted: str, value: object) -> None:
    node = recipe
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def _exact(target: str, kind: type | tuple, note: str = "", check=None):
    def handler(key, value, result, *_):
        if (
            isinstance(value, bool)
            and kind is not bool
            or not isinstance(value, kind)
            or (check and not check(value))
        ):
            result.findings.append(
                Finding(key, "unsupported", value, target, f"expected {note or kind}")
            )
            return
        _set(result.recipe, target, value)
        result.findings.append(Finding(key, "exact", value, target, note))

    return handler


def _info(note: str):
    def handler(key, value, result, *_):
        result.findings.append(Finding(key, "informational", value, None, note))

    return handler


def _required_value(expected: object, note: str):
    def handler(key, value, result, *_):
        label = "exact" if value == expected else "unsupported"
        why = note if label == "exact" else f"only {expected!r} is supported: {note}"
        result.findings.append(Finding(key, label, value, None, why))

    return handler


def _length(name: str, target: str):
    def handler(key, value, result, lora, seen, *_):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            result.findings.append(
                Finding(key, "unsupported", value, target, "expected a positive integer")
            )
            return
        seen[name] = value
        if target:
            _set(result.recipe, target, value)
            result.findings.append(
                Finding(
                    key,
                    "derived",
                    value,
                    target,
                    "verl's whole-response budget becomes the per-turn cap",
                )
            )
        else:
            result.findings.append(
                Finding(key, "derived", value, None, "counts towards rollout.max_total_tokens")
            )

    return handler


def _model(section: str):
    def handler(key, value, result, lora, seen, revision, teacher_revision):
        rev = revision if section == "student" else teacher_revision
        source, label, note = _model_source(value, rev, key)
        if source is not None:
            result.recipe[section]["model"] = source
        result.findings.append(Finding(key, label, value, f"{section}.model", note))

    return handler


def _lora_rank(key, value, result, lora, *_):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        result.findings.append(
            Finding(key, "unsupported", value, "student.lora.r", "expected an integer >= 0")
        )
    elif value == 0:
        result.recipe["student"]["lora"] = None
        result.findings.append(
            Finding(key, "exact", value, "student.lora", "0 = full fine-tune (lora: null)")
        )
    else:
        lora["r"] = value
        result.findings.append(Finding(key, "exact", value, "student.lora.r"))


def _lora_alpha(key, value, result, lora, *_):
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        result.findings.append(
            Finding(key, "unsupported", value, "student.lora.alpha", "expected a positive number")
        )
    else:
        lora["alpha"] = value
        result.findings.append(Finding(key, "exact", value, "student.lora.alpha"))


def _target_modules(key, value, result, lora, *_):
    if value == "all-linear":
        lora["target_modules"] = list(QWEN3_LINEAR)
        result.findings.append(
            Finding(
                key,
                "derived",
                value,
                "student.lora.target_modules",
                "all-linear expanded to the Qwen3 attention and MLP projections",
            )
        )
    elif isinstance(value, list) and value and all(isinstance(m, str) for m in value):
        lora["target_modules"] = list(value)
        result.findings.append(Finding(key, "exact", value, "student.lora.target_modules"))
    else:
        result.findings.append(
            Finding(
                key,
                "unsupported",
                value,
                "student.lora.target_modules",
                "expected 'all-linear' or a list of module names",
            )
        )


def _freq(target: str):
    def handler(key, value, result, *_):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            _set(result.recipe, target, value)
            result.findings.append(Finding(key, "exact", value, target))
        elif value in (-1, 0, None):
            result.findings.append(
                Finding(
                    key,
                    "informational",
                    value,
                    target,
                    "disabled in verl; miniverl keeps its default",
                )
            )
        else:
            result.findings.append(
                Finding(key, "unsupported", value, target, "expected a positive integer or -1")
            )

    return handler


def _experiment_name(key, value, result, *_):
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(value)).strip("-") or "imported-from-verl"
    result.recipe["run"]["name"] = name
    label = "exact" if name == value else "derived"
    result.findings.append(
        Finding(
            key,
            label,
            value,
            "run.name",
            "" if label == "exact" else "characters outside [A-Za-z0-9_.-] replaced",
        )
    )


def _distillation_enabled(key, value, result, *_):
    if value is True:
        result.findings.append(
            Finding(
                key,
                "derived",
                value,
                "run.mode",
                "distillation on the student's own rollouts = opd",
            )
        )
    else:
        result.findings.append(
            Finding(
                key, "unsupported", value, "run.mode", "only on-policy distillation configs import"
            )
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
        result.findings.append(
            Finding(
                key, "unsupported", value, "loss.divergence", f"supported: {sorted(_LOSS_MODES)}"
            )
        )
        return
    divergence, estimator, note = _LOSS_MODES[value]
    result.recipe["loss"]["divergence"] = divergence
    if estimator:
        result.recipe["loss"]["estimator"] = estimator
    result.findings.append(Finding(key, "derived", value, "loss.divergence", note))


def _null_only(key, value, result, *_):
    if value is None:
        result.findings.append(Finding(key, "exact", value, None, "no clamp, as in miniverl"))
    else:
        result.findings.append(
            Finding(
                key, "unsupported", value, None, "miniverl does not clamp the distillation loss"
            )
        )


_WHITELIST = {
    "data.train_files": _info(
        "verl Parquet files are not read; tasks come from the recipe's environment"
    ),
    "data.val_files": _info(
        "verl Parquet files are not read; tasks come from the recipe's environment"
    ),
    "data.prompt_key": _required_value("prompt", "miniverl rows keep chat messages under 'prompt'"),
    "data.max_prompt_length": _length("max_prompt_length", ""),
    "data.max_response_length": _length("max_response_length", "rollout.max_new_tokens_per_turn"),
    "data.seed": _exact("run.seed", int, "an integer seed"),
    "actor_rollout_ref.model.path": _model("student"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": _info(
        "memory knob; miniverl decides per device"
    ),
    "actor_rollout_ref.model.lora_rank": _lora_rank,
    "actor_rollout_ref.model.lora_alpha": _lora_alpha,
    "actor_rollout_ref.model.target_modules": _target_modules,
    "actor_rollout_ref.actor.optim.lr": _exact(
        "train.lr", (int, float), "a positive learning rate", lambda v: v > 0
    ),
    "trainer.save_freq": _freq("train.save_every"),
    "trainer.test_freq": _freq("train.eval_every"),
    "trainer.project_name": _info("experiment-tracker project; miniverl has no tracker"),
    "trainer.experiment_name": _experiment_name,
    "trainer.total_epochs": _info(
        "miniverl counts cycles of fresh rollouts, not passes over a fixed dataset"
    ),
    "distillation.enabled": _distillation_enabled,
    "distillation.distillation_loss.topk": _exact(
        "loss.top_k", int, "a positive integer", lambda v: v >= 1
    ),
    "distillation.distillation_loss.loss_mode": _loss_mode,
    "distillation.distillation_loss.use_policy_gradient": _required_value(
        False, "the divergence is backpropagated directly"
    ),
    "distillation.distillation_loss.use_task_rewards": _required_value(
        False, "miniverl OPD uses no task reward"
    ),
    "distillation.distillation_loss.distillation_loss_coef": _required_value(
        1.0, "the loss is the divergence alone"
    ),
    "distillation.distillation_loss.loss_max_clamp": _null_only,
    "distillation.distillation_loss.log_prob_min_clamp": _null_only,
    "distillation.teacher_models.teacher_model.model_path": _model("teacher"),
}

WHITELIST = tuple(_WHITELIST)


# -------------------------------------------------------------------------- driver


def import_config(
    config: dict, *, revision: str | None = None, teacher_revision: str | None = None
) -> ImportResult:
    """Map a parsed verl config (nested or dotted keys) to a recipe dict plus findings."""
    if not isinstance(config, dict):
        raise ConfigError("a verl config must be a YAML mapping at the top level")
    return _map(flatten(config), revision, teacher_revision)


def _validate(recipe: dict) -> list[str]:
    """Errors from common/recipe.py's schema (empty when it is valid)."""
    try:
        from miniverl.common.recipe import Recipe
    except ImportError:  # the schema module is optional for this step only while it is absent
        return []
    from pydantic import ValidationError

    try:
        Recipe.model_validate(recipe)
    except ValidationError as exc:
        return [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    return []


def import_verl(
    config_path: Path,
    out_path: Path,
    *,
    revision: str | None = None,
    teacher_revision: str | None = None,
) -> tuple[dict, Path]:
    """Write ``out_path`` (recipe) and ``import-report.json`` beside it; raise on refusal.

    The report is written in both cases, so a refused import still explains itself.
    """
    config_path, out_path = Path(config_path), Path(out_path)
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read verl config {config_path}: {exc}") from exc
    result = import_config(config or {}, revision=revision, teacher_revision=teacher_revision)
    report = result.report(config_path.name)
    errors = [] if result.refused else _validate(result.recipe)
    report["recipe_errors"] = errors
    report["ok"] = report["ok"] and not errors
    out_path.parent.mkdir(parents=True, exist_ok=True)
    report_path = out_path.parent / "import-report.json"
    write_json(report_path, report)
    if result.refused or errors:
        lines = [f"{f.field}: {f.note}" for f in result.refused] + [f"recipe: {e}" for e in errors]
        raise ConfigError(
            f"verl config {config_path.name} does not import ({len(lines)} problem(s); "
            f"see {report_path.name}):\n" + "\n".join(lines)
        )
    header = (
        f"# Imported from {config_path.name} by `miniverl import-verl` (profile {PROFILE}).\n"
        f"# Every field's mapping is in import-report.json. Run: miniverl train {out_path.name}\n"
    )
    out_path.write_text(header + yaml.safe_dump(result.recipe, sort_keys=False), encoding="utf-8")
    return report, report_path
