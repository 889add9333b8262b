"""A memory plan before the first update: each process's predicted peak on one device.

From a model's shape (its ``config.json``: no weights are read) and the recipe's batch,
episode length, LoRA/4-bit and dtype, :func:`plan_memory` predicts, per process:

- the **student**: weights, trainable parameters with their gradients and AdamW moments,
  the activations one micro-batch keeps for backward (with or without gradient
  checkpointing), the loss's chunk of ``[C, V]`` logits and the float32 output layer,
  and, in the rollout phase, the KV cache of ``rollout.batch_size`` episodes, or with
  ``rollout.engine: vllm`` the engine's share of the device (``rollout.engine_memory``),
  which must hold the student's weights and one episode's KV cache; with the engine's
  log-prob check on (``rollout.engine_check``), the check's forward after sampling;
- the **teacher**: its weights and the peak of scoring one batch of
  ``--batch-tokens`` (16,384) tokens.

The activation count is a census of the tensors a Hugging Face decoder layer (Llama,
Qwen2/3 families, SDPA attention) saves for backward, per token and layer, checked against
the CPU's measured peak (``tests/common/test_memory_plan.py``,
``benchmarks/memory_plan_check.py``). :func:`fit` picks what to change when the plan does
not fit: gradient checkpointing, a token budget per micro-batch
(``train.micro_batch_tokens``), the teacher parked during updates (``teacher.memory:
swap``). This module imports nothing heavy (torch is not imported); it does not measure
anything (docs/gpu.md, "The memory plan").
"""

from __future__ import annotations

import glob
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .toy import toy_model_dir

GIB = 2**30
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# What a CUDA process holds before any tensor: the context, cuBLAS workspaces and the
# allocator's rounding; a budget, not a measurement (no GPU has run this plan).
CUDA_OVERHEAD_BYTES = 600 * 2**20
# Live [C, V] float32 tensors at the peak of one loss chunk's backward (the chunk is
# recomputed under checkpoint: its logits, their log-softmax and its gradient); measured
# on the CPU (benchmarks/memory_plan_check.py).
LOSS_CHUNK_COPIES = 3
# The teacher's defaults (teacher_server/__main__.py): tokens per scoring forward and the
# elements of one head chunk on an accelerator (teacher_server/scoring.py).
TEACHER_BATCH_TOKENS = 16_384
TEACHER_HEAD_CHUNK_ELEMENTS = 64 * 2**20
# Live float32 [P, V] tensors at the peak of the vLLM engine's log-prob check over one
# episode (student/rollout/vllm_engine.py logprob_gap: the logits kept at the sampled
# positions, their division by the temperature, its log-softmax; top-p's sort, its int64
# order and masks add four); measured on the CPU (tests/common/test_memory_plan.py).
# P, the sampled positions, is counted as the episode's every token, its most.
CHECK_COPIES = 3
CHECK_COPIES_TOP_P = 7

# Shapes of the hub models the shipped recipes name, for a plan made where the hub cannot
# be reached and the model was never downloaded (read from their config.json files).
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-0.6B": {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28,
                        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                        "intermediate_size": 3072, "vocab_size": 151936,
                        "tie_word_embeddings": True},
    "Qwen/Qwen3-1.7B": {"model_type": "qwen3", "hidden_size": 2048, "num_hidden_layers": 28,
                        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                        "intermediate_size": 6144, "vocab_size": 151936,
                        "tie_word_embeddings": True},
}

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The student's rollout parts that are free once its episodes are sampled.
ROLLOUT_TRANSIENT = ("kv_cache", "prefill", "logits", "engine")


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only model that memory depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qk_norm: bool  # Qwen3 normalises q and k per head (two more saved tensors per layer)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """From a Hugging Face ``config.json`` (Llama, Mistral, Qwen2, Qwen3 keys)."""
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            return cls(
                hidden=hidden, layers=int(config["num_hidden_layers"]), heads=heads,
                kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                tied=bool(config.get("tie_word_embeddings", False)),
                qk_norm=config.get("model_type") == "qwen3",
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"model config lacks a size the memory plan needs ({exc}); "
                              "the plan reads Llama/Qwen-style config.json keys") from exc

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection of one layer."""
        h, i = self.hidden, self.intermediate
        return {"q_proj": (h, self.q_dim), "k_proj": (h, self.kv_dim),
                "v_proj": (h, self.kv_dim), "o_proj": (self.q_dim, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def layer_params(self) -> int:
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return sum(a * b for a, b in self.linear_shapes().values()) + norms

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.hidden

    def lora_params(self, r: int, targets: tuple[str, ...]) -> int:
        shapes = self.linear_shapes()
        return self.layers * sum(r * (a + b) for name, (a, b) in shapes.items() if name in targets)

    def saved_elements_per_token_layer(self, lora_r: int, targets: tuple[str, ...],
                                       seq_len: int) -> tuple[int, int]:
        """``(elements in the compute dtype, float32 elements)`` one token keeps for
        backward in one layer: the residual and the two RMSNorms' inputs and outputs (4H),
        q, k and v repeated to every head and the attention output (4 q-dims), the MLP's
        gate, up, activation and product (4I), each LoRA adapter's rank-r middle, the
        norms' reciprocal roots and the attention's log-sum-exp; Qwen3 also keeps q and k
        before their norms. The attention mask adds ``seq_len`` per token (SDPA keeps it;
        float32). Counted from the tensors torch's saved-tensor hooks report (CPU, SDPA)."""
        n_lora = sum(1 for name in self.linear_shapes() if name in targets)
        elems = 4 * self.hidden + 4 * self.q_dim + 4 * self.intermediate + lora_r * n_lora
        small = 2 + self.heads
        if self.qk_norm:
            elems += self.q_dim + self.kv_dim
            small += self.heads + self.kv_heads
        return elems + small, seq_len

    def kv_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """The KV cache of ``tokens`` tokens: a key and a value per layer."""
        return tokens * self.layers * 2 * self.kv_dim * dtype_bytes

    def no_grad_forward_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """A no-grad forward's peak over ``tokens`` tokens: one layer's widest tensors at a
        time (the MLP's three intermediate-wide ones and two hidden-wide)."""
        return tokens * (3 * self.intermediate + 2 * self.hidden) * dtype_bytes

    def checkpointed_elements_per_token_layer(self) -> int:
        """What a checkpointed layer keeps: its input and the rotary cos/sin it is called
        with (non-reentrant checkpointing saves the layer's tensor arguments)."""
        return self.hidden + 4 * self.head_dim


def read_shape(source: Any, *, offline: bool = True) -> ModelShape:
    """The shape of a recipe's ``ModelSource``: a local path's ``config.json``, a toy
    spec's, a hub model's cached ``config.json``, else :data:`KNOWN_CONFIGS`."""
    if getattr(source, "toy", None) is not None:
        # The toy is built once (tiny); its config.json is the truth.
        return _from_file(toy_model_dir(source.toy) / "config.json")
    if getattr(source, "path", None) is not None:
        return _from_file(Path(source.path).expanduser() / "config.json")
    hub_id = getattr(source, "hub_id", None)
    if hub_id:
        cached = _hub_cached_config(hub_id, getattr(source, "revision", None))
        if cached is not None:
            return _from_file(cached)
        if hub_id in KNOWN_CONFIGS:
            return ModelShape.from_config(KNOWN_CONFIGS[hub_id])
    raise ConfigError(f"no config.json for {hub_id or source!r} here (not downloaded); "
                      "run `miniverl model pull` first or drop --device-memory")


def _from_file(path: Path) -> ModelShape:
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; the memory plan reads the model's "
                          "config.json (point the recipe at a saved model directory)")
    return ModelShape.from_config(json.loads(path.read_text()))


def _hub_cached_config(hub_id: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(hub_id, "config.json", revision=revision)
    return Path(found) if isinstance(found, str) else None


@dataclass(frozen=True)
class StudentSettings:
    """The recipe's choices the student's memory depends on."""

    dtype_bytes: int  # of weights and activations (autocast's dtype on CUDA)
    quantization: str  # none, nf4 or int8
    lora_r: int | None  # None: full fine-tune
    lora_targets: tuple[str, ...]
    update_episodes: int  # trajectories per update (rollouts_per_cycle, or the batch's)
    episode_tokens: int  # rollout.max_total_tokens: an update pads to its longest
    grad_accum: int
    micro_batch_tokens: int | None
    gradient_checkpointing: bool
    chunk_size: int
    fp32_head: bool
    rollout_batch: int
    # The share of a micro-batch's tokens the loss trains (its chunk is at most that many
    # positions); 1.0 bounds it (a recipe's prompts are not trained, so it is less).
    trained_share: float = 1.0
    # rollout.engine vllm: the bytes the engine takes while it samples (its share of the
    # device, rollout.engine_memory: its own weights and KV cache); 0 for hf, whose
    # KV cache is counted from the batch. It sleeps outside its rollouts.
    engine_bytes: int = 0
    # rollout.engine_check with vllm: after sampling (the engine asleep) the trainer's
    # no-grad forward of one episode at a time, against the engine's log-probs.
    engine_check: bool = False
    top_p: float = 1.0
    # train.pipelining: the teacher scores finished episodes while the rest are sampled,
    # so its scoring peak meets the student's rollout peak.
    pipelined: bool = True


@dataclass(frozen=True)
class ProcessPlan:
    """One process's predicted bytes, by part, and its peak."""

    parts: dict[str, int]
    peak: int

    def line(self) -> str:
        shown = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.parts.items() if v)
        return f"{self.peak / GIB:.2f} GiB ({shown})"


def micro_batch_tokens_of(s: StudentSettings) -> int:
    """Padded tokens of the largest micro-batch: a token budget packs whole episodes
    under it (at least one); else the update split into ``grad_accum`` parts by count."""
    if s.micro_batch_tokens is not None:
        per = max(1, s.micro_batch_tokens // s.episode_tokens)
        return min(per, s.update_episodes) * s.episode_tokens
    return math.ceil(s.update_episodes / s.grad_accum) * s.episode_tokens


def engine_needs(shape: ModelShape, s: StudentSettings) -> int:
    """The least a vLLM engine's share must hold: the student's weights in the engine's
    dtype (the student's compute dtype; it loads the unquantized model) and the KV cache
    of one episode of ``rollout.max_total_tokens``."""
    return shape.params() * s.dtype_bytes + shape.kv_bytes(s.episode_tokens, s.dtype_bytes)


def check_bytes(shape: ModelShape, s: StudentSettings) -> int:
    """The engine's log-prob check over one episode of ``rollout.max_total_tokens``: a
    no-grad forward (one layer's widest tensors at a time) and its float32 logits at the
    sampled positions (at most ``T``) with the copies the comparison makes
    (:data:`CHECK_COPIES`)."""
    forward = shape.no_grad_forward_bytes(s.episode_tokens, s.dtype_bytes)
    copies = CHECK_COPIES if s.top_p >= 1.0 else CHECK_COPIES_TOP_P
    return forward + copies * s.episode_tokens * shape.vocab * 4


def student_plan(shape: ModelShape, s: StudentSettings) -> dict[str, ProcessPlan]:
    """The student's peak in its update and in its rollouts (``{"update", "rollout"}``),
    and with the vLLM engine's log-prob check on, in that check after sampling
    (``"check"``; the engine sleeps there)."""
    b, f32 = s.dtype_bytes, 4
    if s.quantization == "nf4":
        # 4-bit layers (half a byte a weight, plus a float32 scale per 64); the embedding
        # and head are float32 after prepare_model_for_kbit_training.
        weights = int(shape.layers * shape.layer_params() * (0.5 + 4 / 64)) \
            + shape.embedding_params() * f32
    elif s.quantization == "int8":
        weights = shape.layers * shape.layer_params() + shape.embedding_params() * f32
    else:
        weights = shape.params() * b
    if s.lora_r is None:  # a full fine-tune: gradients in the weights' dtype, two moments
        trainable = 3 * shape.params() * b
    else:
        trainable = 4 * shape.lora_params(s.lora_r, s.lora_targets) * f32
    tokens = micro_batch_tokens_of(s)
    full, mask = shape.saved_elements_per_token_layer(s.lora_r or 0, s.lora_targets,
                                                      s.episode_tokens)
    per_layer = full * b + mask * f32
    if s.gradient_checkpointing:
        # Every layer keeps its input; the layer being recomputed keeps its all.
        activations = tokens * (shape.layers * shape.checkpointed_elements_per_token_layer() * b
                                + per_layer)
    else:
        activations = tokens * shape.layers * per_layer
    # The final norm's output, and the selected positions' hidden states gathered from it.
    activations += 2 * tokens * shape.hidden * b
    chunk = min(s.chunk_size, math.ceil(tokens * s.trained_share))
    loss = LOSS_CHUNK_COPIES * chunk * shape.vocab * f32
    # The float32 head's kept copy of a half-precision weight (a quantized student's head
    # is float32 already, after prepare_model_for_kbit_training).
    half_head = b != f32 and s.quantization == "none"
    head = shape.vocab * shape.hidden * f32 if (s.fp32_head and half_head) else 0
    update = {"weights": weights, "trainable": trainable, "activations": activations,
              "loss_chunk": loss, "fp32_head": head}
    if s.engine_bytes:
        # vLLM samples: the trainer's model holds no KV cache; the engine its share.
        rollout = {"weights": weights, "trainable": trainable, "engine": s.engine_bytes,
                   "fp32_head": head}
    else:
        kv = shape.kv_bytes(s.rollout_batch * s.episode_tokens, b)
        # A prefill of the batch: one layer's widest tensors at a time, and the last logits.
        prefill = s.rollout_batch * s.episode_tokens * (3 * shape.intermediate) * b
        rollout = {"weights": weights, "trainable": trainable, "kv_cache": kv,
                   "prefill": prefill, "logits": 2 * s.rollout_batch * shape.vocab * f32,
                   "fp32_head": head}
    phases = {"update": update, "rollout": rollout}
    if s.engine_bytes and s.engine_check:
        phases["check"] = {"weights": weights, "trainable": trainable, "fp32_head": head,
                           "logprob_check": check_bytes(shape, s)}
    return {name: ProcessPlan(parts, sum(parts.values())) for name, parts in phases.items()}


def teacher_plan(shape: ModelShape, *, dtype_bytes: int, quantization: str,
                 fp32_head: bool = True, batch_tokens: int = TEACHER_BATCH_TOKENS) -> ProcessPlan:
    """The teacher's weights (with the float32 head's kept copy of its weight, which parks
    with them) and the peak of one scoring batch (no gradients: one layer's widest tensors
    at a time, then head chunks of float32 logits)."""
    b = dtype_bytes
    if quantization == "nf4":
        weights = int(shape.layers * shape.layer_params() * (0.5 + 4 / 64)) \
            + shape.embedding_params() * b
    elif quantization == "int8":
        weights = shape.layers * shape.layer_params() + shape.embedding_params() * b
    else:
        weights = shape.params() * b
    forward = shape.no_grad_forward_bytes(batch_tokens, b)
    chunks = 3 * min(TEACHER_HEAD_CHUNK_ELEMENTS, batch_tokens * shape.vocab) * 4
    head = shape.vocab * shape.hidden * 4 if (fp32_head and b != 4) else 0
    parts = {"weights": weights, "fp32_head": head, "scoring": forward + chunks}
    return ProcessPlan(parts, sum(parts.values()))


@dataclass(frozen=True)
class MemoryPlan:
    """Both processes on one device under one ``teacher.memory`` strategy."""

    student: dict[str, ProcessPlan]
    teacher: ProcessPlan | None
    memory: str  # resident or swap
    settings: StudentSettings
    shape: ModelShape  # the student's

    @property
    def phases(self) -> dict[str, int]:
        """The device's bytes in each phase of a cycle (both CUDA contexts counted):

        - ``sampling``: the teacher is on the device (``swap`` wakes it before the
          rollouts) and, pipelined, scores finished episodes while the rest are sampled
          (its scoring peak beside the student's rollouts; serial, its weights only);
        - ``scoring``: after the last episode the student's rollout memory is free (a
          vLLM engine sleeps), or the engine's log-prob check runs;
        - ``update``: ``swap`` has parked the teacher's weights, ``resident`` keeps them.
        """
        s_up, s_roll = self.student["update"].peak, self.student["rollout"].peak
        check = self.student.get("check")
        if self.teacher is None:
            alone = {"sampling": s_roll, "update": s_up}
            if check:
                alone["check"] = check.peak
            return {k: v + CUDA_OVERHEAD_BYTES for k, v in alone.items()}
        # What the teacher holds between its batches (parked together under swap).
        t_weights = self.teacher.parts["weights"] + self.teacher.parts["fp32_head"]
        t_peak = self.teacher.peak
        rollout = self.student["rollout"].parts
        resting = s_roll - sum(rollout.get(k, 0) for k in ROLLOUT_TRANSIENT)
        both = {"sampling": s_roll + (t_peak if self.settings.pipelined else t_weights),
                "scoring": (check.peak if check else resting) + t_peak,
                "update": s_up if self.memory == "swap" else s_up + t_weights}
        return {k: v + 2 * CUDA_OVERHEAD_BYTES for k, v in both.items()}

    @property
    def peak(self) -> int:
        """The device's peak: the largest of :attr:`phases`."""
        return max(self.phases.values())

    def lines(self, device_bytes: int | None = None) -> list[str]:
        out = [f"student update  {self.student['update'].line()}",
               f"student rollout {self.student['rollout'].line()}"]
        if "check" in self.student:
            out.append(f"student check   {self.student['check'].line()}")
        if self.teacher is not None:
            out.append(f"teacher         {self.teacher.line()}")
        s = self.settings
        chosen = (f"teacher.memory {self.memory}, gradient_checkpointing "
                  f"{str(s.gradient_checkpointing).lower()}, micro-batch "
                  f"{micro_batch_tokens_of(s)} tokens")
        phases = self.phases
        at = max(phases, key=lambda name: phases[name])
        total = f"device peak     {phases[at] / GIB:.2f} GiB in {at} ({chosen})"
        if device_bytes is not None:
            total += f" of {device_bytes / GIB:.1f} GiB: " + (
                "fits" if phases[at] <= device_bytes else "does not fit")
        return [*out, total]


def plan_memory(student: ModelShape, s: StudentSettings, teacher: ModelShape | None = None,
                *, teacher_dtype_bytes: int = 2, teacher_quantization: str = "none",
                memory: str = "resident") -> MemoryPlan:
    t = None if teacher is None else teacher_plan(
        teacher, dtype_bytes=teacher_dtype_bytes, quantization=teacher_quantization,
        fp32_head=s.fp32_head)
    return MemoryPlan(student_plan(student, s), t, memory, s, student)


@dataclass(frozen=True)
class Fit:
    """What :func:`fit` chose: the plan that fits (or the last one tried) and the recipe
    settings that differ from the recipe's (``{"train.gradient_checkpointing": True}``)."""

    plan: MemoryPlan
    changes: dict[str, Any]
    fits: bool


def fit(plan: MemoryPlan, device_bytes: int, *, memory_fixed: bool,
        checkpointing_fixed: bool, micro_batch_fixed: bool) -> Fit:
    """The first plan that fits ``device_bytes``, changing, in turn, what the recipe left
    to the plan (``*_fixed`` False): gradient checkpointing on, then the teacher parked
    during updates (when that lowers the peak), then a micro-batch token budget halved
    down to one episode."""
    candidates: list[tuple[MemoryPlan, dict[str, Any]]] = [(plan, {})]
    s, memory = plan.settings, plan.memory
    changes: dict[str, Any] = {}
    if not checkpointing_fixed and not s.gradient_checkpointing:
        s = replace(s, gradient_checkpointing=True)
        changes = {**changes, "train.gradient_checkpointing": True}
        candidates.append((replace(plan, settings=s, student=student_plan(plan.shape, s)), changes))
    if not memory_fixed and plan.teacher is not None and memory != "swap":
        parked = replace(candidates[-1][0], memory="swap")
        # Parking helps only when the update is the peak: the teacher is back on the
        # device for the rollouts and scoring.
        if parked.peak < candidates[-1][0].peak:
            memory = "swap"
            changes = {**changes, "teacher.memory": "swap"}
            candidates.append((parked, changes))
    if not micro_batch_fixed:
        budget = micro_batch_tokens_of(s)
        while budget > s.episode_tokens:
            budget = max(s.episode_tokens, budget // 2 // s.episode_tokens * s.episode_tokens)
            s = replace(s, micro_batch_tokens=budget)
            changes = {**changes, "train.micro_batch_tokens": budget}
            candidates.append((replace(plan, settings=s, student=student_plan(plan.shape, s),
                                       memory=memory), changes))
    for candidate, chosen in candidates:
        if candidate.peak <= device_bytes:
            return Fit(candidate, chosen, True)
    last, chosen = candidates[-1]
    return Fit(last, chosen, False)


def parse_bytes(text: str) -> int:
    """``24GiB``, ``80GB``, ``16384MiB`` or a byte count -> bytes; one-line refusal else."""
    units = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
             "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise ConfigError(f"--device-memory {text!r} is not a size; write it like 24GiB, "
                          "80GB or 16384MiB")
    return int(value * units[unit])


def settings_of(recipe: Any, device_bytes: int) -> StudentSettings:
    """The recipe's student settings as the plan reads them, on a CUDA device of
    ``device_bytes`` (``dtype: auto`` is bfloat16 there, or float16: two bytes either way;
    ``rollout.engine: vllm`` takes ``rollout.engine_memory`` of it)."""
    st, train = recipe.student, recipe.train
    vllm = recipe.rollout.engine == "vllm"
    dtype = "bfloat16" if st.dtype == "auto" else st.dtype
    lora = st.lora
    return StudentSettings(
        dtype_bytes=DTYPE_BYTES[dtype], quantization=st.quantization,
        lora_r=None if lora is None else lora.r,
        lora_targets=LORA_TARGETS if lora is None else tuple(lora.target_modules),
        update_episodes=train.rollouts_per_cycle,
        episode_tokens=recipe.rollout.max_total_tokens, grad_accum=train.grad_accum,
        micro_batch_tokens=train.micro_batch_tokens,
        gradient_checkpointing=bool(train.gradient_checkpointing),
        chunk_size=recipe.loss.chunk_size, fp32_head=recipe.fp32_head,
        rollout_batch=recipe.rollout.batch_size,
        engine_bytes=int(recipe.rollout.engine_memory_share * device_bytes) if vllm else 0,
        engine_check=vllm and recipe.rollout.engine_check is not False,
        top_p=recipe.rollout.top_p, pipelined=train.pipelining,
    )


def recipe_plan(recipe: Any, device_bytes: int, *, student: ModelShape,
                teacher: ModelShape | None) -> tuple[MemoryPlan, Fit]:
    """``(the recipe's plan as written, the fit)``: the fit changes only what the recipe
    left null (``teacher.memory: auto``, ``train.gradient_checkpointing``,
    ``train.micro_batch_tokens``)."""
    t = recipe.teacher if recipe.needs_teacher else None
    memory = "resident" if t is None or t.memory == "auto" else t.memory
    t_dtype = 2 if t is None or t.dtype in ("auto", "bfloat16", "float16") else 4
    plan = plan_memory(student, settings_of(recipe, device_bytes), teacher if t is not None else None,
                       teacher_dtype_bytes=t_dtype,
                       teacher_quantization="none" if t is None else t.quantization,
                       memory=memory)
    train = recipe.train
    chosen = fit(plan, device_bytes, memory_fixed=t is None or t.memory != "auto",
                 checkpointing_fixed=train.gradient_checkpointing is not None,
                 micro_batch_fixed=train.micro_batch_tokens is not None)
    return plan, chosen


def refusal(recipe: Any, device_bytes: int, chosen: Fit, *, student: ModelShape,
            teacher: ModelShape | None) -> str | None:
    """The one line refusing a plan that does not fit, naming the settings that would
    make it fit (found by fitting with every setting free); None when it fits."""
    if chosen.fits:
        return None
    plan = chosen.plan
    free = fit(plan, device_bytes, memory_fixed=plan.teacher is None,
               checkpointing_fixed=False, micro_batch_fixed=False)
    extra: dict[str, Any] = {}
    if not free.fits and plan.teacher is not None and plan.settings.pipelined:
        # Serial scoring: only the teacher's weights beside the student's rollouts.
        serial = fit(replace(plan, settings=replace(plan.settings, pipelined=False)),
                     device_bytes, memory_fixed=False, checkpointing_fixed=False,
                     micro_batch_fixed=False)
        free, extra = serial, {"train.pipelining": False}
    need = f"{plan.peak / GIB:.1f} GiB"
    if free.fits:
        fix = ", ".join(f"{k}: {_yaml(v)}"
                        for k, v in {**chosen.changes, **free.changes, **extra}.items())
        return (f"the memory plan needs {need} of {device_bytes / GIB:.1f} GiB "
                f"(miniverl validate --device-memory shows it); set {fix}")
    engine = "rollout.engine_memory, " if plan.settings.engine_bytes else ""
    serially = ", serial scoring" if extra else ""
    return (f"the memory plan needs {need} of {device_bytes / GIB:.1f} GiB even with "
            f"gradient checkpointing, the teacher parked{serially} and one episode per micro-batch "
            f"({free.plan.peak / GIB:.1f} GiB); lower {engine}rollout.max_total_tokens or "
            "rollout.batch_size, or set teacher.quantization: nf4")


def engine_refusal(plan: MemoryPlan, device_bytes: int) -> str | None:
    """The one line refusing a vLLM engine share (``rollout.engine_memory``) too small for
    the student's weights and one episode's KV cache (:func:`engine_needs`), naming the
    smallest share that holds them; None when it holds them or the engine is hf."""
    s = plan.settings
    if not s.engine_bytes:
        return None
    needs = engine_needs(plan.shape, s)
    if needs <= s.engine_bytes:
        return None
    what = (f"rollout.engine_memory gives the vLLM engine {s.engine_bytes / GIB:.2f} GiB of "
            f"{device_bytes / GIB:.1f} GiB, less than the student's weights and one "
            f"episode's KV cache ({needs / GIB:.2f} GiB)")
    smallest = math.ceil(needs / device_bytes * 100) / 100
    if smallest >= 1.0:
        return f"{what}; no share of this device holds them: set rollout.engine: hf"
    return f"{what}; set rollout.engine_memory: {smallest:.2f} or more"


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_recipe(recipe: Any, device_bytes: int, *, student: ModelShape | None = None,
                 teacher: ModelShape | None = None) -> tuple[list[str], Fit, str | None]:
    """``(lines to print, the fit, the one-line refusal or None)`` for ``recipe`` on a
    device of ``device_bytes``; shapes not given are read from the recipe's model sources
    (:func:`read_shape`). A teacher served elsewhere (``teacher.endpoint``) is left out."""
    student = student or read_shape(recipe.student.model)
    t = recipe.teacher if recipe.needs_teacher else None
    if teacher is None and t is not None and t.endpoint is None:
        teacher = read_shape(t.model)
    written, chosen = recipe_plan(recipe, device_bytes, student=student, teacher=teacher)
    lines = ["memory plan (as written):", *(f"  {x}" for x in written.lines(device_bytes))]
    if chosen.changes:
        picked = ", ".join(f"{k}: {_yaml(v)}" for k, v in chosen.changes.items())
        lines += [f"memory plan (chosen: {picked}):",
                  *(f"  {x}" for x in chosen.plan.lines(device_bytes))]
    refused = engine_refusal(written, device_bytes) or refusal(
        recipe, device_bytes, chosen, student=student, teacher=teacher)
    return lines, chosen, refused


def cuda_total_bytes(device: str) -> int | None:
    """The total memory of the CUDA device ``student.device`` names (``auto``: the first,
    where torch sees one); None for a CPU student. Reads the device's properties only (no
    tensor is made on it). ``auto`` on a machine with no NVIDIA device node is the CPU
    without importing torch, so ``up`` on a CPU starts as fast as before."""
    if device == "cpu" or (device == "auto" and not glob.glob("/dev/nvidia[0-9]*")):
        return None
    import torch

    if not torch.cuda.is_available():
        return None  # auto is the CPU; cuda without CUDA is refused where it is resolved
    index = torch.device("cuda" if device == "auto" else device).index
    return int(torch.cuda.get_device_properties(index or 0).total_memory)


def refuse_before_start(recipe: Any, *, teacher_elsewhere: bool = False) -> None:
    """``miniverl up``'s check before it starts any process: on a CUDA student, raise
    :class:`ConfigError` (one line) when the recipe's memory plan cannot fit the device
    (``teacher_elsewhere``: the teacher is attached to, not on this device). A model whose
    ``config.json`` is not here yet (a hub model to download) is left to the student,
    which plans again once it has the model."""
    total = cuda_total_bytes(recipe.student.device)
    if total is None:
        return
    if teacher_elsewhere and recipe.teacher is not None:
        attached = recipe.teacher.model_copy(update={"endpoint": "attached"})
        recipe = recipe.model_copy(update={"teacher": attached})
    try:
        _, _, refused = check_recipe(recipe, total)
    except ConfigError:
        return
    if refused is not None:
        raise ConfigError(f"{recipe.student.device}: {refused}")


def refilled(recipe: Any, filled: dict[str, Any]) -> Any:
    """``recipe`` with a run's recorded plan choices (``filled``, ``train.*``) set where
    ``recipe`` leaves them null: a resumed run goes on with the settings it ran with; a
    field ``recipe`` sets is left as it is (and differs like any other field)."""
    unset = {k: v for k, v in filled.items()
             if k.startswith("train.") and getattr(recipe.train, k.removeprefix("train.")) is None}
    return with_train_changes(recipe, unset)


def with_train_changes(recipe: Any, changes: dict[str, Any]) -> Any:
    """``recipe`` with the plan's ``train.*`` choices filled in (``teacher.memory`` is
    left to the run's memory strategy, which reads the same plan)."""
    train = {k.removeprefix("train."): v for k, v in changes.items() if k.startswith("train.")}
    if not train:
        return recipe
    return recipe.model_copy(update={"train": recipe.train.model_copy(update=train)})
