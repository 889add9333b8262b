"""Check a miniverl bundle with an official verl release's own code (0.8.0 or 0.9.1); run
with the python of that release's venv (``tests/bridge/setup_verl_venv.sh VERSION``).

    ~/.cache/miniverl/verl-VERSION-venv/bin/python tests/bridge/verl_check.py BUNDLE

What it exercises, all inside verl's code paths:
1. Hydra composes verl's ``ppo_trainer`` config with ``recipe/verl-overrides.yaml`` (the
   same ``--config-path/--config-name`` the launch script uses); every key the bundle
   writes is a key of verl's own ``ppo_trainer`` (Hydra adds an unknown key from the
   primary config silently, so a key a release renamed or removed would be ignored
   without this); ``validate_config``, which ``main_ppo`` runs on every config, accepts
   it; the trainer ``main_ppo`` would run is read from the config (``trainer.use_v1``
   in 0.9: ``TaskRunnerV1``, which needs TransferQueue; else ``TaskRunner``); and verl's
   dataclasses accept the distillation, rollout and actor sections
   (``omega_conf_to_dataclass``);
2. ``RLHFDataset`` loads ``data/train.parquet`` with the bundle's tokenizer and returns
   rows whose ``raw_prompt`` renders through the chat template with the tool schemas;
3. ``get_custom_reward_fn`` loads ``reward/compute_score.py`` and scores a row's ground
   truth (1.0) and garbage (0.0);
4. ``load_all_tools`` instantiates the tool classes from ``recipe/tool_config.yaml`` and
   one tool call runs through ``create``/``execute``/``release`` with a row's kwargs.

It does not start Ray, vLLM, FSDP or a training step: distributed execution is not
tested. Prints one JSON object; exits 1 if any step failed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from pathlib import Path

# The launch script's composition, shared with the prompt check (this folder is on
# sys.path: the script runs as `python tests/bridge/verl_check.py`).
from verl_prompt_check import compose

MARKER = "VERL_CHECK_RESULT "


def main(bundle: Path) -> int:
    bundle = bundle.resolve()
    results: dict = {"verl_version": None, "steps": {}}
    sys.path.insert(0, str(bundle / "reward"))

    def step(name):
        def wrap(fn):
            try:
                results["steps"][name] = {"ok": True, **(fn() or {})}
            except Exception as exc:  # report every step, not just the first failure
                results["steps"][name] = {
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(limit=4),
                }
            return fn

        return wrap

    import verl

    results["verl_version"] = verl.__version__
    state: dict = {}

    @step("compose")
    def _compose():
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config

        cfg = compose(bundle, Path("/nonexistent/base"))
        state["cfg"] = cfg
        unknown = _unknown_keys(bundle)
        try:
            validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg),
                            use_critic=need_critic(cfg))
            validated = "all checks"
        except ModuleNotFoundError as exc:
            # validate_config's last check imports vLLM's rollout utilities (Ray and vLLM
            # at import) to compare lora_rank with vLLM's maximum; every check before it ran.
            frames = traceback.extract_tb(exc.__traceback__)
            if not any(f.name == "validate_config" and "get_vllm_max_lora_rank" in (f.line or "")
                       for f in frames):
                raise
            validated = "all checks before vLLM's maximum LoRA rank (needs vLLM)"
        entry_point = "TaskRunnerV1" if cfg.trainer.get("use_v1", False) else "TaskRunner"
        adapter = json.loads((bundle / "model/adapter/adapter_config.json").read_text())
        model = cfg.actor_rollout_ref.model
        assert model.lora_rank == adapter["r"], (model.lora_rank, adapter["r"])
        assert model.lora_alpha == adapter["lora_alpha"]
        assert sorted(model.target_modules) == sorted(adapter["target_modules"])
        assert cfg.actor_rollout_ref.rollout.load_format == "safetensors"
        assert cfg.reward.custom_reward_function.name == "compute_score"
        assert cfg.data.tool_config_path == str(bundle / "recipe/tool_config.yaml")
        dataclasses = {}
        # The sections verl's trainer and workers turn into dataclasses themselves. Not
        # reward.reward_manager: in verl 0.8.0 RewardManagerConfig.__post_init__ calls a
        # super().__post_init__ that BaseConfig lacks, for verl's own defaults too, and the
        # trainer never instantiates it.
        for name, node in (
            ("distillation", cfg.distillation),
            ("rollout", cfg.actor_rollout_ref.rollout),
            ("actor", cfg.actor_rollout_ref.actor),
        ):
            obj = omega_conf_to_dataclass(node)
            dataclasses[name] = type(obj).__name__
        return {
            "unknown_keys": unknown,
            "validate_config": validated,
            "use_critic": need_critic(cfg),
            "entry_point": entry_point,
            "dataclasses": dataclasses,
            "loss_mode": cfg.distillation.distillation_loss.loss_mode,
            "topk": cfg.distillation.distillation_loss.topk,
        }

    @step("dataset")
    def _dataset():
        from transformers import AutoTokenizer
        from verl.utils.dataset.rl_dataset import RLHFDataset

        cfg = state["cfg"]
        tok = AutoTokenizer.from_pretrained(str(bundle / "model/tokenizer"))
        data_cfg = cfg.data
        ds = RLHFDataset(
            data_files=[str(bundle / "data/train.parquet")],
            tokenizer=tok,
            config=data_cfg,
            processor=None,
        )
        row = ds[0]
        state["row"] = row
        assert isinstance(row["raw_prompt"], list) and row["raw_prompt"][0]["role"] == "system"
        assert set(row["tools_kwargs"]) == {
            t["tool_schema"]["function"]["name"] for t in _tool_config(bundle)["tools"]
        }
        assert ds.tool_schemas, "RLHFDataset did not load the tool schemas from tool_config.yaml"
        rendered = tok.apply_chat_template(
            row["raw_prompt"], tools=ds.tool_schemas, add_generation_prompt=True, tokenize=False
        )
        n_tokens = len(tok(rendered, add_special_tokens=False)["input_ids"])
        longest = max(
            len(
                tok(
                    tok.apply_chat_template(
                        ds[i]["raw_prompt"],
                        tools=ds.tool_schemas,
                        add_generation_prompt=True,
                        tokenize=False,
                    ),
                    add_special_tokens=False,
                )["input_ids"]
            )
            for i in range(len(ds))
        )
        assert longest <= cfg.data.max_prompt_length, (longest, cfg.data.max_prompt_length)
        return {
            "rows": len(ds),
            "first_prompt_tokens": n_tokens,
            "longest_prompt_tokens": longest,
            "max_prompt_length": cfg.data.max_prompt_length,
            "tools": sorted(row["tools_kwargs"]),
        }

    @step("reward")
    def _reward():
        from verl.trainer.ppo.reward import get_custom_reward_fn

        fn = get_custom_reward_fn(state["cfg"])
        row = state["row"]
        truth = row["reward_model"]["ground_truth"]
        good = fn(row["data_source"], truth, truth, row["extra_info"])
        hermes = (
            f'<tool_call>\n{{"name": "calculator", "arguments": {{}}}}\n</tool_call>'
            f"<|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response><|im_end|>\n"
            f"<|im_start|>assistant\n{truth}<|im_end|>"
        )
        good_hermes = fn(row["data_source"], hermes, truth, row["extra_info"])
        bad = fn(row["data_source"], "\x00<tool_call>{garbage", truth, row["extra_info"])
        assert good == 1.0 and good_hermes == 1.0 and bad == 0.0, (good, good_hermes, bad)
        return {"ground_truth_score": good, "hermes_score": good_hermes, "garbage_score": bad}

    @step("tools")
    def _tools():
        from verl.tools.tool_registry import load_all_tools

        tools = {t.name: t for t in load_all_tools(str(bundle / "recipe/tool_config.yaml"), None)}
        row = state["row"]
        name = sorted(tools)[0]
        kwargs = row["tools_kwargs"][name]

        async def call():
            tool = tools[name]
            instance_id, _ = await tool.create(create_kwargs=kwargs.get("create_kwargs", {}))
            response, reward, _ = await tool.execute(instance_id, _probe_args(tool))
            await tool.release(instance_id)
            return response.text

        text = asyncio.run(call())
        assert isinstance(text, str) and text, text
        return {"tools": sorted(tools), "called": name, "response": text[:80]}

    results["ok"] = all(s["ok"] for s in results["steps"].values())
    # verl prints to stdout too; the result is the last line, after a marker.
    print(MARKER + json.dumps(results, default=str))
    return 0 if results["ok"] else 1


def _unknown_keys(bundle: Path) -> list[str]:
    """Keys of ``verl-overrides.yaml`` that verl's own ``ppo_trainer`` config lacks."""
    import yaml
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        own = hydra_compose(config_name="ppo_trainer")
    overrides = yaml.safe_load((bundle / "recipe/verl-overrides.yaml").read_text())
    absent = object()
    unknown = []

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                walk(value, dotted + ".")
            else:
                try:
                    found = OmegaConf.select(own, dotted, default=absent, throw_on_missing=True)
                except MissingMandatoryValue:  # a key verl declares ??? (no default)
                    found = None
                if found is absent:
                    unknown.append(dotted)

    walk({k: v for k, v in overrides.items() if k not in ("hydra", "defaults")}, "")
    return unknown


def _tool_config(bundle: Path) -> dict:
    import yaml

    return yaml.safe_load((bundle / "recipe/tool_config.yaml").read_text())


def _probe_args(tool) -> dict:
    """Arguments for a harmless call: the calculator gets an expression, others strings."""
    props = tool.tool_schema.function.parameters.properties
    if "expression" in props:
        return {"expression": "2 + 3"}
    return {k: ("1" if p.type == "string" else 1) for k, p in props.items()}


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
