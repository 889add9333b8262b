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
under the same name; refusing is the point. Model and adapter locations are trusted
only as a directory inside the config's folder or a pinned hub id
(:mod:`miniverl.bridge.import_paths`); a URL or a ``..`` escape is refused per field.
miniverl's own bundle (``export-verl``) imports too: :mod:`miniverl.bridge.import_bundle`
adds the fields its exporter writes and the provenance verl has no field for.

This module maps values; it does not read verl's defaults, run Hydra or contact a hub.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import yaml
from pydantic import ValidationError

from miniverl.bridge import import_bundle
from miniverl.bridge.import_bundle import BundleFacts
from miniverl.bridge.import_fields import HANDLERS, ImportResult
from miniverl.bridge.profile import PROFILE, flatten
from miniverl.common.atomic import atomic_write_json, atomic_write_text
from miniverl.common.errors import ConfigError
from miniverl.common.recipe import Recipe

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


# ------------------------------------------------------------------------- mapping


def _map(
    flat: dict,
    revision: str | None,
    teacher_revision: str | None,
    base_dir: Path,
    bundle: BundleFacts | None = None,
) -> ImportResult:
    recipe: dict = {
        "schema_version": 1,
        "run": {"name": "imported-from-verl", "mode": "opd"},
        "student": {},
        "teacher": {},
        "loss": {"objective": "bucketed_topk_tail", "divergence": "forward_kl"},
        "train": {},
        "rollout": {},
    }
    result = ImportResult(recipe, base_dir=base_dir, bundle=bundle)
    handlers = HANDLERS if bundle is None else {**HANDLERS, **import_bundle.handlers(bundle)}
    lora: dict = {}
    seen_lengths = result.seen

    routing = _routing_keys(flat) if bundle is None else []
    if routing:
        # One mistake, one line: the routing is refused whole, not field by field.
        entries = sorted({k.split(".")[2] for k in routing if k.count(".") >= 3})
        named = ", ".join(entries)
        result.add("distillation.teacher_models", "refused",
                   {k: flat[k] for k in routing}, None,
                   f"this config names teacher entries {named}, not verl's one "
                   "teacher_model; a verl config of several teachers imports only as a "
                   "bundle export-verl wrote (its manifest names each route's environments); "
                   "write a recipe with teachers: and environments: instead "
                   "(docs/several-teachers.md)")
    for key, value in flat.items():
        if key in routing:
            continue
        if isinstance(value, str) and _INTERP.search(value):
            result.add(
                key,
                "refused",
                value,
                note="interpolation: ${...} resolves outside the file; write the value",
            )
            continue
        handler = handlers.get(key)
        if handler is None:
            family = next(
                (why for pattern, why in REFUSED_FAMILIES if re.search(pattern, key)), None
            )
            result.add(
                key, "refused", value, note=family or "unknown field: not in the import whitelist"
            )
            continue
        handler(key, value, result, lora, seen_lengths, revision, teacher_revision)

    if recipe["student"].get("lora", "unset") is None:
        # lora_rank 0 is a full fine-tune: the LoRA shape fields describe nothing.
        for finding in result.findings:
            if finding.target and finding.target.startswith("student.lora.") and (
                finding.label in ("exact", "derived")
            ):
                finding.label, finding.target = "informational", None
                finding.note = "unused: lora_rank 0 is a full fine-tune"
    elif lora:
        recipe["student"]["lora"] = lora
    if bundle is not None:
        import_bundle.finish(result, bundle)
    if "max_prompt_length" in seen_lengths and "max_response_length" in seen_lengths:
        total = seen_lengths["max_prompt_length"] + seen_lengths["max_response_length"]
        recipe["rollout"]["max_total_tokens"] = total
        result.add(
            "data.max_prompt_length+data.max_response_length",
            "derived",
            total,
            "rollout.max_total_tokens",
            "sum: verl bounds prompt and response separately, miniverl bounds the whole episode",
        )
    for section in ("student", "teacher"):
        if section not in recipe:  # several teachers: teachers:, filled from the bundle
            continue
        if section == "teacher" and routing:
            continue  # refused above, in the routing's one line
        if "model" not in recipe[section] and not any(
            f.target == f"{section}.model" for f in result.findings
        ):
            src = (
                "actor_rollout_ref.model.path"
                if section == "student"
                else "distillation.teacher_models.teacher_model.model_path"
            )
            result.add(
                src,
                "unsupported",
                None,
                f"{section}.model",
                f"required: set {src} to the {section} model",
            )
    return result


def _routing_keys(flat: dict) -> list[str]:
    """The keys of a hand-written config's teacher routing: ``distillation.teacher_key``
    and every ``distillation.teacher_models`` entry, when an entry is not verl's single
    ``teacher_model``; [] for a config of one teacher."""
    entries = [k for k in flat if k.startswith("distillation.teacher_models.")]
    if all(k.split(".")[2] == "teacher_model" for k in entries):
        return []
    return [k for k in flat if k == "distillation.teacher_key" or k in entries]


# -------------------------------------------------------------------------- driver


def import_config(
    config: dict,
    *,
    revision: str | None = None,
    teacher_revision: str | None = None,
    base_dir: Path | None = None,
    bundle: BundleFacts | None = None,
) -> ImportResult:
    """Map a parsed verl config (nested or dotted keys) to a recipe dict plus findings.

    Local model directories must lie under ``base_dir`` (the config's folder; default
    the current directory), see :mod:`miniverl.bridge.import_paths`. ``bundle``: the
    config is that miniverl bundle's overrides (:mod:`miniverl.bridge.import_bundle`).
    """
    if not isinstance(config, dict):
        raise ConfigError(
            f"a verl config must be a YAML mapping at the top level (got "
            f"{type(config).__name__}); pass verl's ppo_trainer-style config file"
        )
    return _map(
        flatten(config), revision, teacher_revision, Path(base_dir or Path.cwd()), bundle
    )


def _validate(recipe: dict) -> list[str]:
    """Errors from common/recipe.py's schema (empty when it is valid)."""
    try:
        Recipe.model_validate(recipe)
    except ValidationError as exc:
        return [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    return []


def _read_config(config_path: Path) -> object:
    """The parsed YAML of ``config_path``; one-line ConfigError for what cannot be read."""
    if not config_path.is_file():
        what = "is a directory" if config_path.is_dir() else "does not exist"
        raise ConfigError(f"verl config {config_path} {what}; pass a verl config YAML file")
    try:
        text = config_path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"verl config {config_path} is not UTF-8 text (byte {exc.start}); pass a verl "
            "config YAML file"
        ) from None
    except OSError as exc:
        raise ConfigError(f"verl config {config_path} cannot be read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{config_path}:{mark.line + 1}:{mark.column + 1}" if mark else str(config_path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}; fix the syntax") from None


def import_verl(
    config_path: Path,
    out_path: Path,
    *,
    revision: str | None = None,
    teacher_revision: str | None = None,
    trajectories: Path | None = None,
) -> tuple[dict, Path]:
    """Write ``out_path`` (recipe) and ``import-report.json`` beside it; raise on refusal.

    The report is written in both cases, so a refused import still explains itself.
    ``trajectories``: an offline KD run's set, which its bundle does not hold.
    """
    config_path, out_path = Path(config_path), Path(out_path)
    base_dir, facts = config_path.parent, None
    found = import_bundle.find_bundle(config_path)
    if found is not None:
        # miniverl's own bundle: its paths are bundle-relative, its provenance fills in
        # what verl has no field for.
        base_dir, config_path = found
        facts = replace(import_bundle.load_facts(base_dir), trajectories=trajectories)
    elif trajectories is not None:
        raise ConfigError(
            f"--trajectories {trajectories}: only a bundle export-verl wrote takes it (the "
            f"offline set of the run it came from); {config_path} is a verl config")
    config = _read_config(config_path)
    if not config:
        raise ConfigError(
            f"verl config {config_path} is empty; pass a verl config that names at least "
            "actor_rollout_ref.model.path and the distillation teacher"
        )
    result = import_config(
        config,
        revision=revision,
        teacher_revision=teacher_revision,
        base_dir=base_dir,
        bundle=facts,
    )
    if facts is not None:
        import_bundle.prepared_back(result, facts, out_path.parent)
    report = result.report(config_path.name)
    errors = [] if result.refused else _validate(result.recipe)
    report["recipe_errors"] = errors
    report["ok"] = report["ok"] and not errors
    out_path.parent.mkdir(parents=True, exist_ok=True)
    report_path = out_path.parent / "import-report.json"
    atomic_write_json(report_path, report, default=str, allow_nan=True, shared=True)
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
    atomic_write_text(
        out_path, header + yaml.safe_dump(result.recipe, sort_keys=False), shared=True
    )
    return report, report_path
