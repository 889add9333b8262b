"""Importing miniverl's own bundle: ``export-verl`` -> ``import-verl`` gives the recipe back.

A bundle's ``recipe/verl-overrides.yaml`` is a verl config, but one the generic
whitelist refuses (it names verl's own Hydra defaults, the profile's fixed Ray, vLLM and
tool-agent settings, and stand-ins like ``BASE_MODEL_DIR`` for weights it does not
carry). When the config is a bundle's (the bundle directory, or that file inside it),
the importer also understands exactly the fields the exporter writes:

- a profile-fixed field (``profile.PROFILE_FIXED``) or the Hydra header, at the value
  the exporter writes: informational (anything else falls back to the generic rules);
- ``BASE_MODEL_DIR`` / ``TEACHER_MODEL_DIR`` and ``model/full``: the models named in
  ``model/base_model.json`` (a toy spec, a pinned hub id; a prepared teacher becomes its
  directory in this machine's cache, see :mod:`miniverl.bridge.teacher_source`);
- the batch, rollout and step fields the exporter derives from the recipe, inverted;
- bundle-relative tool, reward and adapter paths: informational.

What verl has no field for comes from the bundle's provenance, each labelled: the
environment (``provenance/manifest.json``), the per-turn and episode token caps
(``provenance/source_run.json``, used when the overrides agree with it) and every other
field of the source run's recipe the overrides leave unsaid (device, dtypes, loss and
train settings: :func:`finish`), so export -> import -> export writes the same files.
Those files are checked against ``SHA256SUMS`` first; the overrides file itself may be
edited, since every value in it is mapped and checked field by field.

This module maps a bundle's fields; the driver, refusals and recipe validation are in
:mod:`miniverl.bridge.importer`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import get_args, get_origin

from pydantic import BaseModel

from miniverl.bridge import import_fields as fields
from miniverl.bridge import import_mixture, profile
from miniverl.bridge.teacher_source import model_source, prep_recipe_of, prepared_teacher_dir
from miniverl.common.errors import ConfigError
from miniverl.common.hashing import SUMS_NAME, verify_sums
from miniverl.common.recipe import Recipe
from miniverl.common.redact import HOME, SECRET
from miniverl.common.teacher_routes import SINGLE

BASE_SENTINEL = "BASE_MODEL_DIR"
TEACHER_SENTINEL = "TEACHER_MODEL_DIR"
FULL_MODEL_DIR = "model/full"
HYDRA_HEADER = {"hydra.searchpath": ["pkg://verl.trainer.config"],
                "defaults": ["ppo_trainer", "_self_"]}
# The provenance the import reads; each must match SHA256SUMS.
READ_FILES = (profile.BUNDLE_FILES["manifest"], profile.BUNDLE_FILES["base_model"],
              profile.BUNDLE_FILES["source_run"])


@dataclass(frozen=True)
class BundleFacts:
    """What a bundle says about itself, beyond its verl overrides."""

    root: Path
    manifest: dict
    base: dict
    source_recipe: dict | None
    # import-verl --trajectories: the offline KD set the bundle does not hold.
    trajectories: Path | None = None


def find_bundle(config_path: Path) -> tuple[Path, Path] | None:
    """``(bundle root, overrides file)`` when ``config_path`` is a bundle or its overrides."""
    overrides = profile.BUNDLE_FILES["overrides"]
    if config_path.is_dir() and (config_path / overrides).is_file():
        return config_path, config_path / overrides
    root = config_path.resolve().parent.parent
    if (
        config_path.is_file()
        and root / overrides == config_path.resolve()
        and (root / profile.BUNDLE_FILES["manifest"]).is_file()
    ):
        return root, config_path
    return None


def load_facts(root: Path) -> BundleFacts:
    """The bundle's provenance, refused unless it matches SHA256SUMS and the profile."""
    problems = [
        p for p in verify_sums(root) if p.startswith(SUMS_NAME) or p.split(":")[0] in READ_FILES
    ]
    if problems:
        raise ConfigError(
            f"bundle {root.name}: {problems[0]}; its provenance cannot be trusted, export the "
            f"run again (`miniverl bridge doctor {root.name}` lists every problem)"
        )

    def read(key: str) -> dict:
        return json.loads((root / profile.BUNDLE_FILES[key]).read_text(encoding="utf-8"))

    manifest = read("manifest")
    if manifest.get("profile") != profile.PROFILE or manifest.get("bundle_format") != (
        profile.BUNDLE_FORMAT
    ):
        raise ConfigError(
            f"bundle {root.name} is profile {manifest.get('profile')!r} format "
            f"{manifest.get('bundle_format')!r}; this miniverl imports {profile.PROFILE} format "
            f"{profile.BUNDLE_FORMAT} (install the miniverl that wrote it)"
        )
    profile.target_of_manifest(manifest)  # a release this miniverl does not know: refused
    recipe = read("source_run").get("recipe")
    return BundleFacts(root, manifest, read("base_model"), recipe if isinstance(recipe, dict)
                       else None)


# ---------------------------------------------------------------------------- models


def _model(section: str, sentinel: str, identity_of):
    generic = fields.HANDLERS[
        "actor_rollout_ref.model.path" if section == "student"
        else "distillation.teacher_models.teacher_model.model_path"
    ]

    def handler(key, value, result, *rest):
        facts: BundleFacts = result.bundle
        full = (section == "student" and value == FULL_MODEL_DIR
                and facts.manifest.get("kind") == "full")
        if value != sentinel and not full:
            generic(key, value, result, *rest)
            return
        identity = identity_of(facts)
        source, note = model_source(identity)
        if identity.get("adapter"):
            source, note = None, (f"the teacher carries adapter {identity['adapter']['name']!r}, "
                                  "which the bundle does not publish; set teacher.adapter by hand")
        if source is None:
            result.add(key, "unsupported", value, f"{section}.model", note)
            return
        if full:
            note += "; model/full holds the run's result, the recipe starts where the run started"
        result.recipe[section]["model"] = source
        result.add(key, "derived", value, f"{section}.model", note)

    return handler


# ------------------------------------------------------------------------ the rest


def _fixed(key: str, expected: object):
    fallback = fields.HANDLERS.get(key)

    def handler(k, value, result, *rest):
        # A full fine-tune is exported with verl's default loader (no LoRA to load).
        full = (k == "actor_rollout_ref.rollout.load_format"
                and result.bundle.manifest.get("kind") == "full")
        if value == ("auto" if full else expected):
            result.add(k, "informational", value, None,
                       f"fixed by profile {profile.PROFILE}; miniverl's own behaviour")
        elif fallback is not None:
            fallback(k, value, result, *rest)
        else:
            result.add(k, "refused", value, None,
                       f"profile {profile.PROFILE} fixes {expected!r} (got {value!r}); another "
                       "value is a setup miniverl does not run, restore it")

    return handler


def _release_fixed(key: str):
    """A key only some verl releases' profiles fix (``VerlTarget.fixed``): the value the
    bundle's own release needs, and nothing in a bundle for another release."""

    def handler(k, value, result, *_):
        target = profile.target_of_manifest(result.bundle.manifest)
        if key not in target.fixed:
            result.add(k, "refused", value, None,
                       f"a verl {target.version} bundle does not write {k}; remove it")
        elif value == target.fixed[key]:
            result.add(k, "informational", value, None,
                       f"fixed by profile {profile.PROFILE} for verl {target.version}")
        else:
            result.add(k, "refused", value, None,
                       f"profile {profile.PROFILE} for verl {target.version} fixes "
                       f"{target.fixed[key]!r} (got {value!r}); restore it")

    return handler


def _bundle_path(key: str, rel: str, note: str):
    fallback = fields.HANDLERS.get(key)

    def handler(k, value, result, *rest):
        if value == rel:
            result.add(k, "informational", value, None, note)
        elif fallback is not None:
            fallback(k, value, result, *rest)
        else:
            result.add(k, "refused", value, None, f"a bundle names {rel!r} here; restore it")

    return handler


def _remember(name: str, note: str):
    def handler(key, value, result, *_):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            result.add(key, "unsupported", value, None, "expected a positive integer")
            return
        result.seen[name] = value
        result.add(key, "derived", value, None, note)

    return handler


def _loss_mode(key, value, result, *rest):
    """verl's loss mode; where it is the mode the source run's loss exported to, the source
    run's estimator comes back with it (verl has one estimator per mode, miniverl two)."""
    fields.HANDLERS[key](key, value, result, *rest)
    source = (result.bundle.source_recipe or {}).get("loss") or {}
    divergence, estimator = source.get("divergence"), source.get("estimator")
    if (profile.EXPORTED_LOSS_MODES.get(divergence) == value
            and result.recipe["loss"].get("divergence") == divergence
            and result.recipe["loss"].get("estimator") not in (None, estimator)):
        result.recipe["loss"]["estimator"] = estimator
        result.add(key, "derived", value, "loss.estimator",
                   f"the source run's estimator {estimator} (provenance/source_run.json), which "
                   f"export-verl writes as {value}")


def _temperature(key, value, result, *_):
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 5:
        result.add(key, "unsupported", value, "rollout.temperature", "expected 0..5")
        return
    result.recipe["rollout"]["temperature"] = float(value)
    result.add(key, "exact", value, "rollout.temperature")


def handlers(facts: BundleFacts | None = None) -> dict:
    """Handlers for the fields ``export-verl`` writes (on top of the generic whitelist);
    with ``facts`` of a mixture's bundle, also its teacher pool and entries."""
    out = {key: _fixed(key, value) for key, value in profile.PROFILE_FIXED.items()}
    out.update(import_mixture.pool_handlers())
    if facts is not None and "environments" in facts.manifest:
        out.update(import_mixture.handlers(facts))
    out.update({key: _release_fixed(key) for target in profile.VERL_TARGETS.values()
                for key in target.fixed})
    out.update({key: _fixed(key, value) for key, value in HYDRA_HEADER.items()})
    out.update({
        "actor_rollout_ref.model.path": _model("student", BASE_SENTINEL, lambda f: f.base),
        "distillation.teacher_models.teacher_model.model_path": _model(
            "teacher", TEACHER_SENTINEL, lambda f: f.base.get("teacher") or {}),
        "actor_rollout_ref.model.lora_adapter_path": _bundle_path(
            "actor_rollout_ref.model.lora_adapter_path", profile.BUNDLE_FILES["adapter_dir"],
            "the run's trained adapter; the recipe trains a fresh LoRA, as the run did"),
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": _bundle_path(
            "actor_rollout_ref.rollout.multi_turn.tool_config_path",
            profile.BUNDLE_FILES["tool_config"], "the tools come from the environment"),
        "reward.custom_reward_function.path": _bundle_path(
            "reward.custom_reward_function.path", profile.BUNDLE_FILES["reward"],
            "the reward is the environment's verifier"),
        "trainer.total_training_steps": fields.exact(
            "train.cycles", int, "a positive integer", lambda v: v >= 1),
        "actor_rollout_ref.actor.ppo_mini_batch_size": fields.exact(
            "train.rollouts_per_cycle", int, "a positive integer", lambda v: v >= 1),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": _remember(
            "micro", "train.grad_accum = ppo_mini_batch_size // this"),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": _remember(
            "log_prob_micro", "verl's log-prob batch; must equal ppo_micro_batch_size_per_gpu"),
        "data.train_batch_size": _remember(
            "train_batch", "equals ppo_mini_batch_size (one fresh batch per update)"),
        "actor_rollout_ref.rollout.n": fields.required_value(1, "one rollout per task"),
        "actor_rollout_ref.rollout.temperature": _temperature,
        "distillation.distillation_loss.loss_mode": _loss_mode,
        "actor_rollout_ref.rollout.top_p": fields.exact(
            "rollout.top_p", (int, float), "0 < top_p <= 1", lambda v: 0 < v <= 1),
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": fields.exact(
            "rollout.max_turns", int, "a positive integer", lambda v: v >= 1),
        "data.max_prompt_length": _remember(
            "bundle_prompt", "with max_response_length: the token caps (see the next finding)"),
        "data.max_response_length": _remember(
            "bundle_response", "with max_prompt_length: the token caps (see the next finding)"),
        "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size":
            _fixed("distillation.teacher_models.teacher_model.inference."
                   "tensor_model_parallel_size", 1),
    })
    return out


def _batches(result) -> None:
    seen, train = result.seen, result.recipe["train"]
    mini, micro = train.get("rollouts_per_cycle"), seen.get("micro")
    if mini is not None and seen.get("train_batch", mini) != mini:
        result.add("data.train_batch_size", "unsupported", seen["train_batch"],
                   "train.rollouts_per_cycle",
                   f"must equal ppo_mini_batch_size {mini} (one fresh batch per update)")
    if mini is None or micro is None:
        return
    where = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    if micro > mini or seen.get("log_prob_micro", micro) != micro:
        result.add(where, "unsupported", micro, "train.grad_accum",
                   f"must be <= ppo_mini_batch_size {mini} and equal "
                   "log_prob_micro_batch_size_per_gpu; make them agree")
        return
    train["grad_accum"] = mini // micro
    result.add(f"{where}/ppo_mini_batch_size", "derived", [mini, micro], "train.grad_accum",
               "micro-batches per update")


def _lengths(result, facts: BundleFacts) -> None:
    prompt, response = result.seen.get("bundle_prompt"), result.seen.get("bundle_response")
    if prompt is None or response is None:
        return
    rollout = (facts.source_recipe or {}).get("rollout") or {}
    total, per_turn = rollout.get("max_total_tokens"), rollout.get("max_new_tokens_per_turn")
    key = "data.max_prompt_length+data.max_response_length"
    if isinstance(total, int) and isinstance(per_turn, int) and response == max(
            total - prompt, per_turn):
        result.recipe["rollout"].update(max_total_tokens=total, max_new_tokens_per_turn=per_turn)
        result.add(key, "derived", [prompt, response], "rollout.max_total_tokens",
                   "the caps of provenance/source_run.json, which these lengths were derived from "
                   f"(max_total_tokens {total}, max_new_tokens_per_turn {per_turn})")
        return
    result.recipe["rollout"].update(max_total_tokens=prompt + response,
                                    max_new_tokens_per_turn=response)
    result.add(key, "derived", [prompt, response], "rollout.max_total_tokens",
               "sum; the per-turn cap is the response length (the lengths differ from the "
               "bundle's source recipe)")


def _environment(result, facts: BundleFacts) -> None:
    env = facts.manifest.get("environment") or {}
    rows = facts.manifest.get("rows") or {}
    result.recipe["environment"] = {
        "name": env.get("name"), "params": env.get("params") or {},
        "difficulty": env.get("difficulty"), "split_seed": env.get("split_seed"),
        "train_tasks": rows.get("train"), "eval_tasks": rows.get("val"),
    }
    result.add("provenance/manifest.json:environment", "derived", env, "environment",
               "the bundle's environment, split and row counts (verl reads them as Parquet rows)")


# Never taken from the source recipe: each section's model is the bundle's
# (model/base_model.json), and a teacher's preparation, adapters, endpoint and keys say
# where the source machine found it (its paths and servers, not this machine's).
_MODEL_KEYS = ("model",)
_NO_DEFAULT = object()
_TEACHER_PLACE = ("prepare", "adapter", "adapter_revision", "adapters", "endpoint", "api",
                  "api_key_env", "curve_secret_key", "curve_server_key")


def _redacted(value: object) -> bool:
    """True when the export redacted ``value`` (a secret, a local path): it cannot come back."""
    if isinstance(value, str):
        return SECRET in value or "<path>/" in value or value == HOME or value.startswith(HOME + "/")
    if isinstance(value, dict):
        return any(_redacted(v) for v in value.values())
    if isinstance(value, list):
        return any(_redacted(v) for v in value)
    return False


def _at(tree: object, path: list) -> object:
    for part in path:
        if isinstance(tree, dict):
            tree = tree.get(part)
        elif isinstance(tree, list) and isinstance(part, int) and part < len(tree):
            tree = tree[part]
        else:
            return None
    return tree


def _inner(annotation) -> tuple[type[BaseModel] | None, bool]:
    """The recipe section an annotation holds (``X``, ``X | None``, ``dict[str, X]``,
    ``list[X]``), and whether a key or index comes before its fields."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if get_origin(annotation) in (dict, list):
        return _inner(get_args(annotation)[-1])[0], True
    for arg in get_args(annotation):
        model, keyed = _inner(arg)
        if model is not None:
            return model, keyed
    return None, False


def _default(path: list) -> object:
    """The schema default of the recipe field at ``path`` (``_NO_DEFAULT`` where none)."""
    model: type[BaseModel] | None = Recipe
    keyed = False
    for i, part in enumerate(path):
        if keyed:
            keyed = False
            continue
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return _NO_DEFAULT
        if i == len(path) - 1:
            if field.is_required():
                return _NO_DEFAULT
            value = field.get_default(call_default_factory=True)
            return value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        model, keyed = _inner(field.annotation)
    return _NO_DEFAULT


def _carry(source: dict, mapped: dict, path: list, result) -> None:
    """Fill ``mapped`` with each value of ``source`` it leaves unsaid (see _source_fields)."""
    teacher = bool(path) and path[0] in ("teacher", "teachers")
    for key, value in source.items():
        here = [*path, key]
        if key in _MODEL_KEYS or (teacher and key in _TEACHER_PLACE):
            continue
        dotted = ".".join(str(part) for part in here)
        if key in mapped:
            inner = mapped[key]
            if isinstance(value, dict) and isinstance(inner, dict):
                _carry(value, inner, here, result)
            elif key == "environments" and isinstance(value, list) and isinstance(inner, list):
                for i, (was, now) in enumerate(zip(value, inner, strict=False)):
                    if isinstance(was, dict) and isinstance(now, dict) and (
                            was.get("name") == now.get("name")):
                        _carry(was, now, [*here, i], result)
            continue
        if isinstance(value, dict) and value:
            mapped[key] = {}
            _carry(value, mapped[key], here, result)
            if not mapped[key]:
                del mapped[key]
        elif value == _default(here):
            continue  # the recipe resolves to it anyway
        elif _redacted(value):
            result.add(f"provenance/source_run.json:recipe.{dotted}", "informational", value,
                       None, "redacted by the export (a local path or secret); the default stands")
        else:
            mapped[key] = value
            result.add(f"provenance/source_run.json:recipe.{dotted}", "derived", value, dotted,
                       "the source run's value (verl has no field for it)")


def _source_fields(result, facts: BundleFacts) -> None:
    """Every recipe field the overrides leave unsaid, as the source run had it.

    The source recipe (``provenance/source_run.json``, checked against SHA256SUMS) is the
    run the bundle was exported from: its device, dtypes, loss and train settings that
    verl has no field for come back as they were, so export -> import -> export writes
    the same files. What the overrides say wins (an edited value stays edited); a value
    that is the field's default is left out; a redacted one (a local path, a secret)
    keeps its default, said in the report.
    """
    if facts.source_recipe is None:
        return
    source = _trajectories(result, facts)
    mode = (source.get("run") or {}).get("mode")
    if mode not in (None, "opd"):
        # verl continues any run on-policy (distillation.enabled); the recipe is the run's.
        result.recipe["run"]["mode"] = mode
        result.add("provenance/source_run.json:recipe.run.mode", "derived", mode, "run.mode",
                   f"the source run trained by {mode}; the bundle's verl config continues "
                   "it by on-policy distillation (distillation.enabled), the recipe is the "
                   "run's own")
    _carry(source, result.recipe, [], result)


def _trajectories(result, facts: BundleFacts) -> dict:
    """The source recipe without ``train.trajectories``, which comes back from
    ``--trajectories`` (the bundle holds no offline set; its path, redacted or relative to
    another machine's folder, would not lead to it), or refused in one line without it."""
    source = dict(facts.source_recipe or {})
    train = dict(source.get("train") or {})
    was = train.pop("trajectories", None)
    source["train"] = train
    key = "provenance/source_run.json:recipe.train.trajectories"
    if was is None:
        if facts.trajectories is not None:
            result.add("--trajectories", "refused", str(facts.trajectories), None,
                       "the source run read no trajectories file (its offline set, if any, "
                       "is train.fixed_set's); leave --trajectories out")
        return source
    if facts.trajectories is None:
        result.add(key, "refused", was, "train.trajectories",
                   f"the source run distilled offline from {was}, a file the bundle does not "
                   "hold (without it offline_kd would train on the oracle traces); pass it "
                   "with --trajectories FILE")
        return source
    path = Path(facts.trajectories).expanduser().resolve()
    if not path.is_file():
        result.add("--trajectories", "refused", str(facts.trajectories), "train.trajectories",
                   f"{str(path)!r} is not a file; pass the trajectories.jsonl the source run "
                   f"distilled from ({was})")
        return source
    result.recipe.setdefault("train", {})["trajectories"] = str(path)
    result.add(key, "derived", was, "train.trajectories",
               f"the source run's offline set, given as --trajectories {path}")
    return source


def _teacher_sections(facts: BundleFacts):
    """``(recipe path, base_model.json identity)`` of each teacher the bundle names whole
    (an adapter route's teacher is its base with the adapter merged)."""
    if "teacher" in facts.base:
        yield ["teacher"], facts.base.get("teacher") or {}
    for route, spec in ((facts.manifest.get("teachers") or {}).get("routes") or {}).items():
        if spec.get("teacher") != SINGLE and spec.get("adapter") is None:
            yield ["teachers", spec["teacher"]], (facts.base.get("teachers") or {}).get(route) or {}


def prepared_back(result, facts: BundleFacts, recipe_dir: Path) -> None:
    """A teacher the source run prepared (``prepare:``) comes back prepared: its model as
    it was prepared from and ``prepare:`` naming the prep recipe that made the cached
    directory (relative to ``recipe_dir``, the imported recipe's folder, or absolute where
    the run's was), where that recipe is still on this machine and still prepares that
    directory; else it stays the cached directory the import found."""
    for path, identity in _teacher_sections(facts):
        section, source = _at(result.recipe, path), _at(facts.source_recipe, path)
        if (identity.get("source") != "prepared" or not isinstance(section, dict)
                or not isinstance(source, dict) or not source.get("prepare")):
            continue
        cached, _ = prepared_teacher_dir(identity)
        prep = prep_recipe_of(cached) if cached is not None else None
        model, note = model_source(identity.get("prepared_from") or {})
        if prep is None or model is None:
            continue
        # An absolute prepare: (redacted in the bundle) is written as the record's path.
        section.update(model=model, prepare=str(prep) if _redacted(source["prepare"])
                       else os.path.relpath(prep, recipe_dir.resolve()))
        where = ".".join(path)
        result.add(f"model/base_model.json:{where}", "derived", identity.get("name"),
                   f"{where}.prepare",
                   f"the run prepared this teacher: {note} (prepared_from) and prepare: "
                   f"{section['prepare']}, the prep recipe that made {identity.get('name')} "
                   "in this machine's cache")


def finish(result, facts: BundleFacts) -> None:
    """Add what verl has no field for, from the bundle's provenance."""
    _batches(result)
    _lengths(result, facts)
    if "environments" in facts.manifest:
        import_mixture.finish(result, facts)
    else:
        _environment(result, facts)
    _source_fields(result, facts)
