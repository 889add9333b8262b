"""Exact, pickle-free training checkpoints.

A checkpoint is a directory ``checkpoints/step_<N>/``::

    model.safetensors            full state dict (full fine-tune), or
    adapter_model.safetensors    the PEFT adapter only (+ adapter_config.json)
    config.json                  full fine-tunes: the model config, so the folder loads as an HF model
    optimizer.json / .safetensors
    scheduler.json / .safetensors
    rng.json / rng.safetensors   python ``random``, numpy, torch CPU (+ CUDA) states
    state.json                   step, version, data cursor, recipe digest, extra,
                                 the sha256 of every other file, and its own digest

Optimizer, scheduler and RNG states are nested Python structures holding tensors:
the tensors go to safetensors and the structure to JSON with tensors replaced by
references, so nothing is ever unpickled (no ``torch.save`` / ``torch.load``).
Everything is written into a temporary sibling directory that is renamed into
place, so ``step_<N>`` either exists complete or not at all.

Resuming restores parameters, optimizer moments, the schedule position, every RNG
and the data cursor, so N steps + resume + M steps equals N + M uninterrupted
steps bit for bit on CPU in deterministic mode. This module does not decide when
to checkpoint or how to compare recipes beyond their digests.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from miniverl.common.clock import utc_now
from miniverl.common.errors import ConfigError, ProvenanceError
from miniverl.common.hashing import SEAL_FIELD, seal, seal_status, sha256_file
from miniverl.common.recipe import diff_recipes

log = logging.getLogger(__name__)

FORMAT = "miniverl-checkpoint/2"  # 2: state.json is sealed (its own "digest")
UNSEALED_FORMAT = "miniverl-checkpoint/1"
STEP_DIR = re.compile(r"^step_(\d+)$")
MODEL_FILE = "model.safetensors"
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
STATE_FILE = "state.json"


@dataclass
class CheckpointState:
    """What a checkpoint recorded besides tensors (returned by :func:`load`)."""

    path: Path
    step: int
    version: int
    data_cursor: dict[str, Any] = field(default_factory=dict)
    recipe_digest: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    weights: str = "full"
    created: str = ""


# -- nested structures <-> (JSON tree, tensors) ---------------------------------------------------


def flatten_state(obj: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split a nested state (dicts, lists, tuples, scalars, tensors, ndarrays) in two.

    Returns a JSON-able tree, where each tensor is replaced by ``{"__tensor__": name}``,
    and the ``{name: tensor}`` dict. Tuples, non-string dict keys and non-finite
    floats are tagged so :func:`unflatten_state` rebuilds the exact same structure.
    """
    tensors: dict[str, torch.Tensor] = {}

    def enc(value: Any, where: str) -> Any:
        if isinstance(value, torch.Tensor):
            name = f"t{len(tensors)}"
            tensors[name] = value.detach().to("cpu").contiguous().clone()
            return {"__tensor__": name}
        if isinstance(value, np.ndarray):
            name = f"t{len(tensors)}"
            # Stored widened to int64/float64 with the original dtype recorded: safetensors'
            # torch side lacks some numpy dtypes (numpy's RNG key is uint32).
            wide = value.astype(np.int64 if value.dtype.kind in "iub" else np.float64)
            tensors[name] = torch.from_numpy(np.ascontiguousarray(wide))
            return {"__ndarray__": name, "dtype": value.dtype.str}
        if isinstance(value, np.generic):
            value = value.item()
        if value is None or isinstance(value, bool | int | str):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"__float__": repr(value)}
        if isinstance(value, tuple):
            return {"__tuple__": [enc(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [enc(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in value):
                return {k: enc(v, f"{where}.{k}") for k, v in value.items()}
            return {
                "__items__": [[enc(k, where), enc(v, f"{where}[{k!r}]")] for k, v in value.items()]
            }
        if isinstance(value, torch.dtype):
            return {"__dtype__": str(value).removeprefix("torch.")}
        raise TypeError(
            f"checkpoint state at {where or '<root>'} holds a {type(value).__name__}, which "
            f"cannot be stored without pickle"
        )

    return enc(obj, ""), tensors


def unflatten_state(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten_state`."""
    if isinstance(tree, list):
        return [unflatten_state(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "__tensor__" in tree:
        return tensors[tree["__tensor__"]]
    if "__ndarray__" in tree:
        return tensors[tree["__ndarray__"]].numpy().astype(np.dtype(tree["dtype"]))
    if "__float__" in tree:
        return float(tree["__float__"])
    if "__tuple__" in tree:
        return tuple(unflatten_state(v, tensors) for v in tree["__tuple__"])
    if "__items__" in tree:
        return {
            unflatten_state(k, tensors): unflatten_state(v, tensors) for k, v in tree["__items__"]
        }
    if "__dtype__" in tree:
        return getattr(torch, tree["__dtype__"])
    return {k: unflatten_state(v, tensors) for k, v in tree.items()}


def _write_state(directory: Path, stem: str, obj: Any) -> None:
    tree, tensors = flatten_state(obj)
    save_file(tensors, str(directory / f"{stem}.safetensors"), metadata={"format": FORMAT})
    (directory / f"{stem}.json").write_text(json.dumps(tree, allow_nan=False), encoding="utf-8")


def _read_state(directory: Path, stem: str) -> Any:
    tree = json.loads((directory / f"{stem}.json").read_text(encoding="utf-8"))
    return unflatten_state(tree, load_file(str(directory / f"{stem}.safetensors"), device="cpu"))


# -- model weights -------------------------------------------------------------------------------------


def _is_peft(model: Any) -> bool:
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses tensors sharing storage (tied embeddings); give each its own.
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in state.items():
        tensor = tensor.detach().to("cpu").contiguous()
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[name] = tensor
    return out


def _save_weights(directory: Path, model: torch.nn.Module) -> str:
    if _is_peft(model):
        from peft import get_peft_model_state_dict

        adapter_name = getattr(model, "active_adapter", "default")
        if not isinstance(adapter_name, str):
            adapter_name = adapter_name[0]
        state = get_peft_model_state_dict(model, adapter_name=adapter_name)
        save_file(_unshared(state), str(directory / ADAPTER_FILE), metadata={"format": "pt"})
        model.peft_config[adapter_name].save_pretrained(str(directory))
        return "adapter"
    save_file(_unshared(model.state_dict()), str(directory / MODEL_FILE), metadata={"format": "pt"})
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_json_file"):
        # config.json beside model.safetensors makes a full checkpoint an ordinary HF
        # model directory (export-adapter / export-verl copy it as is).
        config.to_json_file(str(directory / "config.json"))
    return "full"


def _load_weights(directory: Path, model: torch.nn.Module, weights: str) -> None:
    if weights == "adapter":
        if not _is_peft(model):
            raise ProvenanceError(
                f"{directory} holds a LoRA adapter but the model is not a PEFT model; build "
                f"the student with the recipe's student.lora before resuming"
            )
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(str(directory / ADAPTER_FILE)))
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise ProvenanceError(
                f"{directory}: adapter keys {unexpected[:3]} do not exist in this model; the "
                f"LoRA settings differ from the run that wrote the checkpoint"
            )
        return
    if _is_peft(model):
        raise ProvenanceError(
            f"{directory} holds full weights but the model is a PEFT model; resume with "
            f"student.lora: null as in the run that wrote it"
        )
    try:
        model.load_state_dict(load_file(str(directory / MODEL_FILE)), strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise ProvenanceError(
            f"{directory}: weights do not fit this model ({first}); resume with the model "
            f"the run was started with"
        ) from exc


# -- RNG --------------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """The states of python ``random``, numpy's global RNG, torch CPU and every CUDA device."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:  # fewer/more devices now: restore what lines up, starting at device 0
            for index, device_state in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(device_state, index)


# -- save / load -----------------------------------------------------------------------------------------


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        with path.open("rb") as fh:
            os.fsync(fh.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(
    checkpoints_dir: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    step: int,
    version: int,
    data_cursor: dict[str, Any] | None = None,
    recipe_digest: str | None = None,
    rng: bool = True,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``checkpoints_dir/step_<step>`` atomically and return its path.

    ``model`` may be a PEFT model, in which case only the adapter is stored.
    ``data_cursor`` and ``extra`` must be JSON-able. An existing checkpoint of the
    same step is replaced only once the new one is complete.
    """
    root = Path(checkpoints_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{int(step)}"
    tmp = root / f".step_{int(step)}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        weights = _save_weights(tmp, model)
        if optimizer is not None:
            _write_state(tmp, "optimizer", optimizer.state_dict())
        if scheduler is not None:
            _write_state(tmp, "scheduler", scheduler.state_dict())
        if rng:
            _write_state(tmp, "rng", rng_state())
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        state = {
            "format": FORMAT,
            "step": int(step),
            "version": int(version),
            "data_cursor": data_cursor or {},
            "recipe_digest": recipe_digest,
            "extra": extra or {},
            "weights": weights,
            "created": utc_now(timespec="seconds"),
            "torch": torch.__version__,
            "files": files,
        }
        (tmp / STATE_FILE).write_text(  # sealed: the file digests cover the rest, not itself
            json.dumps(seal(state), indent=1, allow_nan=False), encoding="utf-8"
        )
        _fsync_tree(tmp)
        if final.exists():
            old = root / f".step_{int(step)}.old-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_state(path: str | Path) -> CheckpointState:
    """The recorded metadata of a checkpoint, without touching its tensors."""
    path = Path(path)
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ProvenanceError(
            f"{path}: not a complete checkpoint ({STATE_FILE} unreadable: {exc}); pick another "
            f"with `latest()` or start a new run"
        ) from exc
    if not isinstance(state, dict) or state.get("format") not in (FORMAT, UNSEALED_FORMAT):
        found = state.get("format") if isinstance(state, dict) else None
        raise ProvenanceError(f"{path}: format {found!r} is not {FORMAT!r}")
    sealed = seal_status(state, required=state["format"] == FORMAT)
    if sealed == "mismatch":
        raise ProvenanceError(
            f"{path / STATE_FILE} does not match its {SEAL_FIELD} (sha256 of its content): "
            "it was modified or corrupted; resume from another checkpoint or start a new run"
        )
    if sealed == "unsigned":
        log.warning("warning: %s has no %s (written before state files were sealed): changes "
                    "to its step, version and cursor cannot be detected", path / STATE_FILE,
                    SEAL_FIELD)
    return CheckpointState(
        path=path,
        step=int(state["step"]),
        version=int(state["version"]),
        data_cursor=state.get("data_cursor") or {},
        recipe_digest=state.get("recipe_digest"),
        extra=state.get("extra") or {},
        weights=state.get("weights", "full"),
        created=state.get("created", ""),
    )


def verify(path: str | Path) -> list[str]:
    """Recompute every file's sha256 against ``state.json``; one line per problem."""
    path = Path(path)
    files = json.loads((path / STATE_FILE).read_text(encoding="utf-8")).get("files", {})
    problems = []
    for name, digest in sorted(files.items()):
        file = path / name
        if not file.is_file():
            problems.append(f"{file}: missing")
        elif sha256_file(file) != digest:
            problems.append(f"{file}: sha256 differs from {STATE_FILE} (modified or corrupted)")
    return problems


def load(
    path: str | Path,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    *,
    restore_rng: bool = True,
) -> CheckpointState:
    """Restore a checkpoint into the given objects (any may be None) and return its state.

    Every file is checked against its recorded sha256 first; a mismatch raises
    :class:`ProvenanceError` before anything is modified.
    """
    state = read_state(path)
    problems = verify(state.path)
    if problems:
        raise ProvenanceError(f"checkpoint {state.path} is damaged: {problems[0]}")
    if model is not None:
        _load_weights(state.path, model, state.weights)
    if optimizer is not None:
        optimizer.load_state_dict(_read_state(state.path, "optimizer"))
    if scheduler is not None:
        scheduler.load_state_dict(_read_state(state.path, "scheduler"))
    if restore_rng and (state.path / "rng.json").exists():
        set_rng_state(_read_state(state.path, "rng"))
    return state


def list_checkpoints(checkpoints_dir: str | Path) -> list[Path]:
    """Complete ``step_<N>`` checkpoints, oldest first (temporary directories skipped)."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return [p for _, p in sorted(found)]


def latest(checkpoints_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(checkpoints_dir)
    return found[-1] if found else None


def check_recipe_digest(
    state: CheckpointState,
    digest: str,
    *,
    saved_recipe: Any = None,
    current_recipe: Any = None,
) -> None:
    """Refuse to resume a checkpoint written under another recipe.

    With both recipes given (the run's ``recipe.resolved.yaml`` and the one now in
    use), the error names every differing field via ``common.recipe.diff_recipes``.
    """
    if state.recipe_digest is None or state.recipe_digest == digest:
        return
    detail = ""
    if saved_recipe is not None and current_recipe is not None:
        fields = diff_recipes(saved_recipe, current_recipe)
        if fields:
            detail = f"; differing fields: {', '.join(fields)}"
    raise ConfigError(
        f"checkpoint {state.path} was written under recipe {state.recipe_digest}, but this "
        f"recipe is {digest}{detail}; resume with the run's own recipe.yaml or start a new run"
    )
