"""The verl targets this bridge speaks: pinned releases, and the profile values of each.

Everything the exporter writes into ``verl-overrides.yaml`` and everything ``bridge doctor``
checks against comes from here, so each pin lives in one place. This module is data only;
it does not read or write files and knows nothing about runs.

The profile is ``single-gpu-online-distillation-v1``: one node, one GPU, FSDP actor with
a LoRA adapter, vLLM rollout loading safetensors, verl's tool agent with Hermes tool
calls, and a custom reward function. It is a handoff profile, not a claim that verl's
distributed runtime was exercised here.

Two releases are targets (``miniverl export-verl --verl-version``), each checked by its
own code in its own venv (tests/bridge/test_verl_real.py). What differs between them is
the trainer ``main_ppo`` runs: 0.8.0's ``TaskRunner`` (``RayPPOTrainer``), and in 0.9.1
``trainer.use_v1: true`` (its default) selects ``TaskRunnerV1``, the new trainer whose
data path is TransferQueue (``import transfer_queue`` at start; the package is in
verl's ``verl-core`` extra). A 0.9.1 bundle states that choice and its mode (``sync``,
``PPOTrainerSync``: trainer and rollout colocated, no partial rollouts, weights pushed to
the rollout after every step: the on-policy order miniverl trains in) instead of
inheriting a default a later release may change. Every other key the profile writes is a
key of both releases' ``ppo_trainer`` config (tests/bridge/verl_check.py checks; 0.9.1
removed ``rollout.skip`` and ``mbridge_config``, which the profile never wrote). The
default target stays 0.8.0: its trainer is the one the prompt-parity check
(tests/bridge/test_verl_prompt_parity.py) ran against on a real model, bundles already
exported name it, and 0.9.1's default trainer is new and needs TransferQueue besides;
neither release's distributed runtime is exercised here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from miniverl.common.errors import ConfigError
from miniverl.common.recipe import dotted_items

PROFILE = "single-gpu-online-distillation-v1"
BUNDLE_FORMAT = 1


@dataclass(frozen=True)
class VerlTarget:
    """One verl release a bundle can be written for."""

    version: str
    # provenance/manifest.json's ``verl`` (and doctor's): the release and what pins it.
    identity: dict[str, str]
    # What main_ppo runs on this bundle (verl_check.py reads it from the composed config).
    trainer: str
    # Profile-fixed overrides this release needs on top of PROFILE_FIXED.
    fixed: dict[str, object] = field(default_factory=dict)
    # Modules the launch script checks besides verl: (import name, pip requirement).
    modules: tuple[tuple[str, str], ...] = ()


VERL_TARGETS: dict[str, VerlTarget] = {
    "0.8.0": VerlTarget(
        version="0.8.0",
        identity={"version": "0.8.0", "commit": "7aed6b230776f963fa09509c10d9c3a767d1102c"},
        trainer="TaskRunner",
    ),
    "0.9.1": VerlTarget(
        version="0.9.1",
        # The registry's wheel, verl-0.9.1-py3-none-any.whl, by its sha256.
        identity={"version": "0.9.1",
                  "wheel_sha256": "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14"},
        trainer="TaskRunnerV1",
        fixed={"trainer.use_v1": True, "trainer.v1.trainer_mode": "sync"},
        modules=(("transfer_queue", "TransferQueue>=0.1.10"),),
    ),
}
DEFAULT_VERL_VERSION = "0.8.0"
# What a bundle's README says about the checks (tests/bridge/test_verl_real.py runs them).
CHECKED_WITH = (
    "miniverl checks its bundles with the code of official verl "
    + " and ".join(VERL_TARGETS)
    + ", each in its own venv: Hydra composition, the dataset, the reward and the tool "
    "loader; distributed execution is not tested."
)
# The default target's pins, for the modules that name one release.
VERL_VERSION = DEFAULT_VERL_VERSION
VERL_COMMIT = VERL_TARGETS["0.8.0"].identity["commit"]


def verl_target(version: str | None) -> VerlTarget:
    """The target for ``version`` (None: the default), or a ConfigError naming the choices."""
    target = VERL_TARGETS.get(version or DEFAULT_VERL_VERSION)
    if target is None:
        raise ConfigError(
            f"--verl-version {version!r} is not a verl release this bridge targets; "
            f"use one of {', '.join(sorted(VERL_TARGETS))}"
        )
    return target


def target_of_manifest(manifest: dict) -> VerlTarget:
    """The target a bundle's ``provenance/manifest.json`` names, or a ConfigError."""
    verl = manifest.get("verl")
    version = verl.get("version") if isinstance(verl, dict) else None
    target = VERL_TARGETS.get(version) if isinstance(version, str) else None
    if target is None or verl != target.identity:
        raise ConfigError(
            f"the bundle names verl {verl!r}; this miniverl writes and reads bundles for "
            + "; ".join(f"{t.identity}" for t in VERL_TARGETS.values())
        )
    return target


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
    # miniverl's OPD trains on the divergence alone. verl's default (true, both releases)
    # adds its PPO policy loss on the task reward's advantages to the distillation loss
    # (trainer/distillation/losses.py); export-verl refuses a run trained with
    # loss.use_task_rewards set, so every bundle's run trained without a task reward.
    "distillation.distillation_loss.use_task_rewards": False,
    "algorithm.use_kl_in_reward": False,
    # No critic: distillation trains on the teacher's targets, not on advantages. Left
    # unset, verl's need_critic() (both releases) builds one for the default gae
    # estimator, from critic.model.path's default (a 7B model this bundle never names).
    "critic.enable": False,
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

# loss.divergence -> the distillation_loss.loss_mode export-verl writes for it (verl's k3
# estimates the reverse KL from the sampled token, whichever estimator miniverl trained).
EXPORTED_LOSS_MODES = {"forward_kl": "forward_kl_topk", "reverse_kl": "k3"}

# run.loggers -> verl's trainer.logger (verl/utils/tracking.py of 0.8.0 supports each).
# miniverl's jsonl files (always on) become verl's console logger, which is always on too.
VERL_LOGGERS = {"jsonl": "console", "tensorboard": "tensorboard", "wandb": "wandb",
                "mlflow": "mlflow", "trackio": "trackio"}


def verl_loggers(loggers: list[str]) -> list[str]:
    """``trainer.logger`` for a run's ``run.loggers``: console first, then its trackers."""
    return list(dict.fromkeys(["console", *(VERL_LOGGERS[name] for name in loggers)]))


def fixed_values(target: VerlTarget) -> dict[str, object]:
    """Every profile-fixed override of a bundle for ``target``."""
    return {**PROFILE_FIXED, **target.fixed}


def required_verl_text(target: VerlTarget | None = None) -> str:
    """Contents of ``recipe/REQUIRED_VERL.txt``."""
    target = target or verl_target(None)
    pins = "".join(f"{key.replace('_', ' ')} {value}\n"
                   for key, value in target.identity.items() if key != "version")
    return f"verl=={target.version}\n{pins}profile {PROFILE}\n"


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
