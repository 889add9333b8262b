"""Level 1: standard artifacts out of a run directory (PEFT adapter or HF model + tokenizer).

``export_adapter(run, out)`` takes the run's latest ``checkpoints/step_N/`` and writes a
directory that ``PeftModel.from_pretrained(base, out)`` loads (``adapter_config.json``,
``adapter_model.safetensors``) plus the tokenizer files and a model card (``README.md``,
:mod:`~miniverl.bridge.model_card`); a full fine-tune run gives a
plain Hugging Face model directory instead. Files are copied byte for byte (weights are
never re-serialised) into a temporary directory that is renamed into place.

Accepted checkpoint layouts, at the step directory or in an ``adapter/`` or ``model/``
subdirectory: PEFT files (``adapter_config.json`` + ``adapter_model.safetensors``), or an
HF model (``config.json`` + ``model*.safetensors``). Pickled weights (``*.bin``) are
refused. The tokenizer comes from the checkpoint (or its ``tokenizer/``) when saved
there, else from the recipe's student model directory.

JSON files are written as they always were (indent 2, UTF-8 kept, ``default=str``, NaN
allowed) through the atomic writer; ``bundle.py`` and ``importer.py`` do the same.

This module reads runs and copies files; torch, transformers and peft are not imported.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from miniverl.bridge.model_card import write_model_card
from miniverl.common.atomic import atomic_write_json, publishing
from miniverl.common.errors import ConfigError, ProvenanceError
from miniverl.common.hashing import sha256_file
from miniverl.common.modeling import resolve_model_dir
from miniverl.common.recipe import Recipe, load_recipe
from miniverl.common.tokenizer_id import tokenizer_fingerprint

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MODEL_CONFIG_FILES = ("config.json", "generation_config.json")
_STEP = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    """The weights of one checkpoint: ``kind`` is ``lora`` or ``full``."""

    step: int
    kind: str
    weights_dir: Path
    tokenizer_dir: Path | None


def load_run_recipe(run: Path) -> Recipe:
    """The run's resolved recipe (``recipe.resolved.yaml``, else ``recipe.yaml``)."""
    for name in ("recipe.resolved.yaml", "recipe.yaml"):
        if (run / name).is_file():
            return load_recipe(run / name)
    raise ConfigError(
        f"{run} has no recipe.resolved.yaml; pass a run directory made by `miniverl train`"
    )


def latest_checkpoint(run: Path) -> Checkpoint:
    """The highest ``checkpoints/step_N`` of ``run`` and what kind of weights it holds."""
    ckpt_root = run / "checkpoints"
    steps = sorted(
        (int(m.group(1)), p)
        for p in (ckpt_root.iterdir() if ckpt_root.is_dir() else [])
        if p.is_dir() and (m := _STEP.match(p.name))
    )
    if not steps:
        raise ConfigError(
            f"{run} has no checkpoints/step_N/ directory; train until a checkpoint is saved "
            "(train.save_every, or the end of the run) and export again"
        )
    step, step_dir = steps[-1]
    weights_dir, kind = None, None
    for candidate in (step_dir, step_dir / "adapter", step_dir / "model"):
        if all((candidate / f).is_file() for f in ADAPTER_FILES):
            weights_dir, kind = candidate, "lora"
            break
        if (candidate / "config.json").is_file() and any(candidate.glob("model*.safetensors")):
            weights_dir, kind = candidate, "full"
            break
    if weights_dir is None:
        pickled = sorted(p.name for p in step_dir.rglob("*.bin"))
        hint = f" (found pickled {pickled}; miniverl loads safetensors only)" if pickled else ""
        raise ConfigError(
            f"{step_dir} holds neither a PEFT adapter ({' + '.join(ADAPTER_FILES)}) nor an HF "
            f"model (config.json + model.safetensors){hint}; export from a complete checkpoint"
        )
    tok_dir = None
    for candidate in (step_dir / "tokenizer", step_dir, weights_dir):
        if (candidate / "tokenizer.json").is_file():
            tok_dir = candidate
            break
    return Checkpoint(step, kind, weights_dir, tok_dir)


def student_model_dir(recipe) -> Path:
    """The local directory of the run's base student model (no download)."""
    return resolve_model_dir(recipe.student.model, offline=True)


def tokenizer_source(run: Path, ckpt: Checkpoint, recipe) -> Path:
    if ckpt.tokenizer_dir is not None:
        return ckpt.tokenizer_dir
    model_dir = student_model_dir(recipe)
    if not (model_dir / "tokenizer.json").is_file():
        raise ConfigError(
            f"no tokenizer.json in the checkpoint or in the student model dir of {run.name}"
        )
    return model_dir


# Rebuilds a toy model into a directory. The spec and the destination travel as argv, so
# the code needs no quotes of its own and the command survives any shell quoting of it
# (a spec spliced into the code once lost its JSON quotes: NameError: name 'heads').
_TOY_REBUILD = (
    "import json, shutil, sys; from miniverl.common.toy import toy_model_dir; "
    "shutil.copytree(toy_model_dir(json.loads(sys.argv[1])), sys.argv[2])"
)


def base_identity(model, dest: str = "base-model") -> dict:
    """What a ``ModelSource`` names, without local paths.

    ``download`` is the exact shell command (``shlex``-quoted) that fetches, or for a toy
    rebuilds, the weights into ``./<dest>``.
    """
    if model.hub_id:
        return {
            "source": "hub",
            "hub_id": model.hub_id,
            "revision": model.revision,
            "download": shlex.join(
                ["huggingface-cli", "download", model.hub_id, "--revision", str(model.revision),
                 "--local-dir", dest]
            ),
        }
    if model.toy is not None:
        spec = model.toy.model_dump()
        return {
            "source": "toy",
            "toy": spec,
            "download": shlex.join(
                ["python", "-c", _TOY_REBUILD, json.dumps(spec, sort_keys=True), dest]
            ),
        }
    gguf = getattr(model, "gguf", None)
    if gguf:
        name = gguf if gguf == "smollm2" else Path(gguf).name
        return {
            "source": "gguf",
            "gguf": name,
            "download": shlex.join(["miniverl", "convert-gguf", name, "--out", dest]),
        }
    return {
        "source": "path",
        "directory_name": Path(model.path).name,
        "download": f"copy the model directory the run used into ./{dest} (a local path, not published)",
    }


def copy_files(src: Path, dst: Path, names) -> dict[str, str]:
    dst.mkdir(parents=True, exist_ok=True)
    digests = {}
    for name in names:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
            digests[name] = sha256_file(dst / name)
    return digests


def write_adapter_files(ckpt: Checkpoint, out: Path, identity: dict) -> dict:
    """Copy a LoRA checkpoint's PEFT files into ``out``; returns the adapter's config.

    ``base_model_name_or_path`` is rewritten to the hub id (or emptied): a local path
    would leak into a shared file, and ``PeftModel.from_pretrained(base, out)`` takes the
    base model explicitly anyway.
    """
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((ckpt.weights_dir / "adapter_config.json").read_text(encoding="utf-8"))
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(
            f"adapter peft_type {config.get('peft_type')!r} is not LORA; only LoRA adapters export"
        )
    config["base_model_name_or_path"] = identity.get("hub_id") or ""
    if identity.get("revision"):
        config["revision"] = identity["revision"]
    atomic_write_json(out / "adapter_config.json", config, default=str, allow_nan=True, shared=True)
    shutil.copyfile(
        ckpt.weights_dir / "adapter_model.safetensors", out / "adapter_model.safetensors"
    )
    return config


def write_full_model_files(ckpt: Checkpoint, out: Path) -> None:
    names = [p.name for p in ckpt.weights_dir.iterdir() if p.is_file()]
    keep = [
        n
        for n in names
        if n in MODEL_CONFIG_FILES
        or (n.startswith("model") and n.endswith((".safetensors", ".json")))
    ]
    copy_files(ckpt.weights_dir, out, keep)


def lora_shape(adapter_config: dict) -> dict:
    """rank, alpha and target modules as the adapter records them (verl must match them)."""
    targets = adapter_config.get("target_modules")
    if isinstance(targets, str):
        targets_out: str | list = targets
    else:
        targets_out = sorted(targets or [])
    return {
        "r": int(adapter_config.get("r", 0)),
        "alpha": adapter_config.get("lora_alpha"),
        "target_modules": targets_out,
    }


def export_adapter(run: Path, out: Path) -> dict:
    """Write the latest checkpoint of ``run`` to ``out`` as standard files; returns a summary."""
    run, out = Path(run), Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"output directory {out} is not empty; pass a new --out path")
    recipe = load_run_recipe(run)
    ckpt = latest_checkpoint(run)
    identity = base_identity(recipe.student.model)
    with publishing(out, folder=True) as tmp:
        if ckpt.kind == "lora":
            shape = lora_shape(write_adapter_files(ckpt, tmp, identity))
        else:
            write_full_model_files(ckpt, tmp)
            shape = None
        tok_files = copy_files(tokenizer_source(run, ckpt, recipe), tmp, TOKENIZER_FILES)
        if "tokenizer.json" not in tok_files:
            raise ProvenanceError(
                f"tokenizer of {run.name} has no tokenizer.json; cannot export it"
            )
        write_model_card(run, tmp, recipe, kind=ckpt.kind, step=ckpt.step, base=identity)
        summary = {
            "kind": ckpt.kind,
            "run_id": run.name,
            "step": ckpt.step,
            "base_model": identity,
            "lora": shape,
            "tokenizer_fp": tokenizer_fingerprint(tmp),
            "files": {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()},
        }
        atomic_write_json(tmp / "miniverl_export.json", summary, default=str, allow_nan=True, shared=True)
    return summary
