"""Level 3: a checksummed verl bundle from a run (``miniverl export-verl``), for verl
0.8.0 (the default) or 0.9.1 (``--verl-version``; ``profile.py`` says what differs).

Layout (paths are relative; nothing inside names a local directory)::

    model/adapter/            PEFT adapter (or model/full/ for a full fine-tune)
    model/tokenizer/          tokenizer files, chat template included
    model/base_model.json     base identity + the exact command that fetches it
    data/train.parquet        verl rows (see parquet.py), train split
    data/val.parquet          verl rows, eval split
    recipe/verl-overrides.yaml    Hydra config on top of verl's ppo_trainer
    recipe/tool_config.yaml       Hermes tool schemas -> reward/miniverl_tool.py
    recipe/launch.template.sh     refuses to run until base and teacher weights exist
    recipe/REQUIRED_VERL.txt      verl==VERSION, its pin, profile
    reward/compute_score.py       verl reward using miniverl's verifiers
    reward/miniverl_tool.py       verl tool class running miniverl's tools
    provenance/manifest.json      what this bundle is and how it was made (redacted)
    provenance/source_run.json    the source run's manifest, recipe and last eval (redacted)
    README.md                     model card: how the weights were trained (model_card.py)
    SHA256SUMS

The bundle is written into a temporary directory beside ``--out`` and renamed, so a
crash never leaves half a bundle. Known verl 0.8.0 hazards are handled here: the reward
``name`` is set next to its ``path``; ``lora_rank``/``lora_alpha``/``target_modules``
are copied from the adapter's own config (verl ignores ``lora_adapter_path`` when
``lora_rank`` is 0); ``rollout.load_format`` is ``safetensors``.

This module writes bundles; ``doctor.py`` checks them. It does not run verl.
"""

from __future__ import annotations

import json
import shlex
from importlib import resources
from pathlib import Path

import yaml

from miniverl.bridge import artifacts, mixture_bundle, parquet, profile, teacher_source
from miniverl.bridge.model_card import write_model_card
from miniverl.common.atomic import atomic_write_json, publishing
from miniverl.common.errors import ConfigError
from miniverl.common.hashing import write_sums
from miniverl.common.manifest import load_manifest
from miniverl.common.recipe_sections import LOSS_VARIANT_FIELDS
from miniverl.common.redact import redact
from miniverl.common.teacher_routes import SINGLE, routes
from miniverl.common.tokenizer_id import tokenizer_fingerprint
from miniverl.student.environments import make_tasks

BASE_SENTINEL = "BASE_MODEL_DIR"
TEACHER_SENTINEL = "TEACHER_MODEL_DIR"


def _template(name: str) -> str:
    return (
        resources.files("miniverl.bridge").joinpath("templates", name).read_text(encoding="utf-8")
    )


def _loss_mode(recipe) -> str:
    for name in LOSS_VARIANT_FIELDS:  # docs/losses.md: none is mapped onto verl's fields yet
        value = getattr(recipe.loss, name)
        if value is not None:
            raise ConfigError(
                f"loss.{name} {value!r} has no counterpart in the verl bundle this exports "
                "(it would be dropped silently); export a run trained without it"
            )
    mode = profile.EXPORTED_LOSS_MODES.get(recipe.loss.divergence)
    if mode is None:
        raise ConfigError(
            f"loss.divergence {recipe.loss.divergence!r} has no verl distillation loss; "
            f"export a run trained with one of {sorted(profile.EXPORTED_LOSS_MODES)}"
        )
    return mode


def _prompt_budget(tokenizer_dir: Path, tables: list, tool_specs: list, recipe) -> tuple[int, str]:
    """Longest rendered prompt in tokens (with tools), or the recipe's context room."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        room = recipe.rollout.max_total_tokens - recipe.rollout.max_new_tokens_per_turn
        return room, "recipe: max_total_tokens - max_new_tokens_per_turn (transformers absent)"
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    longest = 0
    for table in tables:
        for messages in table.column("prompt").to_pylist():
            ids = tok.apply_chat_template(
                messages, tools=tool_specs, add_generation_prompt=True, tokenize=True
            )
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            longest = max(longest, len(ids))
    return (
        longest,
        "measured: longest train/val prompt rendered with tools by the exported tokenizer",
    )


def build_overrides(recipe, lora: dict | None, *, max_prompt: int, run_name: str,
                    target: profile.VerlTarget | None = None,
                    entries: list | None = None, teacher_gpus: int | None = None) -> dict:
    """The nested overrides mapping (without the Hydra header) for ``target`` (None: the
    default verl release). ``entries``: several teachers
    (``mixture_bundle.teacher_entries``), each its own ``teacher_models`` entry;
    ``teacher_gpus``: the one teacher's pool (unset: ``DEFAULT_TEACHER_GPUS``; verl's own
    default pool, 0 GPUs on 0 nodes, is refused by its trainer)."""
    files = profile.BUNDLE_FILES
    flat = profile.fixed_values(target or profile.verl_target(None))
    max_response = max(
        recipe.rollout.max_total_tokens - max_prompt, recipe.rollout.max_new_tokens_per_turn
    )
    micro = max(1, recipe.train.rollouts_per_cycle // recipe.train.grad_accum)
    flat.update(
        {
            "actor_rollout_ref.model.path": BASE_SENTINEL,
            "actor_rollout_ref.actor.optim.lr": float(recipe.train.lr),
            # One optimizer step per fresh batch (strict on-policy), split into grad_accum
            # micro-batches; verl's FSDPActorConfig refuses a config without a micro size.
            "actor_rollout_ref.actor.ppo_mini_batch_size": recipe.train.rollouts_per_cycle,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
            "actor_rollout_ref.rollout.n": 1,
            "actor_rollout_ref.rollout.temperature": float(recipe.rollout.temperature),
            "actor_rollout_ref.rollout.top_p": float(recipe.rollout.top_p),
            "actor_rollout_ref.rollout.multi_turn.tool_config_path": files["tool_config"],
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": recipe.rollout.max_turns,
            "data.train_files": files["train"],
            "data.val_files": files["val"],
            "data.train_batch_size": recipe.train.rollouts_per_cycle,
            "data.max_prompt_length": max_prompt,
            "data.max_response_length": max_response,
            "data.seed": recipe.run.seed,
            "reward.custom_reward_function.path": files["reward"],
            "distillation.distillation_loss.topk": recipe.loss.top_k,
            "distillation.distillation_loss.loss_mode": _loss_mode(recipe),
            "distillation.teacher_models.teacher_model.model_path": TEACHER_SENTINEL,
            "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size": 1,
            "trainer.project_name": "miniverl",
            "trainer.experiment_name": run_name,
            "trainer.logger": profile.verl_loggers(recipe.run.loggers),
            "trainer.total_training_steps": recipe.train.cycles,
            "trainer.save_freq": recipe.train.save_every or -1,
            "trainer.test_freq": recipe.train.eval_every or -1,
        }
    )
    if entries:
        for key in ("model_path", "inference.tensor_model_parallel_size"):
            del flat[f"distillation.teacher_models.teacher_model.{key}"]
        flat.update(mixture_bundle.teacher_overrides(
            entries, max_prompt=max_prompt, max_response=max_response,
            temperature=recipe.rollout.temperature))
    else:
        flat.update(mixture_bundle.single_pool(
            mixture_bundle.DEFAULT_TEACHER_GPUS if teacher_gpus is None else teacher_gpus))
    if lora is not None:
        flat["actor_rollout_ref.model.lora_rank"] = lora["r"]
        flat["actor_rollout_ref.model.lora_alpha"] = lora["alpha"]
        flat["actor_rollout_ref.model.target_modules"] = lora["target_modules"]
        flat["actor_rollout_ref.model.lora_adapter_path"] = files["adapter_dir"]
    else:
        # Full fine-tune: the exported model is the actor's starting point, no adapter.
        flat["actor_rollout_ref.model.path"] = "model/full"
        flat["actor_rollout_ref.model.lora_rank"] = 0
        flat["actor_rollout_ref.model.lora_alpha"] = 16
        flat["actor_rollout_ref.model.target_modules"] = "all-linear"
        flat["actor_rollout_ref.model.lora_adapter_path"] = None
        flat["actor_rollout_ref.rollout.load_format"] = "auto"
    return profile.unflatten(flat)


def overrides_text(overrides: dict, target: profile.VerlTarget | None = None) -> str:
    target = target or profile.verl_target(None)
    pins = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in target.identity.items()
                     if k != "version")
    header = (
        f"# verl {target.version} ({pins}), profile {profile.PROFILE}.\n"
        "# Composed on top of verl's own ppo_trainer config by recipe/launch.template.sh; the\n"
        "# bundle-relative paths below are made absolute there. Written by `miniverl export-verl`.\n"
    )
    hydra = {
        "hydra": {"searchpath": ["pkg://verl.trainer.config"]},
        "defaults": ["ppo_trainer", "_self_"],
    }
    return (
        header + yaml.safe_dump(hydra, sort_keys=False) + yaml.safe_dump(overrides, sort_keys=False)
    )


def tool_config(tool_specs: list) -> dict:
    return {
        "tools": [
            {
                "class_name": "miniverl_tool.MiniverlTool",
                "config": {"type": "native"},
                "tool_schema": spec,
            }
            for spec in tool_specs
        ]
    }


def _say(text: str) -> str:
    """A bash line printing ``text`` to stderr; shlex quotes it, so any command is safe."""
    return f"    printf '%s\\n' {shlex.quote(text)} >&2\n"


def _teacher_check(var: str, identity: dict, what: str = "teacher model") -> str:
    """The launch script's check that ``$var`` points at weights, with the fetch command."""
    lines = _say(f"  fetch them with: {identity['download']}")
    if identity.get("prepare"):
        lines += _say(f"  ({identity['prepare']})")
    return (
        f'if [ -z "${{{var}:-}}" ] || [ ! -f "${{{var}:-}}/config.json" ]; then\n'
        f'    echo "error: {what} weights are not present (set {var} to a directory with '
        'config.json)." >&2\n'
        f"{lines}    missing=1\n"
        "fi\n"
    )


def launch_script(identity: dict, teacher_identity: dict, lora: bool,
                  target: profile.VerlTarget | None = None,
                  routes: list[tuple[str, str, dict, list[str]]] | None = None) -> str:
    """Bash entry point: checks weights and verl, then runs verl's main_ppo. ``routes``:
    several teachers, each ``(route, variable, identity, entry names)``."""
    if routes:
        return _routed_launch(launch_script(identity, {"download": ""}, lora, target), routes)
    target = target or profile.verl_target(None)
    version = target.version
    modules = "".join(
        f"try:\n    import {module}  # noqa: F401\nexcept ImportError:\n"
        f"    sys.exit(\"error: verl {version}'s {target.trainer} needs {module}; \"\n"
        f"             \"pip install '{requirement}'\")\n"
        for module, requirement in target.modules
    )
    model_path = "$BASE_MODEL_DIR" if lora else "$BUNDLE/model/full"
    adapter = 'actor_rollout_ref.model.lora_adapter_path="$BUNDLE/model/adapter"' if lora else ""
    base_check = (
        'if [ -z "${BASE_MODEL_DIR:-}" ] || [ ! -f "${BASE_MODEL_DIR:-}/config.json" ]; then\n'
        '    echo "error: base model weights are not present (set BASE_MODEL_DIR to a directory with config.json)." >&2\n'
        + _say(f"  fetch them with: {identity['download']}")
        + '    echo "  then: BASE_MODEL_DIR=base-model bash $0" >&2\n'
        "    missing=1\n"
        "fi\n"
        if lora
        else ""
    )
    teacher_lines = _say(f"  fetch them with: {teacher_identity['download']}")
    if teacher_identity.get("prepare"):
        teacher_lines += _say(f"  ({teacher_identity['prepare']})")
    return f"""#!/usr/bin/env bash
# Launch verl {version} on this bundle (profile {profile.PROFILE}).
#
#   BASE_MODEL_DIR=base-model TEACHER_MODEL_DIR=teacher-model bash recipe/launch.template.sh
#
# A template: it refuses to run until the base and teacher weights are on disk, and it
# checks the installed verl. Distributed execution of this bundle was not tested by miniverl.
set -euo pipefail
BUNDLE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")/.." && pwd)"

missing=0
{base_check}if [ -z "${{TEACHER_MODEL_DIR:-}}" ] || [ ! -f "${{TEACHER_MODEL_DIR:-}}/config.json" ]; then
    echo "error: teacher model weights are not present (set TEACHER_MODEL_DIR to a directory with config.json)." >&2
{teacher_lines}    missing=1
fi
[ "$missing" = 0 ] || exit 2

python - <<'PY'
import sys
try:
    import verl
except ImportError:
    sys.exit("error: verl is not installed; this bundle needs verl=={version} "
             "(pip install verl=={version})")
if verl.__version__ != "{version}":
    sys.exit(f"error: verl {{verl.__version__}} installed; this bundle needs verl=={version} "
             "(or export it again with miniverl export-verl --verl-version)")
{modules}import miniverl.student.environments  # noqa: F401  (the reward and tools need miniverl)
PY

(cd "$BUNDLE" && sha256sum --quiet -c SHA256SUMS) || {{ echo "error: bundle files changed (SHA256SUMS)" >&2; exit 2; }}

export PYTHONPATH="$BUNDLE/reward${{PYTHONPATH:+:$PYTHONPATH}}"
exec python -m verl.trainer.main_ppo \\
    --config-path "$BUNDLE/recipe" --config-name verl-overrides \\
    actor_rollout_ref.model.path="{model_path}" \\
    actor_rollout_ref.model.tokenizer_path="$BUNDLE/model/tokenizer" \\
    {adapter} \\
    distillation.teacher_models.teacher_model.model_path="$TEACHER_MODEL_DIR" \\
    data.train_files="$BUNDLE/data/train.parquet" \\
    data.val_files="$BUNDLE/data/val.parquet" \\
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$BUNDLE/recipe/tool_config.yaml" \\
    reward.custom_reward_function.path="$BUNDLE/reward/compute_score.py" \\
    "$@"
"""


def _routed_launch(single: str, routes: list[tuple[str, str, dict, list[str]]]) -> str:
    """The one-teacher launch script with one weights check and one ``model_path`` per
    route instead of ``TEACHER_MODEL_DIR``'s."""
    start = single.index('if [ -z "${TEACHER_MODEL_DIR:-}" ]')
    end = single.index("fi\n", start) + len("fi\n")
    checks = "".join(_teacher_check(var, ident, f"teacher {route}'s model")
                     for route, var, ident, _ in routes)
    text = single[:start] + checks + single[end:]
    paths = "".join(f'    distillation.teacher_models.{entry}.model_path="${var}" \\\n'
                    for _, var, _, entries in routes for entry in entries)
    old = '    distillation.teacher_models.teacher_model.model_path="$TEACHER_MODEL_DIR" \\\n'
    assert old in text
    usage = " ".join(f"{var}={mixture_bundle.route_folder(route)}" for route, var, _, _ in routes)
    return (text.replace(old, paths)
            .replace("TEACHER_MODEL_DIR=teacher-model", usage)
            .replace("until the base and teacher weights", "until the base and every teacher's weights"))


def _source_run(run: Path) -> dict:
    out: dict = {"run_id": run.name}
    if (run / "manifest.json").is_file():
        # Checked, and without its digest: the bundle's copy is redacted, so the run's
        # digest would not describe it.
        out["manifest"] = load_manifest(run / "manifest.json")
    if (run / "recipe.resolved.yaml").is_file():
        out["recipe"] = yaml.safe_load((run / "recipe.resolved.yaml").read_text(encoding="utf-8"))
    if (run / "status.json").is_file():
        out["status"] = json.loads((run / "status.json").read_text(encoding="utf-8"))
    last_eval = None
    if (run / "events.jsonl").is_file():
        for line in (run / "events.jsonl").read_text(encoding="utf-8").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "eval":
                last_eval = event
    out["last_eval"] = last_eval
    return redact(out)


def export_verl(run: Path, out: Path, verl_version: str | None = None,
                teacher_gpus: list[str] | None = None) -> dict:
    """Write the bundle for ``run`` at ``out`` for verl ``verl_version`` (None: the
    default release); returns provenance/manifest.json's content. A run of a mixture, or
    of several teachers, gives one bundle of every environment (``mixture_bundle.py``);
    ``teacher_gpus``: the ``--teacher-gpus`` values (``N`` or ``ROUTE=N``)."""
    target = profile.verl_target(verl_version)
    run, out = Path(run), Path(out)
    if out.exists():
        raise ConfigError(f"bundle path {out} already exists; pass a new --out path")
    recipe = artifacts.load_run_recipe(run)
    routed = routes(recipe)
    mixture_bundle.refuse_other_tokenizers(recipe, routed)
    _loss_mode(recipe)  # a loss verl cannot carry is refused before anything is made
    gpus = mixture_bundle.parse_teacher_gpus(
        teacher_gpus, list(routed) or [SINGLE])
    entries = mixture_bundle.teacher_entries(routed, gpus) if routed else None
    ckpt = artifacts.latest_checkpoint(run)
    identity = artifacts.base_identity(recipe.student.model)
    teacher_identity = None if routed else teacher_source.teacher_identity(run, recipe)
    route_identities = {name: mixture_bundle.route_identity(run, recipe, route)
                        for name, route in routed.items()}
    mixture = recipe.environments is not None
    members = recipe.environments or [recipe.environment]
    facts = [parquet.env_facts(m.name, m.params) for m in members]
    env, env_cfg = facts[0], members[0]
    tool_specs = mixture_bundle.tool_union(facts) if mixture else env.tool_specs
    files = profile.BUNDLE_FILES

    with publishing(out, folder=True) as tmp:
        # model/
        if ckpt.kind == "lora":
            lora = artifacts.lora_shape(
                artifacts.write_adapter_files(ckpt, tmp / files["adapter_dir"], identity)
            )
        else:
            artifacts.write_full_model_files(ckpt, tmp / "model" / "full")
            lora = None
        tok_dir = tmp / files["tokenizer_dir"]
        artifacts.copy_files(
            artifacts.tokenizer_source(run, ckpt, recipe), tok_dir, artifacts.TOKENIZER_FILES
        )
        tokenizer_fp = tokenizer_fingerprint(tok_dir)
        base = ({**identity, "kind": ckpt.kind, "teachers": route_identities} if routed
                else {**identity, "kind": ckpt.kind, "teacher": teacher_identity})
        atomic_write_json(tmp / files["base_model"], base, default=str, allow_nan=True, shared=True)

        # data/
        (tmp / "data").mkdir()
        import pyarrow.parquet as pq

        tables, environments = [], []
        made = {}
        for member, facts_m in zip(members, facts, strict=True):
            made[member.name] = {
                key: make_tasks(member.name, split, count, member.difficulty,
                                member.split_seed, member.params)
                for split, count, key in (("train", member.train_tasks, "train"),
                                          ("eval", member.eval_tasks, "val"))}
            environments.append(mixture_bundle.split_provenance(
                member, facts_m, getattr(member, "weight", 1.0), made[member.name]))
        for key in ("train", "val"):
            if mixture:
                tasks = [t for m in members for t in made[m.name][key]]
                per_task = [f for m, f in zip(members, facts, strict=True)
                            for _ in made[m.name][key]]
                table = parquet.tasks_to_table(tasks, per_task, tool_selection=True)
            else:
                table = parquet.tasks_to_table(made[env_cfg.name][key], env)
            pq.write_table(table, tmp / files[key])
            tables.append(table)
        max_prompt, prompt_rule = _prompt_budget(tok_dir, tables, tool_specs, recipe)
        if mixture:
            prompt_rule += " (every environment's tools, as verl's dataset renders each row)"

        # recipe/
        (tmp / "recipe").mkdir()
        overrides = build_overrides(
            recipe, lora, max_prompt=max_prompt, run_name=recipe.run.name, target=target,
            entries=entries,
            teacher_gpus=None if routed else gpus[SINGLE])
        (tmp / files["overrides"]).write_text(overrides_text(overrides, target), encoding="utf-8")
        (tmp / files["tool_config"]).write_text(
            yaml.safe_dump(tool_config(tool_specs), sort_keys=False), encoding="utf-8"
        )
        launch = tmp / files["launch"]
        launch.write_text(
            launch_script(identity, teacher_identity or {}, lora is not None, target,
                          routes=[(name, mixture_bundle.route_sentinel(name),
                                   route_identities[name],
                                   [e.entry for e in entries or [] if e.route == name])
                                  for name in routed] if routed else None),
            encoding="utf-8")
        launch.chmod(0o755)
        (tmp / files["required_verl"]).write_text(profile.required_verl_text(target),
                                                       encoding="utf-8")

        # reward/
        (tmp / "reward").mkdir()
        (tmp / files["reward"]).write_text(_template("compute_score.py"), encoding="utf-8")
        (tmp / files["tool_impl"]).write_text(_template("miniverl_tool.py"), encoding="utf-8")

        # provenance/
        (tmp / "provenance").mkdir()
        from importlib.metadata import version

        manifest = {
            "bundle_format": profile.BUNDLE_FORMAT,
            "profile": profile.PROFILE,
            "verl": dict(target.identity),
            "miniverl_version": version("miniverl"),
            "source_run": run.name,
            "checkpoint_step": ckpt.step,
            "kind": ckpt.kind,
            "lora": lora,
            "tokenizer_fp": tokenizer_fp,
            "environment": {
                "name": env.name,
                "params": env.params,
                "difficulty": env_cfg.difficulty,
                "split_seed": env_cfg.split_seed,
            },
            "rows": {"train": tables[0].num_rows, "val": tables[1].num_rows},
            "tools": env.tool_names,
            "max_prompt_length": {"value": max_prompt, "rule": prompt_rule},
            "distributed_execution": "not tested",
        }
        lines = mixture_bundle.not_moved(recipe, routed=routed, entries=entries or [],
                                         shares=None)
        if mixture:
            shares = mixture_bundle.weight_shares(environments)
            lines = mixture_bundle.not_moved(recipe, routed=routed, entries=entries or [],
                                             shares=shares)
            del manifest["environment"]
            manifest["tools"] = [spec.get("function", spec).get("name", "")
                                 for spec in tool_specs]
            manifest["environments"] = environments
            manifest["weights"] = {
                "shares": shares,
                "rule": "verl draws train.parquet's rows uniformly (data.shuffle: "
                        "RandomSampler), so an environment's share of verl's episodes is its "
                        "share of the rows; miniverl's mixture draws environment k with weight_k / sum"}
            manifest["teachers"] = _teachers_manifest(routed, entries, gpus)
        atomic_write_json(tmp / files["manifest"], manifest, default=str, allow_nan=True, shared=True)
        source_run = _source_run(run)
        if mixture:
            # What the source run trained with that the bundle cannot carry: a fact of the
            # run, beside its recipe (the manifest says what the bundle is).
            source_run["not_moved"] = lines
        atomic_write_json(tmp / files["source_run"], source_run, default=str, allow_nan=True, shared=True)
        card = write_model_card(run, tmp, recipe, kind=ckpt.kind, step=ckpt.step, base=identity,
                                bundle=True, teacher_source=teacher_identity,
                                verl_version=target.version)
        if mixture:
            with open(card, "a", encoding="utf-8") as fh:
                fh.write(_mixture_card(manifest, lines))
        write_sums(tmp)
    # The export's lines come back beside the manifest (one environment's bundle keeps its
    # files as they always were and lists them nowhere else).
    return {**manifest, "not_moved": lines}


def _teachers_manifest(routed, entries, gpus) -> dict:
    """The manifest's teachers: each route's entries, keys, GPUs and model variable."""
    if not routed:
        return {"teacher_key": None, "routes": {}, "pool_gpus": gpus[SINGLE]}
    return {
        "teacher_key": mixture_bundle.TEACHER_KEY,
        "routes": {name: {"teacher": route.teacher, "adapter": route.adapter,
                          "environments": list(route.environments),
                          "entries": {e.entry: e.key for e in entries if e.route == name},
                          "gpus": gpus[name],
                          "model_dir_variable": mixture_bundle.route_sentinel(name)}
                   for name, route in routed.items()},
        "pool_gpus": sum(e.gpus for e in entries),
    }


def _mixture_card(manifest: dict, not_moved: list[str]) -> str:
    """The README section of a mixture's bundle: environments, teachers, what stays behind."""
    rows = "\n".join(
        f"| {e['data_source']} | {e['rows']['train']} / {e['rows']['val']} | "
        f"{manifest['weights']['shares'][e['name']]['miniverl']:.0%} | "
        f"{manifest['weights']['shares'][e['name']]['verl']:.0%} | "
        + next((f"{name} (`{entry}`)" for name, r in manifest["teachers"]["routes"].items()
                for entry, key in r["entries"].items() if key == e["data_source"]), "teacher")
        + " |" for e in manifest["environments"])
    moved = "\n".join(f"- {line}" for line in not_moved) or "- nothing"
    return (
        "\n## Environments and teachers in verl\n\n"
        "| data_source | train / val rows | miniverl's share | verl's share | teacher (entry) |\n"
        "| --- | --- | --- | --- | --- |\n"
        f"{rows}\n\n"
        f"{manifest['weights']['rule']}.\n\n"
        "## What does not move to verl\n\n"
        f"{moved}\n"
    )
