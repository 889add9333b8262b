"""Model and tokenizer loading: one path for toy and real models.

``resolve_model_dir`` turns a recipe ``ModelSource`` (``toy`` spec, local ``path``, or
pinned ``hub_id`` + ``revision``) into a local Hugging Face directory; ``load_tokenizer``
and ``load_causal_lm`` then load *any* such directory with ``from_pretrained``. The
toy stack is not special-cased after resolution.

This module does not train, sample or score. torch, transformers and huggingface_hub
are imported inside the functions, so ``miniverl.common`` imports without them.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from .errors import ConfigError, MissingExtraError
from .gguf_import import convert_gguf, smollm2_gguf
from .toy import toy_model_dir

# peft imports bitsandbytes when it is installed; on a CPU with AVX512-BF16 its CPU
# backend then logs "Failed to load CPU gemm_4bit_forward from kernels-community" at
# import, in every process, for a 4-bit CPU kernel miniverl never uses (4-bit students
# are CUDA-only, student/quant.py). Only that one logger is quietened.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "nf4", "int8")


def _field(source: Any, name: str) -> Any:
    if isinstance(source, dict):
        return source.get(name)
    return getattr(source, name, None)


def resolve_model_dir(source: Any, offline: bool = False) -> Path:
    """A local HF directory for a ``ModelSource`` (toy | path | gguf | hub_id + revision).

    ``offline=True`` never touches the network: a hub model must already be in the
    local Hugging Face cache, otherwise a ConfigError says what is missing.
    """
    toy = _field(source, "toy")
    path = _field(source, "path")
    hub_id = _field(source, "hub_id")
    gguf = _field(source, "gguf")
    named = (("toy", toy), ("path", path), ("hub_id", hub_id), ("gguf", gguf))
    chosen = [name for name, v in named if v]
    if len(chosen) != 1:
        raise ConfigError(
            f"model source sets {chosen or 'nothing'}; it must set exactly one of "
            "'toy', 'path', 'gguf' or 'hub_id' (+ 'revision')"
        )
    if toy is not None:
        return toy_model_dir(toy)
    if gguf:
        # Converted once into <cache>/gguf/ and reused: a second call returns at once.
        return convert_gguf(smollm2_gguf() if gguf == "smollm2" else Path(gguf))
    if path:
        p = Path(path).expanduser()
        if not (p / "config.json").is_file():
            raise ConfigError(
                f"model path {str(p)!r} has no config.json; point 'path' at a Hugging Face "
                "model directory (one saved with save_pretrained)"
            )
        return p
    revision = _field(source, "revision")
    if not revision:
        raise ConfigError(
            f"hub model {hub_id!r} has no 'revision'; pin the 40-hex commit so runs are "
            "reproducible (see the model's 'Files and versions' page)"
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("huggingface_hub", "train") from exc
    try:
        return Path(
            snapshot_download(repo_id=hub_id, revision=revision, local_files_only=offline)
        )
    except Exception as exc:
        if offline:
            raise ConfigError(
                f"hub model {hub_id!r} at revision {revision} is not in the local Hugging "
                "Face cache and offline mode forbids downloading it; run once online, or "
                "`huggingface-cli download "
                f"{hub_id} --revision {revision}`, or use 'path' to a local directory"
            ) from exc
        raise ConfigError(
            f"could not download hub model {hub_id!r} at revision {revision}: "
            f"{type(exc).__name__}: {exc}; check the id, the revision and your network"
        ) from exc


def load_tokenizer(model_dir: str | Path):
    """The tokenizer saved in a local HF directory (a fast tokenizer with a chat template)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("transformers", "train") from exc
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    if not getattr(tok, "chat_template", None):
        raise ConfigError(
            f"tokenizer in {str(model_dir)!r} has no chat template; miniverl renders "
            "episodes with it, so use an instruct/chat model's tokenizer"
        )
    return tok


def resolve_device(device: str = "auto"):
    """``auto`` → first CUDA device if present, else CPU; ``cuda[:N]`` must exist."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {device!r} requested but CUDA is not available; use 'cpu' or 'auto'"
            )
        dev = torch.device(device)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {device!r} does not exist ({torch.cuda.device_count()} CUDA "
                "device(s)); pick an index below that"
            )
        return dev
    raise ConfigError(f"device {device!r} is not one of auto, cpu, cuda, cuda:N")


def resolve_dtype(dtype: str, device: Any):
    """``auto`` → bfloat16 on CUDA that supports it, float16 on older CUDA, float32 on CPU."""
    import torch

    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if dtype == "auto":
        if dev.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, dtype)


def autocast_dtype(resolved: Any, device_type: str):
    """The dtype a model computes in under autocast, or None for no autocast.

    It is the recipe's *resolved* ``dtype`` (:func:`resolve_dtype`), not the dtype of the
    model's first parameter: after ``prepare_model_for_kbit_training`` a 4-bit model's
    embedding is float32 while its layers compute in bfloat16, and reading the first
    parameter left a 4-bit student running attention, LoRA and the V-wide head in float32
    (twice the activations). Autocast is a CUDA matter here: on the CPU every model runs
    in the dtype it was loaded in.
    """
    import torch

    if device_type != "cuda" or resolved == torch.float32:
        return None
    return resolved


# The output layer's float32 copy of its weight (a non-persistent buffer: it moves with
# the model, parks with a teacher's weights, and stays out of checkpoints).
FP32_WEIGHT = "fp32_weight"


def fp32_head_forward(head: Any, hidden: Any) -> Any:
    """The output layer in float32: ``hidden @ W.T (+ b)`` with hidden widened, the weight
    in float32 (:func:`fp32_weight`: one kept copy, not one per call) and autocast off, so
    a bfloat16 model's logits carry no bf16 rounding (up to ~0.06 at logits near 20-30).
    On a float32 model it is the layer's own computation."""
    import torch

    with torch.autocast(hidden.device.type, enabled=False):
        bias = None if head.bias is None else head.bias.float()
        return torch.nn.functional.linear(hidden.float(), fp32_weight(head), bias)


def fp32_weight(head: Any) -> Any:
    """``head.weight`` in float32, gradients flowing back to the weight in its own dtype
    (exactly as ``weight.float()`` would send them): the weight itself when it is float32,
    else the head's one float32 copy. The copy is made on the first call and refreshed in
    place only when the weight has changed since (an optimizer step or a loaded
    checkpoint moves torch's version counter; a move to another device or storage changes
    its address), so a trained head's copy stays in step and a frozen one is never copied
    again."""
    import torch

    weight = head.weight
    if weight.dtype == torch.float32:
        return weight
    stamp = (weight._version, weight.data_ptr(), weight.device)
    copy = getattr(head, FP32_WEIGHT, None)
    if copy is None or head.fp32_stamp != stamp:
        # Made outside any inference mode, so a training forward may save it for backward.
        with torch.inference_mode(False), torch.no_grad():
            if copy is None or copy.device != weight.device or copy.shape != weight.shape:
                head.register_buffer(FP32_WEIGHT, weight.float(), persistent=False)
            else:
                copy.copy_(weight)
        head.fp32_stamp = stamp
    return _widened_weight().apply(weight, getattr(head, FP32_WEIGHT))


@functools.cache
def _widened_weight() -> Any:
    """The autograd step from a weight to its kept float32 copy (made once: torch is
    imported on first use)."""
    import torch

    class WidenedWeight(torch.autograd.Function):
        """Forward: the kept copy as it is. Backward: the gradient in the weight's dtype."""

        @staticmethod
        def forward(ctx: Any, weight: Any, widened: Any) -> Any:
            ctx.dtype = weight.dtype
            return widened.view_as(widened)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad.to(ctx.dtype), None

    return WidenedWeight


def use_fp32_head(model: Any) -> None:
    """Make ``model``'s output layer compute in float32 wherever it is called (the loss's
    chunks, the rollout's ``logits_to_keep`` forward, the teacher's scoring head).

    The layer keeps its weights, parameters and state-dict keys; its ``forward`` is
    replaced (a bound method, so a deep copy binds it to the copy), and a half-precision
    layer keeps one float32 copy of its weight beside it (:func:`fp32_weight`). Raises
    :class:`ConfigError` for an output layer that is not a plain linear map.
    """
    import types

    import torch

    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not hasattr(head, "bias"):
        raise ConfigError(
            f"loss.fp32_head needs a linear output layer; this model's is "
            f"{type(head).__name__}; set loss.fp32_head: false"
        )
    head.forward = types.MethodType(fp32_head_forward, head)


def load_causal_lm(
    model_dir: str | Path,
    dtype: str = "auto",
    device: str = "auto",
    quantization: str = "none",
    revision: str | None = None,
    allow_cpu_quantization: bool = False,
):
    """Load a causal LM from a local HF directory onto ``device`` in eval mode.

    ``revision`` is passed through to ``from_pretrained`` (it only matters for a hub
    cache directory). Quantization needs bitsandbytes and CUDA.
    """
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError("transformers", "train") from exc

    if quantization not in QUANTIZATIONS:
        raise ConfigError(
            f"quantization {quantization!r} is not one of {', '.join(QUANTIZATIONS)}"
        )
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "local_files_only": True}
    if revision:
        kwargs["revision"] = revision
    if quantization != "none":
        if dev.type != "cuda" and not allow_cpu_quantization:
            raise ConfigError(
                f"quantization {quantization!r} needs a CUDA device (device is {dev}); "
                "set quantization: none, or allow_cpu_quantization: true to try anyway"
            )
        try:
            import bitsandbytes  # noqa: F401
            from transformers import BitsAndBytesConfig
        except ImportError as exc:
            raise MissingExtraError("bitsandbytes", "cuda") from exc
        if quantization == "nf4":
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch_dtype,
            )
        else:
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        kwargs["device_map"] = {"": dev.index or 0} if dev.type == "cuda" else {"": "cpu"}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    if quantization == "none":
        model.to(dev)
    model.eval()
    return model
