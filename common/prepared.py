"""Where a prepared model lives in the cache: a folder named by its prep recipe.

A teacher (or adapter) that a recipe's ``prepare:`` makes is trained once by the
student package (``miniverl.student.teacher_prep``) and kept under the cache root in a
folder whose name depends on the prep recipe only. The bridge needs that name too, to
say which prepared teacher a run used, and may not import the student package; so the
rule lives here. This module trains nothing and imports no torch.
"""

from __future__ import annotations

from pathlib import Path

from miniverl.common.recipe import Recipe, load_recipe, recipe_digest
from miniverl.common.toy import cache_root


def prep_cache_key(prep: Recipe) -> str:
    """The digest of a prep recipe that names its prepared model's folder."""
    # The output location and the run name do not change what is learned.
    neutral = prep.model_copy(
        update={"run": prep.run.model_copy(update={"output_dir": "-", "name": "teacher-prep"})}
    )
    return recipe_digest(neutral).split(":", 1)[1][:20]


def prepared_dir(prep_path: str | Path, *, adapter: bool = False,
                 root: Path | None = None) -> Path:
    """Where the model the prep recipe at ``prep_path`` makes is put (or found), under
    ``root`` (default: the cache root); an adapter's folder is under ``adapters/``, a
    whole model's under ``teachers/``."""
    kind = "adapters" if adapter else "teachers"
    base = cache_root() if root is None else root
    return base / kind / f"prepared-{prep_cache_key(load_recipe(prep_path))}"
