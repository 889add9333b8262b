"""The recipe's sections other than the models: run, environment (and one environment of
a mixture), rollout, loss, train, cache, eval, dpo and runtime, plus the base every
section shares.

Each section is a pydantic model with ``extra="forbid"``, bounds on every field and
rules that read only its own fields; :func:`raise_issues` reports several broken rules
of one section at once, each at its own field. Rules that read two sections (a mode
and its training options, a rollout length and a toy model's positions) live on
:class:`~miniverl.common.recipe.Recipe`; the student and teacher sections live in
:mod:`miniverl.common.recipe_models`.

This module does not read YAML (:mod:`miniverl.common.recipe_io`) or know which
environments exist.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

Mode = Literal["sft", "offline_kd", "opd", "replay", "dpo", "rl"]
# Where a run's metrics and events go: jsonl (metrics.jsonl, events.jsonl) is always on;
# the others are experiment trackers, each an optional extra (docs/tracking.md).
Logger = Literal["jsonl", "tensorboard", "wandb", "mlflow", "trackio"]
LOGGERS: tuple[str, ...] = ("jsonl", "tensorboard", "wandb", "mlflow", "trackio")


def unset(description: str, **bounds: Any) -> Any:
    """A field that stays null until a recipe sets it, with its ``bounds`` (``ge``, ``le``,
    ...): a null field is left out of the recipe's digest (``LOSS_VARIANT_FIELDS``,
    ``HASHED_ONLY_WHEN_SET`` in ``common/recipe.py``), so recipes written before it keep
    their digests; ``description`` says what null means."""
    return Field(None, description=description, **bounds)


def raise_issues(issues: list[tuple], involves: dict[str, tuple[str, ...]] | None = None) -> None:
    """Raise one pydantic error carrying several ``(sub-location, message)`` issues.

    ``load_recipe`` expands them into one line each with a precise location; a plain
    ``model_validate`` shows them joined by ``"; "``. ``involves`` maps a sub-location's
    first part to the sibling fields the rule reads, so a rule is not re-reported with a
    default value once one of those fields was reported broken. An issue may carry its
    own involved fields as a third item; a field named ``"/section.field"`` is a path
    from the recipe's root (a rule of one section that reads another: a route reads the
    teacher sections, so a broken teacher section is reported alone, not with the
    routes it leaves unserved).
    """
    if issues:
        involves = involves or {}
        raise PydanticCustomError(
            "miniverl_rule",
            "; ".join(msg for _, msg, *_ in issues),
            {
                "issues": [
                    (list(loc), msg, list(own[0] if own else
                                          involves.get(str(loc[0]) if loc else "", ())))
                    for loc, msg, *own in issues
                ]
            },
        )


def raise_issue(field: str, message: str, involves: tuple[str, ...] = ()) -> None:
    """:func:`raise_issues` for one rule reported at one field of the section."""
    raise_issues([((field,), message)], {field: involves} if involves else None)


class Section(BaseModel):
    """Base of every recipe section: unknown keys are errors, defaults are validated."""

    model_config = ConfigDict(extra="forbid", validate_default=True)



class EnvironmentConfig(Section):
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


class MixtureEnvironmentConfig(EnvironmentConfig):
    """One environment of a mixture (``environments:``): an environment section with the
    weight its episodes are drawn with (docs/environments.md, "Mixtures")."""

    weight: float = Field(
        1.0, ge=0.0, allow_inf_nan=False,
        description="Share of a cycle's episodes drawn from this environment, relative to "
        "the others' weights (finite, >= 0; the weights sum to more than 0).",
    )
    teacher: str | None = Field(
        None, min_length=1, max_length=64,
        description="The teacher of teachers: that scores this environment's episodes "
        "(docs/several-teachers.md); unset with one teacher: section.",
    )
    adapter: str | None = Field(
        None, min_length=1, max_length=64,
        description="The adapter of the routed teacher's adapters: that scores this "
        "environment's episodes (one process serving several; docs/several-teachers.md).",
    )


class RolloutConfig(Section):
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
    view: Literal["privileged_context"] | None = Field(
        None,
        description="privileged_context: every episode (oracle trace, eval) also shows the "
        "task's privileged context in its system message; only to prepare a privileged "
        "teacher by SFT (run.mode sft). Unset: the plain view.",
    )
    group_size: int | None = Field(
        None, ge=1, le=64,
        description="Episodes per task in one batch (opd, replay, dpo): rollouts_per_cycle / "
        "group_size tasks, each played group_size times with distinct episode seeds. Unset: "
        "1 (dpo: dpo.group_size).",
    )
    # Added after recipes were hashed: null is left out of the digest (HASHED_ONLY_WHEN_SET).
    engine: Literal["hf", "vllm"] | None = Field(
        None,
        description="Who samples the training episodes: hf (the student's own decode loop "
        "over its transformers model) or vllm (vLLM's engine inside the student process, "
        "the trainer's weights synced into it before every rollout batch; needs vLLM "
        "installed, docs/rollouts.md \"Sampling engines\"). null = hf. Eval always plays "
        "with hf.",
    )
    engine_memory: float | None = Field(
        None, gt=0.0, lt=1.0,
        description="engine vllm on CUDA: the share of the GPU's memory the engine takes "
        "(weights and KV cache) while it samples; it sleeps during the update. null = 0.3. "
        "On the CPU the KV cache holds batch_size episodes of max_total_tokens.",
    )
    engine_check: bool | None = Field(
        None,
        description="engine vllm: after every sync, compare the engine's log-probs of the "
        "sampled tokens with the trainer's forward on the same tokens (one no-grad forward "
        "of the batch; metrics engine_logprob_gap_max/mean). null = on; false saves the "
        "forward.",
    )

    @property
    def engine_memory_share(self) -> float:
        """``engine_memory`` resolved: the share of a GPU the vLLM engine takes (null: 0.3);
        the engine is started with it and the memory plan counts it."""
        return 0.3 if self.engine_memory is None else self.engine_memory

    @model_validator(mode="after")
    def _lengths(self) -> RolloutConfig:
        if self.max_total_tokens <= self.max_new_tokens_per_turn:
            raise_issue(
                "max_total_tokens",
                f"max_total_tokens {self.max_total_tokens} must exceed max_new_tokens_per_turn "
                f"{self.max_new_tokens_per_turn} (the prompt needs room); raise it",
                involves=("max_new_tokens_per_turn",),
            )
        return self


class LossConfig(Section):
    objective: Literal["exact_full_vocab", "bucketed_topk_tail"] = Field(
        "bucketed_topk_tail",
        description="exact: teacher sends all V log-probs; bucketed: top-k plus one tail bucket.",
    )
    divergence: Literal["forward_kl", "reverse_kl", "jsd"] = Field(
        "forward_kl", description="KL(teacher||student), KL(student||teacher) or beta-JSD."
    )
    jsd_beta: float = Field(0.5, ge=0.0, le=1.0, description="JSD mixing weight (jsd only).")
    top_k: int = Field(16, ge=1, le=4096, description="Teacher top-k ids per position (bucketed).")
    temperature: float = Field(  # the wire allows [0.05, 20]: docs/protocol.md says why
        1.0, ge=0.05, le=10.0, description="Softmax temperature of both sides."
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
    # The standard variants (docs/losses.md), LOSS_VARIANT_FIELDS: null while unset, so
    # recipes that do not use them keep their digests.
    importance_ratio_cap: float | None = unset(
        "sampled_token, task rewards: weight each token by min(S(y)/q(y), cap), "
        "q(y) the probability it was sampled with (truncated importance sampling); null = "
        "no ratio.", ge=1.0, le=1000.0)
    log_ratio_clamp: float | None = unset(
        "sampled_token: clamp each token's log-ratio log S(y) - log T(y) to "
        "[-c, c] before it weighs the gradient; null = no clamp.", gt=0.0, le=100.0)
    aggregation: Literal["token", "sequence"] | None = unset(
        "token: every trained position weighs the same; sequence: every "
        "episode weighs the same (the mean over its positions, then over episodes); null = "
        "token.")
    use_task_rewards: bool | None = unset(
        "Add the REINFORCE term -(r - b) log S(y) on the trained positions "
        "(r: the verifier's score, b: reward_baseline) beside the distillation term; "
        "opd and replay; null = false.")
    distillation_loss_coef: float | None = unset(
        "use_task_rewards: weight of the distillation term beside the reward "
        "term; null = 1.0.", ge=0.0, le=1000.0)
    reward_baseline: Literal["group", "batch"] | None = unset(
        "use_task_rewards: b = the mean score of the other episodes of the same "
        "task in the update (group) or of every other episode of it (batch); null = group.")
    # Added after recipes were hashed: null is left out of the digest (HASHED_ONLY_WHEN_SET).
    cross_vocab: Literal["sampled_token", "hybrid", "uld"] | None = unset(
        "teacher.tokenizer: other: the target across vocabularies. "
        "sampled_token: the group sampled-token estimator (estimator: sampled_token); "
        "hybrid: exact matching on one-token groups whose tokens are a vocabulary-map "
        "pair, ULD on the rest; uld: ULD on every group (both estimator: full); null = "
        "sampled_token (docs/cross-tokenizer.md).")
    # Added after recipes were hashed: null is left out of the digest (HASHED_ONLY_WHEN_SET).
    fp32_head: bool | None = unset(
        "Compute the output layer (the V-wide logits) in float32 from a "
        "bfloat16/float16 model's hidden states, in the student's loss and rollouts and the "
        "teacher's scoring: a bf16 head is off by up to ~0.06 at logits near 20-30, the "
        "order of the sampled-token signal (docs/gpu.md, \"Precision\"); null = on for the "
        "modes with a teacher, off for sft and rl. No effect on a float32 model.")
    allow_temperature_mismatch: bool | None = unset(
        "true: a full-distribution loss at a temperature other than "
        "rollout.temperature is on purpose; null = refused where the student's samples are "
        "trained on.")

    @model_validator(mode="after")
    def _combinations(self) -> LossConfig:
        issues: list[tuple[tuple[str | int, ...], str]] = []
        issues.extend(self._variant_issues())
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
        raise_issues(issues, {"position_ratio": ("positions",), "estimator": ("divergence",),
                              "importance_ratio_cap": ("estimator", "use_task_rewards"),
                              "log_ratio_clamp": ("estimator",),
                              "distillation_loss_coef": ("use_task_rewards",),
                              "reward_baseline": ("use_task_rewards",)})
        return self

    def _variant_issues(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Variant fields set where nothing reads them."""
        issues: list[tuple[tuple[str | int, ...], str]] = []
        sampled = self.estimator == "sampled_token"
        if self.importance_ratio_cap is not None and not (sampled or self.use_task_rewards):
            issues.append((("importance_ratio_cap",), (
                f"importance_ratio_cap {self.importance_ratio_cap:g} weighs sampled tokens, but "
                "estimator full trains on whole distributions and use_task_rewards is unset; "
                "set estimator: sampled_token (divergence: reverse_kl) or remove it")))
        if self.log_ratio_clamp is not None and not sampled:
            issues.append((("log_ratio_clamp",), (
                f"log_ratio_clamp {self.log_ratio_clamp:g} clamps the sampled-token "
                "estimator's log-ratio (estimator is full); set estimator: sampled_token or "
                "remove it")))
        # reward_baseline is checked with the mode (common/recipe.py): mode rl reads it.
        if self.distillation_loss_coef is not None and not self.use_task_rewards:
            issues.append((("distillation_loss_coef",), (
                f"distillation_loss_coef {self.distillation_loss_coef!r} applies only beside "
                "a task reward (use_task_rewards is unset); set use_task_rewards: true or "
                "remove distillation_loss_coef")))
        return issues


# The standard variants' fields (docs/losses.md): null while unset, and left out of the
# recipe digest then (common/recipe.py HASHED_ONLY_WHEN_SET).
LOSS_VARIANT_FIELDS: tuple[str, ...] = (
    "importance_ratio_cap", "log_ratio_clamp", "aggregation", "use_task_rewards",
    "distillation_loss_coef", "reward_baseline", "allow_temperature_mismatch",
)


class TrainConfig(Section):
    cycles: int = Field(10, ge=1, le=1_000_000, description="Rollout -> score -> update cycles.")
    rollouts_per_cycle: int = Field(8, ge=1, le=100_000, description="Episodes per cycle.")
    updates_per_batch: int = Field(
        1, ge=1, le=64, description="Optimizer steps per rollout batch (strict OPD: 1)."
    )
    grad_accum: int = Field(1, ge=1, le=1024, description="Micro-batches per optimizer step.")
    # Added after recipes were hashed: null is left out of the digest (HASHED_ONLY_WHEN_SET).
    micro_batch_tokens: int | None = Field(
        None, ge=1, le=16_777_216,
        description="memory: pack each update's trajectories, whole and in order, into "
        "micro-batches of at most this many padded tokens (one trajectory alone may pass "
        "it), gradients accumulated and the loss normalised over the whole step as "
        "before; null = grad_accum micro-batches by count, or, on CUDA, what the memory "
        "plan picks (docs/gpu.md, \"The memory plan\").",
    )
    gradient_checkpointing: bool | None = Field(
        None,
        description="memory: keep only each decoder layer's input for backward and "
        "recompute the rest (non-reentrant, works with LoRA); about a third more compute "
        "per update; null = off, or, on CUDA, on when the memory plan needs it.",
    )
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
    fixed_set: Literal["oracle", "student", "teacher"] | None = Field(
        None,
        description=(
            "offline_kd: oracle = oracle traces of the training tasks; student = episodes "
            "the starting policy samples once, cycles x rollouts_per_cycle on the task "
            "schedule opd would use (frozen student states); teacher = one episode per "
            "training task played once by the teacher's weights (offline_kd, or sft: SeqKD); "
            "null = trajectories, else oracle."
        ),
    )
    on_policy_fraction: float | None = Field(
        None, ge=0.0, le=1.0,
        description="offline_kd: share of each batch sampled fresh by the current policy "
        "(GKD's lambda), the rest drawn from the fixed set; null = none.",
    )
    score_fixed_set: Literal["all", "drawn"] | None = Field(
        None,
        description="offline_kd: when the fixed set's targets are requested. all = every "
        "trajectory before the first update; drawn = each update's draw the first time "
        "it holds a trajectory (cache hits free), and a teacher set is played only for "
        "the tasks the planned draws hold, so a run pays for what it trains on; the "
        "frozen student set is always scored first; null = all.",
    )
    oracle_tasks: int | None = Field(
        None, ge=1, le=10_000_000,
        description="How many of the training tasks (the first N) have an oracle trace: "
        "sft (and its warm-up) trains on theirs only, offline_kd's oracle set holds "
        "theirs only; fresh and teacher episodes still use every training task; "
        "null = all.",
    )

    @model_validator(mode="after")
    def _warmup_options(self) -> TrainConfig:
        issues: list[tuple[tuple[str | int, ...], str]] = []
        if self.fixed_set is not None and self.trajectories is not None:
            issues.append((("fixed_set",), (
                f"fixed_set {self.fixed_set!r} and trajectories {self.trajectories!r} both "
                "name the offline_kd set; keep one of them")))
        if self.micro_batch_tokens is not None and self.grad_accum != 1:
            issues.append((("micro_batch_tokens",), (
                f"micro_batch_tokens {self.micro_batch_tokens} and grad_accum "
                f"{self.grad_accum} both split the update; keep one of them (grad_accum: 1 "
                "with a token budget)")))
        if self.fixed_set == "student" and self.max_wall_s is not None:
            issues.append((("fixed_set",), (
                "fixed_set 'student' samples cycles x rollouts_per_cycle episodes before the "
                f"first update, which a wall-time budget (max_wall_s {self.max_wall_s:g}) cannot "
                "size; remove max_wall_s and set cycles")))
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
        raise_issues(
            issues,
            {"sft_warmup_lr": ("sft_warmup_steps",),
             "sft_warmup_until_loss": ("sft_warmup_steps",),
             "fixed_set": ("trajectories", "max_wall_s")},
        )
        return self


class CacheConfig(Section):
    enabled: bool = Field(True, description="Cache teacher targets on disk.")
    dir: str | None = Field(
        None, min_length=1,
        description="Cache directory, shared by the runs that name it: teacher targets, and "
        "the teacher's own episodes (train.fixed_set teacher, coverage references; a "
        "fixed-set episode read back is charged at what it cost to play); null = "
        "<run>/targets (targets only).",
    )
    max_bytes: int = Field(
        10 * 2**30, ge=0, le=2**50, description="Evict oldest shards beyond this size."
    )


class EvalConfig(Section):
    split: Literal["eval", "test"] = Field("eval", description="Held-out split to evaluate on.")
    greedy: bool = Field(True, description="Greedy decoding during eval.")
    max_tasks: int | None = Field(None, ge=1, le=1_000_000, description="Cap on evaluated tasks.")
    samples: int | None = Field(
        None, ge=1, le=64,
        description="Also play every task this many times sampled at eval.temperature and "
        "report the mean success beside the first; null = no sampled eval.",
    )
    temperature: float | None = Field(
        None, gt=0.0, le=5.0,
        description="Sampling temperature of the eval.samples episodes; null = 1.0.",
    )
    before: bool | None = Field(
        None,
        description="Evaluate the starting version before the first update (null = true); "
        "false skips it: a benchmark whose cells all start from one measured checkpoint.",
    )

    @model_validator(mode="after")
    def _sampled(self) -> EvalConfig:
        if self.temperature is not None and self.samples is None:
            raise_issue("temperature", f"temperature {self.temperature:g} applies only to "
                        "sampled eval episodes (samples is unset); set samples: N or remove "
                        "temperature", involves=("samples",))
        return self


class DpoConfig(Section):
    beta: float = Field(0.1, gt=0.0, le=10.0, description="DPO inverse temperature.")
    group_size: int = Field(
        4, ge=2, le=64,
        description="Rollouts per task per cycle; a success and a failure of one task make a pair.",
    )


class RuntimeConfig(Section):
    cpu_threads: int = Field(
        1, ge=1, le=512, description="Torch/OpenMP threads per process (1 is fastest for toys)."
    )
    warmup_cpu_threads: int | None = Field(
        None, ge=1, le=512,
        description="Threads for the SFT warm-up once the teacher has answered HELLO and waits "
        "idle on this machine (at most its core count); cpu_threads again after it. "
        "None: cpu_threads throughout.",
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
            raise_issue(
                "unavailable_timeout_s",
                f"unavailable_timeout_s {self.unavailable_timeout_s} is shorter than three "
                f"heartbeats ({3 * self.heartbeat_ms} ms); raise it or lower heartbeat_ms",
                involves=("heartbeat_ms",),
            )
        return self


class RunConfig(Section):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        max_length=64,
        description="Run name; the run id starts with it.",
    )
    mode: Mode = Field(description="sft, offline_kd, opd (strict on-policy), replay, dpo or rl "
                            "(the task reward alone, no teacher).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Global seed.")
    output_dir: str = Field("runs", min_length=1, description="Parent directory of run dirs.")
    deterministic: bool = Field(
        False, description="Deterministic kernels, and each SCORE scored alone (bitwise reruns)."
    )
    loggers: list[Logger] = Field(
        default_factory=lambda: list[Logger](["jsonl"]),
        max_length=len(LOGGERS),
        description="jsonl (always on) plus experiment trackers: tensorboard, wandb, mlflow, trackio.",
    )

    @field_validator("loggers")
    @classmethod
    def _jsonl_always_on(cls, loggers: list[str]) -> list[str]:
        # metrics.jsonl and events.jsonl are the run's own record (report, resume, export):
        # they are written whatever else is chosen, so the list always starts with jsonl.
        return ["jsonl", *dict.fromkeys(name for name in loggers if name != "jsonl")]
