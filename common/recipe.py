"""The recipe schema: one YAML file that says everything a run does.

A recipe is plain data validated by pydantic (``extra="forbid"``, bounds on every
field, cross-field rules whose messages name the value, the rule and the fix).
``load_recipe(path)`` reports *all* errors at once, each with its YAML
``line:col`` and dotted field path (see :mod:`miniverl.common.recipe_io`).

This module does not load models, start processes or know which environments
exist; the CLI checks the environment name against the registry.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .errors import ConfigError

SCHEMA_VERSION = 1
HEX40 = r"^[0-9a-f]{40}$"
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"

Mode = Literal["sft", "offline_kd", "opd", "replay", "dpo"]
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Quantization = Literal["none", "nf4", "int8"]
TEACHER_MODES: frozenset[str] = frozenset({"offline_kd", "opd", "replay", "dpo"})


def _issues(issues: list[tuple], involves: dict[str, tuple[str, ...]] | None = None) -> None:
    """Raise one pydantic error carrying several ``(sub-location, message)`` issues.

    ``load_recipe`` expands them into one line each with a precise location; a plain
    ``model_validate`` shows them joined by ``"; "``. ``involves`` maps a sub-location's
    first part to the sibling fields the rule reads, so a rule is not re-reported with a
    default value once one of those fields was reported broken.
    """
    if issues:
        involves = involves or {}
        raise PydanticCustomError(
            "miniverl_rule",
            "; ".join(msg for _, msg in issues),
            {
                "issues": [
                    (list(loc), msg, list(involves.get(str(loc[0]) if loc else "", ())))
                    for loc, msg in issues
                ]
            },
        )


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


# -- models ---------------------------------------------------------------------------


class ToySpec(_Section):
    """A tiny Qwen3-architecture model built from config (no download, no GPU)."""

    hidden: int = Field(64, ge=8, le=4096, description="Hidden size.")
    layers: int = Field(2, ge=1, le=64, description="Number of decoder layers.")
    heads: int = Field(4, ge=1, le=64, description="Attention heads.")
    kv_heads: int = Field(2, ge=1, le=64, description="Key/value heads (grouped-query attention).")
    intermediate: int = Field(128, ge=8, le=16384, description="MLP intermediate size.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Initialisation seed.")
    max_positions: int = Field(1024, ge=16, le=131072, description="Maximum sequence length.")

    @model_validator(mode="after")
    def _shapes(self) -> ToySpec:
        issues: list[tuple[tuple[str | int, ...], str]] = []
        if self.hidden % self.heads:
            issues.append(
                (
                    ("heads",),
                    f"hidden {self.hidden} is not divisible by heads {self.heads}; "
                    "pick heads that divide hidden",
                )
            )
        if self.heads % self.kv_heads:
            issues.append(
                (
                    ("kv_heads",),
                    f"heads {self.heads} is not divisible by kv_heads "
                    f"{self.kv_heads}; pick kv_heads that divide heads",
                )
            )
        _issues(issues, {"heads": ("hidden", "heads"), "kv_heads": ("heads", "kv_heads")})
        return self


class ModelSource(_Section):
    """Where weights come from: exactly one of a local HF dir, a pinned hub id, or a toy spec."""

    path: str | None = Field(None, min_length=1, description="Local Hugging Face model directory.")
    hub_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$",
        description="Hugging Face hub id, e.g. Qwen/Qwen3-0.6B; needs a pinned revision.",
    )
    revision: str | None = Field(
        None, pattern=HEX40, description="40-hex commit sha pinning hub_id (branches drift)."
    )
    toy: ToySpec | None = Field(None, description="Build a tiny model from this spec.")

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        given = [name for name in ("path", "hub_id", "toy") if getattr(self, name) is not None]
        issues: list[tuple[tuple[str | int, ...], str]] = []
        if len(given) != 1:
            issues.append(
                (
                    (),
                    f"model needs exactly one of path, hub_id or toy (got "
                    f"{', '.join(given) or 'none'}); keep one",
                )
            )
        if self.hub_id is not None and self.revision is None:
            issues.append(
                (
                    ("hub_id",),
                    f"hub_id {self.hub_id!r} needs a pinned revision; add "
                    "revision: <40-hex commit sha> from the model page's commit history",
                )
            )
        if self.revision is not None and self.hub_id is None:
            issues.append((("revision",), "revision applies only to hub_id; remove it"))
        _issues(
            issues,
            {"": ("path", "hub_id", "toy"), "hub_id": ("revision",), "revision": ("hub_id",)},
        )
        return self

    def describe(self) -> str:
        """A short human label: the hub id@rev, the path, or the toy shape."""
        if self.hub_id:
            return f"{self.hub_id}@{(self.revision or '')[:8]}"
        if self.path:
            return self.path
        assert self.toy is not None
        t = self.toy
        return f"toy(hidden={t.hidden}, layers={t.layers}, heads={t.heads})"


class LoraConfig(_Section):
    r: int = Field(16, ge=1, le=1024, description="LoRA rank.")
    alpha: float = Field(32.0, gt=0, le=4096, description="LoRA scaling alpha.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout probability.")
    target_modules: list[str] = Field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        min_length=1,
        description="Module names that get adapters.",
    )


class _Placement(_Section):
    model: ModelSource = Field(description="Where the weights come from.")
    dtype: Dtype = Field(
        "auto", description="Weight dtype; auto = bfloat16 on CUDA, float32 on CPU."
    )
    device: str = Field("auto", pattern=DEVICE_PATTERN, description="auto, cpu, cuda or cuda:N.")
    quantization: Quantization = Field(
        "none", description="Load weights in 4-bit nf4 or int8 (bitsandbytes, CUDA)."
    )
    allow_cpu_quantization: bool = Field(
        False, description="Permit quantization on a non-CUDA device (slow; for tests)."
    )

    @model_validator(mode="after")
    def _quantization_device(self) -> _Placement:
        if (
            self.quantization != "none"
            and not self.device.startswith("cuda")
            and not self.allow_cpu_quantization
        ):
            _issues(
                [
                    (
                        ("quantization",),
                        f"quantization {self.quantization} needs device cuda or cuda:N (got "
                        f"{self.device!r}); set device: cuda, quantization: none, or "
                        "allow_cpu_quantization: true",
                    )
                ],
                {"quantization": ("device", "allow_cpu_quantization")},
            )
        return self


class StudentConfig(_Placement):
    lora: LoraConfig | None = Field(
        default_factory=LoraConfig, description="LoRA adapter; null = full fine-tune."
    )


class TeacherConfig(_Placement):
    adapter: str | None = Field(None, min_length=1, description="PEFT adapter dir or hub id.")
    adapter_revision: str | None = Field(
        None, pattern=HEX40, description="40-hex revision for a hub adapter."
    )
    endpoint: str | None = Field(
        None,
        pattern=r"^(tcp|ipc)://.+$",
        description="Existing teacher endpoint (tcp://host:port or ipc://path); null = launched by up.",
    )
    mode: Literal["standard", "privileged_context"] = Field(
        "standard", description="privileged_context shows the teacher the task's hidden facts."
    )
    memory: Literal["resident", "swap", "auto"] = Field(
        "auto", description="resident: stays on GPU; swap: parked during updates; auto: measured."
    )
    min_success: float | None = Field(
        None, ge=0.0, le=1.0, description="Refuse a teacher whose eval success is below this."
    )
    prepare: str | None = Field(
        None,
        min_length=1,
        description=(
            "An sft recipe (path relative to this recipe) that trains the teacher before it "
            "serves; `up` and `demo` run it once and reuse the cached result. Its student.model "
            "must equal teacher.model."
        ),
    )

    scorer: str = Field(
        "causal_lm",
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$",
        max_length=100,
        description=(
            "Scorer the teacher server runs: causal_lm (the model itself) or an installed "
            "entry point of group miniverl.scorers."
        ),
    )
    scorer_options: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Keyword options passed to the scorer."
    )

    @model_validator(mode="after")
    def _adapter_revision(self) -> TeacherConfig:
        if self.adapter_revision is not None and self.adapter is None:
            _issues(
                [(("adapter_revision",), "adapter_revision needs adapter; set both or neither")]
            )
        return self


# -- data and rollouts ----------------------------------------------------------------


class EnvironmentConfig(_Section):
    name: str = Field(
        "calculator", pattern=r"^[a-z][a-z0-9_]*$", description="Registered environment name."
    )
    params: dict[str, Any] = Field(default_factory=dict, description="Environment parameters.")
    difficulty: Literal["easy", "medium", "hard", "mixed"] = Field(
        "easy", description="Task difficulty; mixed draws all three."
    )
    train_tasks: int = Field(256, ge=1, le=10_000_000, description="Training tasks generated.")
    eval_tasks: int = Field(64, ge=1, le=1_000_000, description="Held-out tasks for eval.")
    test_tasks: int = Field(
        64, ge=0, le=1_000_000, description="Held-out tasks for the final test."
    )
    split_seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the train/eval/test split.")


class RolloutConfig(_Section):
    max_turns: int = Field(6, ge=1, le=64, description="Assistant turns per episode.")
    max_new_tokens_per_turn: int = Field(
        128, ge=1, le=32768, description="Sampled tokens per assistant turn."
    )
    max_total_tokens: int = Field(
        1024, ge=2, le=131072, description="Episode length cap, context included."
    )
    temperature: float = Field(
        1.0, ge=0.0, le=5.0, description="Sampling temperature (0 = greedy)."
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling; 1.0 = off.")
    batch_size: int = Field(8, ge=1, le=4096, description="Episodes sampled together.")

    @model_validator(mode="after")
    def _lengths(self) -> RolloutConfig:
        if self.max_total_tokens <= self.max_new_tokens_per_turn:
            _issues(
                [
                    (
                        ("max_total_tokens",),
                        f"max_total_tokens {self.max_total_tokens} must exceed max_new_tokens_per_turn "
                        f"{self.max_new_tokens_per_turn} (the prompt needs room); raise it",
                    )
                ],
                {"max_total_tokens": ("max_new_tokens_per_turn",)},
            )
        return self


class LossConfig(_Section):
    objective: Literal["exact_full_vocab", "bucketed_topk_tail"] = Field(
        "bucketed_topk_tail",
        description="exact: teacher sends all V log-probs; bucketed: top-k plus one tail bucket.",
    )
    divergence: Literal["forward_kl", "reverse_kl", "jsd"] = Field(
        "forward_kl", description="KL(teacher||student), KL(student||teacher) or beta-JSD."
    )
    jsd_beta: float = Field(0.5, ge=0.0, le=1.0, description="JSD mixing weight (jsd only).")
    top_k: int = Field(16, ge=1, le=4096, description="Teacher top-k ids per position (bucketed).")
    temperature: float = Field(
        1.0, gt=0.0, le=10.0, description="Softmax temperature of both sides."
    )
    tail_epsilon: float = Field(
        1e-6, gt=0.0, le=0.1, description="Floor on the tail bucket mass (avoids log 0)."
    )
    chunk_size: int = Field(
        1024, ge=1, le=1_048_576, description="Positions per loss chunk ([P, V] never whole)."
    )
    exact_max_vocab: int = Field(
        65536, ge=2, le=1_048_576, description="Largest vocab allowed for exact_full_vocab."
    )
    positions: Literal["all", "tool_call_and_final", "uniform"] = Field(
        "all", description="Which model positions are scored and trained."
    )
    position_ratio: float = Field(
        1.0, gt=0.0, le=1.0, description="Fraction kept by positions: uniform."
    )
    estimator: Literal["full", "sampled_token"] = Field(
        "full", description="full distribution, or the sampled-token reverse-KL estimate."
    )

    @model_validator(mode="after")
    def _combinations(self) -> LossConfig:
        issues: list[tuple[tuple[str | int, ...], str]] = []
        if self.position_ratio != 1.0 and self.positions != "uniform":
            issues.append(
                (
                    ("position_ratio",),
                    f"position_ratio {self.position_ratio} applies only to "
                    f"positions: uniform (got {self.positions!r}); set positions: uniform or "
                    "position_ratio: 1.0",
                )
            )
        if self.estimator == "sampled_token" and self.divergence != "reverse_kl":
            issues.append(
                (
                    ("estimator",),
                    f"estimator sampled_token estimates reverse KL only (got "
                    f"divergence {self.divergence!r}); set divergence: reverse_kl or estimator: full",
                )
            )
        _issues(issues, {"position_ratio": ("positions",), "estimator": ("divergence",)})
        return self


class TrainConfig(_Section):
    cycles: int = Field(10, ge=1, le=1_000_000, description="Rollout -> score -> update cycles.")
    rollouts_per_cycle: int = Field(8, ge=1, le=100_000, description="Episodes per cycle.")
    updates_per_batch: int = Field(
        1, ge=1, le=64, description="Optimizer steps per rollout batch (strict OPD: 1)."
    )
    grad_accum: int = Field(1, ge=1, le=1024, description="Micro-batches per optimizer step.")
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="Peak learning rate.")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning-rate schedule after warmup."
    )
    warmup_steps: int = Field(0, ge=0, le=1_000_000, description="Linear warmup steps.")
    optimizer: Literal["adamw", "adamw8bit"] = Field(
        "adamw", description="adamw8bit needs bitsandbytes (cuda extra)."
    )
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0.0, le=1e6, description="Gradient clipping norm.")
    sft_warmup_steps: int = Field(
        0, ge=0, le=1_000_000, description="SFT steps on oracle traces before distilling."
    )
    sft_warmup_lr: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="Peak lr of the SFT warm-up; set = each phase has its own schedule.",
    )
    sft_warmup_until_loss: float | None = Field(
        None,
        gt=0.0,
        le=100.0,
        description="End the warm-up once its last 10 losses average at most this.",
    )
    sft_epochs: int | None = Field(
        None, ge=1, le=10_000, description="Epochs over oracle traces in sft mode; null = cycles."
    )
    max_lag: int = Field(
        0, ge=0, le=10_000, description="Replay: oldest policy version allowed behind current."
    )
    save_every: int = Field(
        0, ge=0, le=1_000_000, description="Checkpoint every N cycles; 0 = end only."
    )
    eval_every: int = Field(
        0, ge=0, le=1_000_000, description="Evaluate every N cycles; 0 = end only."
    )
    max_wall_s: float | None = Field(
        None, gt=0.0, description="Wall-time budget in seconds; stop cleanly when reached."
    )
    pipelining: bool = Field(
        True, description="Score finished episodes while the rest are still sampling."
    )
    trajectories: str | None = Field(
        None, min_length=1, description="offline_kd: trajectories.jsonl to distill on."
    )

    @model_validator(mode="after")
    def _warmup_options(self) -> TrainConfig:
        issues: list[tuple[tuple[str | int, ...], str]] = []
        if self.sft_warmup_steps == 0:
            for name in ("sft_warmup_lr", "sft_warmup_until_loss"):
                if getattr(self, name) is not None:
                    issues.append(
                        (
                            (name,),
                            f"{name} {getattr(self, name)} applies only to SFT warm-up "
                            f"steps (sft_warmup_steps is 0); set sft_warmup_steps or remove "
                            f"{name}",
                        )
                    )
        _issues(
            issues,
            {"sft_warmup_lr": ("sft_warmup_steps",),
             "sft_warmup_until_loss": ("sft_warmup_steps",)},
        )
        return self


class CacheConfig(_Section):
    enabled: bool = Field(True, description="Cache teacher targets on disk.")
    dir: str | None = Field(
        None, min_length=1, description="Cache directory; null = <run>/targets."
    )
    max_bytes: int = Field(
        10 * 2**30, ge=0, le=2**50, description="Evict oldest shards beyond this size."
    )


class EvalConfig(_Section):
    split: Literal["eval", "test"] = Field("eval", description="Held-out split to evaluate on.")
    greedy: bool = Field(True, description="Greedy decoding during eval.")
    max_tasks: int | None = Field(None, ge=1, le=1_000_000, description="Cap on evaluated tasks.")


class DpoConfig(_Section):
    beta: float = Field(0.1, gt=0.0, le=10.0, description="DPO inverse temperature.")
    group_size: int = Field(
        4, ge=2, le=64,
        description="Rollouts per task per cycle; a success and a failure of one task make a pair.",
    )


class RuntimeConfig(_Section):
    cpu_threads: int = Field(
        1, ge=1, le=512, description="Torch/OpenMP threads per process (1 is fastest for toys)."
    )
    teacher_startup_timeout_s: float = Field(
        600.0, gt=0.0, le=86400.0, description="Wait this long for the teacher to be READY."
    )
    heartbeat_ms: int = Field(1000, ge=50, le=60000, description="PING interval while idle.")
    request_timeout_s: float = Field(60.0, gt=0.0, le=86400.0, description="Per-request timeout.")
    unavailable_timeout_s: float = Field(
        120.0, gt=0.0, le=86400.0, description="Give up on an unreachable teacher after this."
    )

    @model_validator(mode="after")
    def _liveness(self) -> RuntimeConfig:
        if self.unavailable_timeout_s * 1000 < 3 * self.heartbeat_ms:
            _issues(
                [
                    (
                        ("unavailable_timeout_s",),
                        f"unavailable_timeout_s {self.unavailable_timeout_s} is shorter than three "
                        f"heartbeats ({3 * self.heartbeat_ms} ms); raise it or lower heartbeat_ms",
                    )
                ],
                {"unavailable_timeout_s": ("heartbeat_ms",)},
            )
        return self


class RunConfig(_Section):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        max_length=64,
        description="Run name; the run id starts with it.",
    )
    mode: Mode = Field(description="sft, offline_kd, opd (strict on-policy), replay or dpo.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Global seed.")
    output_dir: str = Field("runs", min_length=1, description="Parent directory of run dirs.")
    deterministic: bool = Field(False, description="Deterministic kernels (slower).")


# -- the recipe -----------------------------------------------------------------------


class Recipe(BaseModel):
    """A complete, validated run description."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    schema_version: Literal[1] = Field(1, description="Recipe schema version.")
    run: RunConfig = Field(description="Name, mode, seed, output directory.")
    student: StudentConfig = Field(description="The policy being trained.")
    teacher: TeacherConfig | None = Field(
        None, description="The frozen scorer; required by offline_kd, opd, replay and dpo."
    )
    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig, description="Tool environment and task splits."
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="How episodes are sampled."
    )
    loss: LossConfig = Field(
        default_factory=LossConfig, description="Distillation objective and positions."
    )
    train: TrainConfig = Field(
        default_factory=TrainConfig, description="Cycles, optimizer and schedule."
    )
    cache: CacheConfig = Field(
        default_factory=CacheConfig, description="On-disk cache of teacher targets."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    dpo: DpoConfig = Field(default_factory=DpoConfig, description="DPO settings (mode dpo).")
    runtime: RuntimeConfig = Field(
        default_factory=RuntimeConfig, description="Threads, timeouts and heartbeats."
    )

    # Cross-section rules are field validators on the later field, reading earlier
    # validated fields from ``info.data``: they still run when an unrelated section is
    # broken, so one `validate` shows every problem.

    @field_validator("teacher")
    @classmethod
    def _teacher_needed(cls, teacher: TeacherConfig | None, info: ValidationInfo):
        run = info.data.get("run")
        if run is not None and teacher is None and run.mode in TEACHER_MODES:
            _issues(
                [
                    (
                        (),
                        f"mode {run.mode!r} needs a teacher section (teacher: {{model: ...}}); "
                        "add one or set run.mode: sft",
                    )
                ]
            )
        return teacher

    @field_validator("rollout")
    @classmethod
    def _fits_toy(cls, rollout: RolloutConfig, info: ValidationInfo):
        issues: list[tuple[tuple[str | int, ...], str]] = []
        for role in ("student", "teacher"):
            placement = info.data.get(role)
            toy = placement.model.toy if placement is not None else None
            if toy is not None and rollout.max_total_tokens > toy.max_positions:
                issues.append(
                    (
                        ("max_total_tokens",),
                        f"max_total_tokens {rollout.max_total_tokens} "
                        f"exceeds {role}.model.toy.max_positions {toy.max_positions}; lower it or "
                        "raise max_positions",
                    )
                )
        _issues(issues)
        return rollout

    @field_validator("train")
    @classmethod
    def _mode_rules(cls, train: TrainConfig, info: ValidationInfo):
        run = info.data.get("run")
        if run is None:
            return train
        issues: list[tuple[tuple[str | int, ...], str]] = []
        mode = run.mode
        if mode == "opd" and train.updates_per_batch != 1:
            issues.append(
                (
                    ("updates_per_batch",),
                    f"updates_per_batch {train.updates_per_batch} breaks "
                    "strict on-policy distillation (exactly one optimizer step per fresh rollout "
                    "batch); set updates_per_batch: 1, or run.mode: replay with max_lag >= 1",
                )
            )
        if mode == "replay" and train.max_lag < 1:
            issues.append(
                (
                    ("max_lag",),
                    f"max_lag {train.max_lag}: replay reuses older rollouts and needs "
                    "max_lag >= 1; raise it, or use run.mode: opd for strict on-policy",
                )
            )
        if mode in ("opd", "sft", "offline_kd") and train.max_lag != 0:
            issues.append(
                (
                    ("max_lag",),
                    f"max_lag {train.max_lag} applies only to replay (mode {mode!r} "
                    "allows no lag); set max_lag: 0 or run.mode: replay",
                )
            )
        if train.trajectories is not None and mode != "offline_kd":
            issues.append(
                (
                    ("trajectories",),
                    f"trajectories is an offline_kd source (mode {mode!r}); "
                    "remove it or set run.mode: offline_kd",
                )
            )
        if train.sft_epochs is not None and mode != "sft":
            issues.append(
                (
                    ("sft_epochs",),
                    f"sft_epochs applies only to mode sft (got {mode!r}); remove "
                    "it, or use sft_warmup_steps for SFT before distilling",
                )
            )
        _issues(issues)
        return train

    # -- derived facts used by plans and manifests -------------------------------------

    @property
    def on_policy(self) -> bool:
        """True when every update trains only on rollouts of the current version."""
        return self.run.mode == "opd"

    @property
    def needs_teacher(self) -> bool:
        return self.run.mode in TEACHER_MODES


# -- helpers --------------------------------------------------------------------------


def check_vocab(recipe: Recipe, vocab_size: int) -> None:
    """Check rules that need the tokenizer's vocabulary size; raise ConfigError."""
    loss = recipe.loss
    if loss.objective == "exact_full_vocab" and vocab_size > loss.exact_max_vocab:
        raise ConfigError(
            f"loss.objective: exact_full_vocab sends {vocab_size} log-probs per position but "
            f"loss.exact_max_vocab is {loss.exact_max_vocab}; use objective: bucketed_topk_tail "
            "or raise exact_max_vocab"
        )
    if loss.objective == "bucketed_topk_tail" and loss.top_k > vocab_size:
        raise ConfigError(
            f"loss.top_k: {loss.top_k} exceeds the vocabulary size {vocab_size}; lower top_k"
        )


def recipe_dict(recipe: Recipe) -> dict[str, Any]:
    """The fully resolved recipe as JSON-compatible data (defaults filled in)."""
    return recipe.model_dump(mode="json")


def recipe_digest(recipe: Recipe) -> str:
    """``sha256:<hex>`` of the canonical resolved JSON; equal recipes give equal digests."""
    canonical = json.dumps(recipe_dict(recipe), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def dump_resolved(recipe: Recipe) -> str:
    """The resolved recipe as YAML (what ``recipe.resolved.yaml`` holds)."""
    import yaml

    header = f"# resolved recipe, {recipe_digest(recipe)}\n"
    return header + yaml.safe_dump(recipe_dict(recipe), sort_keys=False, allow_unicode=True)


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema of the recipe (``miniverl schema recipe``)."""
    return Recipe.model_json_schema()


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):  # an empty mapping contributes no paths
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def diff_recipes(a: Recipe, b: Recipe) -> list[str]:
    """Dotted paths of the fields whose resolved values differ, sorted."""
    flat_a: dict[str, Any] = {}
    flat_b: dict[str, Any] = {}
    _flatten(recipe_dict(a), "", flat_a)
    _flatten(recipe_dict(b), "", flat_b)
    missing = object()
    keys = set(flat_a) | set(flat_b)
    return sorted(k for k in keys if flat_a.get(k, missing) != flat_b.get(k, missing))


def load_recipe(path) -> Recipe:
    """Parse and validate a recipe file; ConfigError lists every error with its location."""
    from .recipe_io import load_recipe as _load

    return _load(path)


def loads_recipe(text: str, source: str = "<string>") -> Recipe:
    """Like :func:`load_recipe` for YAML text; ``source`` names it in messages."""
    from .recipe_io import loads_recipe as _loads

    return _loads(text, source)
