"""The one verl target this bridge speaks: pinned version, commit and profile values.

Everything the exporter writes into ``verl-overrides.yaml`` and everything ``bridge doctor``
checks against comes from here, so the pin lives in one place. This module is data only;
it does not read or write files and knows nothing about runs.

The profile is ``single-gpu-online-distillation-v1``: one node, one GPU, FSDP actor with
a LoRA adapter, vLLM rollout loading safetensors, verl's tool agent with Hermes tool
calls, and a custom reward function. It is a handoff profile, not a claim that verl's
distributed runtime was exercised here.
"""

from __future__ import annotations

from miniverl.common.recipe import dotted_items

VERL_VERSION = "0.8.0"
VERL_COMMIT = "7aed6b230776f963fa09509c10d9c3a767d1102c"
PROFILE = "single-gpu-online-distillation-v1"
BUNDLE_FORMAT = 1

# Name of the reward entry point; verl 0.8.0 needs `name` set next to `path` (a path alone
# crashes in get_custom_reward_fn's `assert fn_name is not None` when a config nulls it).
REWARD_FN_NAME = "compute_score"

# Relative paths inside a bundle. The overrides refer to them through the launch script's
# BUNDLE variable, never through an absolute path, so a bundle can be moved and shared.
BUNDLE_FILES = {
    "train": "data/train.parquet",
    "val": "data/val.parquet",
    "overrides": "recipe/verl-overrides.yaml",
    "tool_config": "recipe/tool_config.yaml",
    "launch": "recipe/launch.template.sh",
    "required_verl": "recipe/REQUIRED_VERL.txt",
    "reward": "reward/compute_score.py",
    "tool_impl": "reward/miniverl_tool.py",
    "base_model": "model/base_model.json",
    "adapter_dir": "model/adapter",
    "tokenizer_dir": "model/tokenizer",
    "manifest": "provenance/manifest.json",
    "source_run": "provenance/source_run.json",
    "sums": "SHA256SUMS",
}

# Overrides whose value the profile fixes. `bridge doctor` compares the exported file
# against these leaf by leaf; the exporter starts from them.
PROFILE_FIXED: dict[str, object] = {
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 1,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    # LoRA weights reach vLLM only through the safetensors loader in verl 0.8.0.
    "actor_rollout_ref.rollout.load_format": "safetensors",
    "actor_rollout_ref.rollout.multi_turn.enable": True,
    "actor_rollout_ref.rollout.multi_turn.format": "hermes",
    "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent",
    "data.prompt_key": "prompt",
    "data.reward_fn_key": "data_source",
    "data.return_raw_chat": True,
    # Never truncate: a prompt longer than max_prompt_length must fail loudly.
    "data.truncation": "error",
    "reward.custom_reward_function.name": REWARD_FN_NAME,
    "distillation.enabled": True,
    "distillation.distillation_loss.use_policy_gradient": False,
    "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.actor.use_kl_loss": False,
}

# Overrides that must be present but whose value comes from the run (checked for presence
# and, for the LoRA keys, equality with the exported adapter's config).
PROFILE_FROM_RUN = (
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.model.target_modules",
    "actor_rollout_ref.model.lora_adapter_path",
    "actor_rollout_ref.actor.optim.lr",
    "data.train_files",
    "data.val_files",
    "data.max_prompt_length",
    "data.max_response_length",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
    "reward.custom_reward_function.path",
    "distillation.distillation_loss.topk",
    "distillation.distillation_loss.loss_mode",
    "distillation.teacher_models.teacher_model.model_path",
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.logger",
)

# run.loggers -> verl's trainer.logger (verl/utils/tracking.py of 0.8.0 supports each).
# miniverl's jsonl files (always on) become verl's console logger, which is always on too.
VERL_LOGGERS = {"jsonl": "console", "tensorboard": "tensorboard", "wandb": "wandb",
                "mlflow": "mlflow", "trackio": "trackio"}


def verl_loggers(loggers: list[str]) -> list[str]:
    """``trainer.logger`` for a run's ``run.loggers``: console first, then its trackers."""
    return list(dict.fromkeys(["console", *(VERL_LOGGERS[name] for name in loggers)]))


def required_verl_text() -> str:
    """Contents of ``recipe/REQUIRED_VERL.txt``."""
    return f"verl=={VERL_VERSION}\ncommit {VERL_COMMIT}\nprofile {PROFILE}\n"


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """Dotted-key view of a nested mapping (lists are leaves)."""
    return dotted_items(tree, prefix)


def set_dotted(tree: dict, dotted: str, value: object) -> None:
    """Set ``tree[a][b][c] = value`` for ``dotted`` ``"a.b.c"``, making missing levels."""
    node = tree
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def unflatten(flat: dict[str, object]) -> dict:
    """Nested mapping from dotted keys (inverse of :func:`flatten`)."""
    tree: dict = {}
    for dotted, value in flat.items():
        set_dotted(tree, dotted, value)
    return tree
