"""Load a frozen teacher: where the weights come from, on which device, in which dtype.

A :class:`TeacherSpec` names the model the way a user does (a local Hugging Face
directory, a hub id at a pinned revision, or the teacher section of a recipe, whose
toy spec resolves to a cached toy directory) plus an optional PEFT adapter, or several
named ones (``adapters``, issue #42).
:func:`load_teacher` resolves it, loads it through ``common/modeling.py`` (the same
path the student uses), merges the one adapter (or loads the named ones side by side
into one PEFT model over the one base, unmerged), freezes the weights and puts the
model in eval mode, and returns a :class:`LoadedTeacher` with everything ``HELLO_OK``
needs: tokenizer fingerprint, vocabulary size, identity ``{name, model, revision,
adapter_sha256}`` and the named adapters' digests.

``offline=True`` never touches the network; a hub model missing from the local cache
is reported with the files that are missing. This module does not score or serve.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from miniverl.common.adapters import (
    ADAPTER_FILES,
    PINNED_HUB_ADAPTER,
    adapter_dir,
    adapter_sha256,
    resolve_dir,
)
from miniverl.common.errors import ConfigError
from miniverl.common.modeling import load_causal_lm, resolve_model_dir, use_fp32_head
from miniverl.common.names import name_problem
from miniverl.common.recipe import load_recipe
from miniverl.common.tokenizer_id import tokenizer_fingerprint
from miniverl.common.toy import toy_model_dir
from miniverl.protocol.messages import MAX_ADAPTERS


@dataclass(frozen=True)
class TeacherSpec:
    """What to load: ``model`` is a local directory or a hub id (then ``revision`` is required).

    ``adapter`` is merged into the weights; ``adapters`` (name -> a directory or a pinned
    hub id ``ORG/NAME@<40-hex>``, at most 64; not with ``adapter``) are served side by
    side over the one base, each under its name (docs/teacher-server.md, "Several
    adapters in one process").
    """

    model: str
    revision: str | None = None
    adapter: str | None = None
    adapter_revision: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    quantization: str = "none"
    offline: bool = False
    name: str | None = None
    adapters: dict[str, str] | None = None
    # The output layer in float32 (loss.fp32_head, common/modeling.py use_fp32_head): the
    # teacher serves distillation targets, so it is on unless the recipe turns it off.
    fp32_head: bool = True

    def with_model(
        self, model: str, revision: str | None, adapter: str | None,
        adapter_revision: str | None = None,
    ) -> TeacherSpec:
        """The same placement (device, dtype, quantization, offline) for another model (RELOAD).

        ``name`` is not kept: it named the previous model. ``adapters`` are kept: a
        teacher serving named adapters serves the same ones over the new model.
        """
        return replace(
            self, model=model, revision=revision, adapter=adapter,
            adapter_revision=adapter_revision, name=None,
        )


@dataclass
class LoadedTeacher:
    """A frozen teacher in eval mode and its identity."""

    model: Any
    model_dir: Path
    tokenizer_fp: str
    vocab_size: int
    info: dict[str, Any]  # HELLO_OK ``teacher``: name, model, revision, adapter_sha256
    device: str
    dtype: str
    extra: dict[str, Any] = field(default_factory=dict)
    context_len: int | None = None  # tokens the model attends over (None: unknown)
    adapters: dict[str, str] = field(default_factory=dict)  # served name -> adapter_sha256


def recipe_teacher(recipe: Any, path: str | Path, name: str | None) -> Any:
    """The recipe's teacher section, or with ``name`` the one of its ``teachers:``
    (several teachers, docs/several-teachers.md); ``ConfigError`` when there is none."""
    if name is None:
        return recipe.teacher
    if name not in (recipe.teachers or {}):
        raise ConfigError(
            f"--recipe-teacher {name}: recipe {str(path)!r} has no teacher {name!r} under "
            f"teachers:; name one of {', '.join(recipe.teachers or {}) or '(none)'}")
    return recipe.teachers[name]


def spec_from_recipe(path: str | Path, *, offline: bool = False,
                     teacher_name: str | None = None) -> TeacherSpec:
    """The teacher section of a recipe (``teacher_name``: one of its ``teachers:``) as a
    :class:`TeacherSpec` (a toy spec is built now)."""
    recipe = load_recipe(path)
    teacher = recipe_teacher(recipe, path, teacher_name)
    if teacher is None:
        raise ConfigError(
            f"recipe {str(path)!r} has no teacher section; add one or pass --model DIR|ID"
        )
    source = teacher.model
    if source.toy is not None:
        model, revision, name = str(toy_model_dir(source.toy)), None, "toy-teacher"
    elif source.path is not None:
        model, revision, name = source.path, None, None
    elif source.gguf is not None:
        # Converted once into the cache (common/gguf_import.py); served as that directory.
        model, revision, name = str(resolve_model_dir(source, offline=offline)), None, None
    else:
        model, revision, name = source.hub_id, source.revision, None
    return TeacherSpec(
        model=model, revision=revision, adapter=teacher.adapter,
        adapter_revision=teacher.adapter_revision, device=teacher.device, dtype=teacher.dtype,
        quantization=teacher.quantization, offline=offline, name=name,
        adapters=dict(teacher.adapters) if teacher.adapters else None,
        fp32_head=recipe.loss.fp32_head is not False,
    )


def parse_adapters(pairs: list[str] | None) -> dict[str, str] | None:
    """``["calc=DIR", ...]`` (``--adapters``, repeatable) -> ``{"calc": "DIR"}``, checked
    by :func:`check_adapters`; None when there are none. Raises :class:`ConfigError`
    (one line naming the value, the rule and the fix)."""
    if not pairs:
        return None
    adapters: dict[str, str] = {}
    for pair in pairs:
        name, sep, ref = pair.partition("=")
        if not sep or not ref:
            raise ConfigError(f"--adapters {pair!r} is not NAME=DIR; pass the name clients ask "
                              "for and the adapter directory, e.g. --adapters calc=adapters/calc")
        if name in adapters:
            raise ConfigError(f"--adapters {pair!r}: the name {name!r} is given twice; give "
                              "each adapter its own name")
        adapters[name] = ref
    check_adapters(adapters)
    return adapters


def check_adapters(adapters: dict[str, str]) -> None:
    """The rules of named adapters, before anything loads: at most 64, each name as the
    wire allows it (common/names.py: 1-64 letters, digits, ``_``, ``-``, ``.``), each value an adapter directory (with
    ``adapter_config.json`` and ``adapter_model.safetensors``) or a pinned hub id."""
    if len(adapters) > MAX_ADAPTERS:
        raise ConfigError(f"--adapters: {len(adapters)} adapters; a teacher serves at most "
                          f"{MAX_ADAPTERS}; serve the rest from another teacher")
    for name, ref in adapters.items():
        problem = name_problem(name, "adapter")  # the wire's AdapterName: common/names.py
        if problem is not None:
            raise ConfigError(f"--adapters {name[:40]!r}={ref[:200]}: {problem} (e.g. calc=DIR)")
        if Path(ref).expanduser().is_dir():
            missing = [f for f in ADAPTER_FILES if not (Path(ref).expanduser() / f).is_file()]
            if missing:
                raise ConfigError(f"--adapters {name}={ref}: not a PEFT adapter directory (no "
                                  f"{', '.join(missing)}); save the adapter with "
                                  "PeftModel.save_pretrained (safetensors)")
        elif not PINNED_HUB_ADAPTER.match(ref):
            raise ConfigError(f"--adapters {name}={ref}: no such directory, nor a pinned hub id "
                              "ORG/NAME@<40-hex>; pass an adapter directory saved with "
                              "PeftModel.save_pretrained, or pin the hub adapter's commit")


def _load_named_adapters(model: Any, adapters: dict[str, str], offline: bool):
    """The base wrapped once in a PeftModel holding every named adapter (unmerged; the
    server picks one per batch with ``set_adapter``), and their digests."""
    from peft import PeftModel

    digests: dict[str, str] = {}
    for name, ref in adapters.items():
        where = adapter_dir(ref, offline)
        digests[name] = adapter_sha256(where)
        # PEFT injects each adapter's layers beside the base weights it wraps: the base is
        # held once however many adapters are loaded.
        if isinstance(model, PeftModel):
            model.load_adapter(str(where), adapter_name=name, is_trainable=False)
        else:
            model = PeftModel.from_pretrained(model, str(where), adapter_name=name,
                                              is_trainable=False)
    return model, digests


def load_teacher(spec: TeacherSpec) -> LoadedTeacher:
    """Resolve, load, merge the adapter (or load the named ones), freeze. Raises
    :class:`ConfigError` on bad input."""
    import torch

    if spec.adapters and spec.adapter:
        raise ConfigError("--adapter (one adapter, merged) and --adapters NAME=DIR (several, "
                          "served by name) do not go together; pass one of them")
    if spec.adapters:
        check_adapters(spec.adapters)
    model_dir = resolve_dir(spec.model, spec.revision, spec.offline)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(
            f"model directory {str(model_dir)!r} has no config.json; point --model at a "
            "directory saved with save_pretrained"
        )
    model = load_causal_lm(
        model_dir, dtype=spec.dtype, device=spec.device, quantization=spec.quantization
    )
    adapter_digest = None
    if spec.adapter:
        from peft import PeftModel

        one = resolve_dir(spec.adapter, spec.adapter_revision, spec.offline, what="adapter")
        adapter_digest = adapter_sha256(one)
        # Merged once at load: the teacher is frozen, so the adapter never changes and a
        # merged model scores at base-model speed.
        model = PeftModel.from_pretrained(model, str(one), is_trainable=False)
        model = model.merge_and_unload()
    digests: dict[str, str] = {}
    if spec.adapters:
        model, digests = _load_named_adapters(model, spec.adapters, spec.offline)
    model.requires_grad_(False)
    model.eval()
    if spec.fp32_head:
        use_fp32_head(model)
    weight = model.get_output_embeddings().weight
    is_hub = not Path(spec.model).expanduser().is_dir()
    name = spec.name or (spec.model if is_hub else Path(spec.model).expanduser().name)
    for adapter in digests:
        if len(name) + 1 + len(adapter) > 1024:  # a HELLO_OK names it "{name}/{adapter}"
            raise ConfigError(f"--adapters {adapter[:40]!r}...: the adapter's identity "
                              f"{name[:40]!r}/... would pass the wire's 1024 characters; "
                              "give the adapter a shorter name")
    return LoadedTeacher(
        model=model,
        model_dir=model_dir,
        tokenizer_fp=tokenizer_fingerprint(model_dir),
        vocab_size=int(weight.shape[0]),
        info={
            "name": name,
            "model": spec.model,
            "revision": spec.revision,
            "adapter_sha256": adapter_digest,
        },
        device=str(weight.device),
        dtype=str(weight.dtype).removeprefix("torch."),
        extra={"threads": torch.get_num_threads()},
        context_len=context_length(model.config, model_dir),
        adapters=digests,
    )


# Tokenizers without a known limit store transformers' VERY_LARGE_INTEGER (1e30) or other
# placeholders; a model_max_length beyond this is not a context length.
SANE_MODEL_MAX_LENGTH = 1 << 24


def context_length(config: Any, model_dir: Path) -> int | None:
    """The longest sequence the model scores meaningfully: ``max_position_embeddings``,
    or the tokenizer's ``model_max_length`` when that is smaller and sane; None when
    neither says."""
    candidates = []
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        candidates.append(positions)
    try:
        tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        tok_config = {}
    length = tok_config.get("model_max_length") if isinstance(tok_config, dict) else None
    if isinstance(length, int) and 0 < length <= SANE_MODEL_MAX_LENGTH:
        candidates.append(length)
    return min(candidates) if candidates else None
