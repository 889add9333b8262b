"""The model card (``README.md``) that ``export-adapter`` and ``export-verl`` write.

One card says how the exported weights were trained, read from the run directory: the
mode, the teacher that scored the run (its identity as served, its qualification record
and any change during the run), the environment and difficulty, the optimizer steps of
the exported checkpoint, held-out success before and after, the recipe digest, and the
command plus recipe that reproduce it. The YAML metadata is the Hugging Face hub's:
``base_model`` (with ``base_model_revision``) for a hub base, ``library_name`` (``peft``
for an adapter), ``tags``, the base's ``license`` when its local model card names one,
and the held-out success as a ``model-index`` result. It is written with
``huggingface_hub.ModelCard``, so the hub's own parser reads it back.

Everything from the run is redacted (no secrets, no local paths): the card is made to be
shared. This module reads run files; it does not load weights or contact the hub.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from miniverl.bridge import profile
from miniverl.common.errors import MiniverlError, require
from miniverl.common.jsonl_tail import JsonlTail
from miniverl.common.modeling import resolve_model_dir
from miniverl.common.recipe import recipe_dict
from miniverl.common.redact import redact, redact_text

MODE_TAGS = {"opd": "on-policy-distillation", "replay": "off-policy-distillation",
             "offline_kd": "knowledge-distillation", "sft": "sft", "dpo": "dpo",
             "rl": "reinforcement-learning"}
README = "README.md"


def _events(run: Path) -> list[dict[str, Any]]:
    return JsonlTail(run / "events.jsonl").read()


def held_out(events: list[dict[str, Any]]) -> tuple[dict | None, dict | None]:
    """The first and last ``eval`` events of the split evaluated most (before, after)."""
    evals = [e for e in events if e.get("event") == "eval" and isinstance(e.get("success"),
                                                                           (int, float))]
    if not evals:
        return None, None
    splits = [e.get("split", "eval") for e in evals]
    split = max(set(splits), key=splits.count)
    rows = sorted((e for e in evals if e.get("split", "eval") == split),
                  key=lambda e: e.get("version") if isinstance(e.get("version"), int) else -1)
    return rows[0], (rows[-1] if len(rows) > 1 else None)


def _teacher(recipe, events: list[dict[str, Any]], source: dict | None) -> dict | None:
    if recipe.teacher is None:
        return None
    served = [e.get("teacher") for e in events if e.get("event") == "teacher_connected"]
    changes = [e for e in events if e.get("event") == "teacher_changed"]
    qualified = [e for e in events if e.get("event") == "teacher_qualified"]
    if source is None:  # what the recipe named (the bundle passes what actually served)
        source = {"model": recipe.teacher.model.model_dump(mode="json", exclude_none=True),
                  "adapter": recipe.teacher.adapter}
    record = ({k: v for k, v in qualified[-1].items() if k not in ("ts", "event")}
              if qualified else source.get("qualification"))
    shown = {k: v for k, v in source.items()
             if k not in ("download", "prepare", "qualification", "prepared_from")}
    return {
        "served": served[0] if served else None,
        "last": (changes[-1].get("new") if changes else None),
        "changes": len(changes),
        "qualification": record,
        "source": shown,
    }


def base_license(recipe) -> str | None:
    """The license the base model's own card names (hub base, local copy only)."""
    if not recipe.student.model.hub_id:
        return None
    hub = require("huggingface_hub", "bridge")
    try:
        readme = resolve_model_dir(recipe.student.model, offline=True) / README
        return hub.ModelCard.load(readme).data.license if readme.is_file() else None
    except (MiniverlError, OSError, ValueError):
        return None


def _label(identity: Any) -> str:
    if not isinstance(identity, dict):
        return "none recorded"
    rev = f"@{str(identity['revision'])[:12]}" if identity.get("revision") else ""
    adapter = (f" + adapter {str(identity['adapter_sha256'])[:19]}"
               if identity.get("adapter_sha256") else "")
    gen = f", gen {identity['gen']}" if identity.get("gen") is not None else ""
    return f"{identity.get('name')} ({identity.get('model')}{rev}{adapter}{gen})"


def _success(row: dict | None) -> str:
    if not row:
        return "not measured"
    return (f"{float(row['success']):.1%} (version {row.get('version', '?')}, "
            f"{row.get('n', '?')} tasks)")


def _base_line(identity: dict[str, Any]) -> str:
    if identity.get("source") == "hub":
        return f"`{identity['hub_id']}` at revision `{identity.get('revision')}`"
    if identity.get("source") == "toy":
        return f"a toy Qwen3 built from `{json.dumps(identity['toy'], sort_keys=True)}`"
    if identity.get("source") == "gguf":
        return f"`{identity['gguf']}` converted from GGUF"
    return f"a local model directory `{identity.get('directory_name')}`"


def card_text(run: Path, recipe, *, kind: str, step: int, base: dict, bundle: bool,
              verl_version: str | None = None,
              teacher_source: dict | None = None) -> str:
    """The card's markdown body (below the YAML metadata); every run value redacted."""
    events = _events(run)
    before, after = held_out(events)
    teacher = _teacher(recipe, events, teacher_source)
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8")) if (
        run / "manifest.json").is_file() else {}
    env = recipe.environment
    digest = manifest.get("recipe_digest", "not recorded")
    command = "miniverl up recipe.yaml" if recipe.needs_teacher else "miniverl train recipe.yaml"
    # Redacted as data first: a value under a secret-named key (an environment's
    # `auth_token` param) is no secret to the text rules once it is YAML.
    shared = redact(recipe_dict(recipe))
    shared["run"]["output_dir"] = "runs"  # where it lived changes nothing it learned
    what = "PEFT LoRA adapter" if kind == "lora" else "full fine-tune (Hugging Face model)"
    rows = [
        ("what", f"{what} exported from step {step} of run `{run.name}`"),
        ("base model", _base_line(base)),
        ("mode", f"{recipe.run.mode} ({'on-policy' if recipe.on_policy else 'off-policy'})"),
        ("environment", f"{env.name}, difficulty {env.difficulty}, split seed {env.split_seed}"
         if recipe.environments is None else "a mixture: " + "; ".join(
             f"{e.name} (weight {e.weight:g}), difficulty {e.difficulty}, split seed "
             f"{e.split_seed}" for e in recipe.environments)),
        ("optimizer steps", str(step)),
        ("held-out success before", _success(before)),
        ("held-out success after", _success(after)),
        ("recipe digest", f"`{digest}`"),
    ]
    if teacher is not None:
        rows[3:3] = [
            ("teacher", _label(teacher["served"])),
            ("teacher source", f"`{json.dumps(teacher['source'], sort_keys=True, default=str)}`"),
            ("teacher qualification", _qualification(teacher["qualification"])),
            ("teacher changes", f"{teacher['changes']}"
             + (f" (last: {_label(teacher['last'])})" if teacher["last"] else "")),
        ]
    table = "\n".join(f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows)
    use = (
        "```python\nfrom peft import PeftModel\nfrom transformers import AutoModelForCausalLM\n\n"
        "base = AutoModelForCausalLM.from_pretrained(BASE_MODEL_DIR)\n"
        f"model = PeftModel.from_pretrained(base, \"{'model/adapter' if bundle else '.'}\")\n```"
        if kind == "lora" else
        "```python\nfrom transformers import AutoModelForCausalLM\n\n"
        f"model = AutoModelForCausalLM.from_pretrained(\"{'model/full' if bundle else '.'}\")\n```"
    )
    launch = (f"\nThis folder is a verl {verl_version or profile.DEFAULT_VERL_VERSION} bundle: "
              "`miniverl bridge doctor .` checks it and `recipe/launch.template.sh` starts "
              f"verl on it. {profile.CHECKED_WITH}\n" if bundle else "")
    body = f"""
# {run.name}

Trained with miniverl, a single-GPU lab for on-policy distillation of tool-using
language models.
{launch}
## How it was trained

| | |
| --- | --- |
{table}

## Use it

{use}

## Reproduce

Save the recipe below as `recipe.yaml` and run:

```bash
{command}
```

<details><summary>recipe.yaml (resolved)</summary>

```yaml
{yaml.safe_dump(shared, sort_keys=False, allow_unicode=True).rstrip()}
```

</details>
"""
    return redact_text(body)


def _qualification(record: dict | None) -> str:
    if not record or not isinstance(record.get("success"), (int, float)):
        return "none recorded (teacher.min_success unset, teacher not prepared)"
    gate = (f"; gate teacher.min_success {record['min_success']}"
            if record.get("min_success") is not None else "")
    return (f"{float(record['success']):.1%} held-out success on the {record.get('split')} "
            f"split ({record.get('n')} tasks, {record.get('date')}){gate}")


def write_model_card(run: Path, out_dir: Path, recipe, *, kind: str, step: int, base: dict,
                     bundle: bool = False, teacher_source: dict | None = None,
                     verl_version: str | None = None) -> Path:
    """Write ``out_dir/README.md`` for the export of ``run``; returns its path.

    ``base`` is the student's base identity (``artifacts.base_identity``);
    ``teacher_source`` the teacher a bundle names (``teacher_source.teacher_identity``).
    """
    hub = require("huggingface_hub", "bridge")
    envs = recipe.environments or [recipe.environment]
    _, after = held_out(_events(run))
    results = None
    if after is not None:
        # A mixture's eval holds each environment's success: one result per environment.
        per_env = after.get("by_environment") if recipe.environments is not None else None
        figures = ([(e, per_env[e.name]["success"]) for e in envs if e.name in per_env]
                   if isinstance(per_env, dict) else [(envs[0], after["success"])])
        results = [hub.EvalResult(
            task_type="text-generation", dataset_type=f"miniverl/{env.name}",
            dataset_name=f"{env.name} ({env.difficulty}, held-out {after.get('split', 'eval')})",
            dataset_split=str(after.get("split", "eval")), metric_type="success",
            metric_name="held-out success", metric_value=float(success),
        ) for env, success in figures]
    hub_base = base.get("source") == "hub"
    data = hub.ModelCardData(
        base_model=base["hub_id"] if hub_base else None,
        library_name="peft" if kind == "lora" else "transformers",
        license=base_license(recipe),
        pipeline_tag="text-generation",
        tags=["miniverl", *(["lora"] if kind == "lora" else []),
              MODE_TAGS.get(recipe.run.mode, recipe.run.mode), "tool-use",
              *(env.name for env in envs)],
        model_name=run.name,
        eval_results=results,
        **({"base_model_revision": base.get("revision")} if hub_base else {}),
    )
    card = hub.ModelCard(f"---\n{data.to_yaml()}\n---\n"
                         + card_text(run, recipe, kind=kind, step=step, base=base,
                                     bundle=bundle, teacher_source=teacher_source,
                                     verl_version=verl_version))
    path = Path(out_dir) / README
    card.save(path)
    return path
