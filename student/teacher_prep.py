"""Make a teacher competent before it supervises anything, once, then reuse it.

A recipe's ``teacher.prepare`` names an ``sft`` recipe whose student is the teacher's
base model. :func:`prepare_teacher` runs that recipe with the ordinary trainer,
evaluates the result, and saves it as an ordinary HF directory (weights + tokenizer)
in the per-user cache, keyed by the prep recipe's digest. A second call with the same
prep recipe returns the cached directory at once; the teacher server then loads it
through the same ``from_pretrained`` path as any model. The preparation's greedy
held-out eval is saved as the teacher's qualification record, so a recipe's
``teacher.min_success`` refuses a preparation that did not make the teacher competent.

A specialist that is an adapter of a shared base (``teacher.adapters``, served by one
process) is prepared the same way with ``adapter=True``: the prep recipe trains the
base with ``student.lora``, and the adapter alone is saved (``PeftModel.save_pretrained``:
``adapter_config.json`` + ``adapter_model.safetensors``) under ``<cache>/adapters/``,
unmerged, with the same record; it has no qualification record of its own (a served
adapter is not gated, docs/several-teachers.md).

This module does not serve the teacher; it only produces the directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from miniverl.common.errors import ConfigError
from miniverl.common.prepared import prepared_dir as common_prepared_dir
from miniverl.common.recipe import Recipe, load_recipe, recipe_digest
from miniverl.common.toy import cache_root
from miniverl.student.qualify import record_from_eval, save_record, stored_dir

PREPARED_FILE = "miniverl_prepared.json"


@dataclass
class PreparedTeacher:
    model_dir: Path
    cached: bool
    record: dict[str, Any]


def prep_recipe_path(recipe: Recipe, recipe_path: str | Path) -> Path | None:
    """The prep recipe named by ``teacher.prepare``, resolved against the recipe's folder."""
    if recipe.teacher is None or not recipe.teacher.prepare:
        return None
    path = Path(recipe.teacher.prepare)
    if not path.is_absolute():
        path = Path(recipe_path).resolve().parent / path
    if not path.is_file():
        raise ConfigError(
            f"teacher.prepare: {recipe.teacher.prepare!r} does not exist (looked at {path}); "
            "point it at an sft recipe relative to this recipe"
        )
    return path


def prepared_dir(recipe: Recipe | None, prep_path: str | Path, *, adapter: bool = False) -> Path:
    """Where :func:`prepare_teacher` puts (or finds) the teacher for this prep recipe
    (the directory depends on the prep recipe only; an adapter's is under ``adapters/``;
    the rule is :func:`miniverl.common.prepared.prepared_dir`)."""
    return common_prepared_dir(prep_path, adapter=adapter, root=cache_root())


def prepare_teacher(
    recipe: Recipe, prep_path: str | Path, *, show_progress: bool = True
) -> PreparedTeacher:
    """Train (or fetch from cache) the teacher named by ``recipe.teacher.prepare``."""
    return prepare_model(prep_path, recipe.teacher.model, what="teacher.prepare",
                         model_field="teacher.model", show_progress=show_progress)


def prepare_model(
    prep_path: str | Path, model: Any, *, what: str, model_field: str = "the model",
    show_progress: bool = True, adapter: bool = False,
) -> PreparedTeacher:
    """Train (or fetch from cache) the model the sft recipe ``prep_path`` makes of
    ``model`` (a recipe's model source); ``what`` and ``model_field`` name the settings
    in messages. ``adapter``: keep the recipe's LoRA adapter alone, unmerged (the
    module docstring).

    ``prepare_teacher`` is this for a recipe's teacher; the benchmark also warms its
    student this way (``student_prepare``).
    """
    prep = load_recipe(prep_path)
    if prep.run.mode != "sft":
        raise ConfigError(
            f"{what}: {prep_path} has run.mode {prep.run.mode!r}; a model is "
            "prepared by an sft recipe (run.mode: sft)"
        )
    if prep.student.model != model:
        raise ConfigError(
            f"{what}: {prep_path} trains {prep.student.model.describe()}, but "
            f"{model_field} is {model.describe()}; make them the same model"
        )
    if adapter and prep.student.lora is None:
        raise ConfigError(
            f"{what}: {prep_path} trains the whole model (student.lora is null), and an "
            "adapter is what a LoRA run trains; set student.lora in it")
    final = prepared_dir(None, prep_path, adapter=adapter)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    if (final / PREPARED_FILE).is_file():
        return PreparedTeacher(final, True, json.loads((final / PREPARED_FILE).read_text()))
    with FileLock(str(root / f"{final.name}.lock")):
        if (final / PREPARED_FILE).is_file():
            return PreparedTeacher(final, True, json.loads((final / PREPARED_FILE).read_text()))
        return PreparedTeacher(final, False,
                               _train(prep, Path(prep_path), final, show_progress, adapter))


def _train(prep: Recipe, prep_path: Path, final: Path, show_progress: bool,
           adapter: bool = False) -> dict[str, Any]:
    # The trainer loads torch; `miniverl up` imports this module for its recipe paths
    # only, so the supervisor process stays torch-free (start-up).
    from miniverl.student.train.trainer import Trainer

    work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        prep = prep.model_copy(
            update={"run": prep.run.model_copy(update={"output_dir": str(work / "runs")})}
        )
        t0 = time.perf_counter()
        with Trainer(prep, recipe_text=prep_path.read_text(encoding="utf-8"),
                     show_progress=show_progress, write_report=False,
                     checkpoints=False) as trainer:
            result = trainer.train()
            out = work / "model"
            model = trainer.state.policy.model
            if adapter:  # the adapter alone: served by name over the base it was trained on
                model.save_pretrained(out)
            else:
                if hasattr(model, "merge_and_unload"):
                    # A LoRA-trained teacher is served as plain weights: merge the adapter.
                    model = model.merge_and_unload()
                model.save_pretrained(out)
                trainer.state.policy.tokenizer.save_pretrained(out)
        record = {
            "prep_recipe": str(prep_path),
            "prep_digest": recipe_digest(prep),
            "steps": result.steps,
            "eval": result.eval,
            # Every periodic evaluation too: a benchmark's plateau rule reads the last two.
            "evals": [{"update": int(e["version"]), "greedy": e.get("success"),
                       "t1": (e.get("sampled") or {}).get("success"), "split": e.get("split")}
                      for e in trainer.state.run.read_jsonl("events.jsonl")
                      if e.get("event") == "eval"],
            "wall_s": time.perf_counter() - t0,
        }
        # Qualified before it is published: a process that finds PREPARED_FILE (the
        # lock-free check above) gates the teacher at once, so its record must exist
        # by then (it did not, while a large directory's digest was computed after the
        # rename: the gate then found no record for a freshly prepared teacher).
        if not adapter:
            _qualify(prep, out, final, result.eval, trainer.state.policy.tokenizer_fp)
        (out / PREPARED_FILE).write_text(json.dumps(record, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(out, final)
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _qualify(prep: Recipe, out: Path, final: Path, summary: dict[str, Any] | None,
             tokenizer_fp: str) -> None:
    """The preparation's own greedy held-out eval is the teacher's qualification record
    (student/qualify.py), so ``teacher.min_success`` can gate a prepared teacher. Written
    while the weights are still in ``out``, for the directory ``final`` they move to (the
    digest covers the files, not their folder)."""
    if summary is None or not prep.eval.greedy:
        return
    identity = {"name": final.name, "model": str(final), "revision": None,
                "adapter_sha256": None}
    record = record_from_eval(summary, prep, identity=identity, model_dir=out,
                              tokenizer_fp=tokenizer_fp)
    record["model_dir"] = stored_dir(final)
    save_record(record, beside=out)
