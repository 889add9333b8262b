"""Render every row of a miniverl bundle the way verl 0.8.0's tool agent loop does; run
with the verl venv's python.

    $MINIVERL_VERL_VENV/bin/python tests/bridge/verl_prompt_check.py BUNDLE BASE_MODEL_DIR OUT.json

What runs is verl's own code, in the order its trainer and rollout worker run it:

1. Hydra composes ``ppo_trainer`` with ``recipe/verl-overrides.yaml`` and the launch
   script's path overrides (``BASE_MODEL_DIR`` as the model, the bundle's tokenizer);
2. ``hf_tokenizer(BASE_MODEL_DIR)`` and the configured dataset class (``RLHFDataset``)
   build the train and val datasets as ``main_ppo.create_rl_dataset`` does, its
   overlong-prompt filter included (a dropped row shows in ``dataset_rows``);
3. like ``AgentLoopWorker``: ``HFModelConfig`` (``omega_conf_to_dataclass``) loads the
   bundle's tokenizer, ``load_all_tools`` the tools of ``recipe/tool_config.yaml``, and
   the agent loop named by ``rollout.agent.default_agent_loop`` (``tool_agent``) is
   instantiated from verl's registry with ``hydra.utils.instantiate``;
4. each row goes through verl's ``collate_fn`` and ``DataProto``, and its non-tensor
   fields are passed to ``agent_loop.run`` as ``AgentLoopWorker`` passes them. The loop
   renders the prompt (the row's messages + chat template + tool schemas) and sends it
   to its LLM server: a stand-in here that records the ``prompt_ids`` and answers
   ``<|im_end|>``, so the loop ends after one turn. Those ids are what vLLM would get.

It also dumps every built-in environment's tool specs through verl's
``OpenAIFunctionToolSchema`` (what ``load_all_tools`` keeps of a schema).

Ray is not installed in the venv: ``agent_loop``'s modules use it only at import time
(decorators, annotations), so a stand-in serves those imports and raises on any use
after them. Nothing here starts Ray, vLLM or a model. Writes ``OUT.json``:
``{"verl_version", "agent_loop", "rows": {"train"|"val": [{"index", "task_id",
"prompt_ids", "server_prompt_ids"}]}, "parquet_rows", "dataset_rows",
"max_prompt_length", "rollout_prompt_length", "builtin_tool_schemas", ...}`` and prints
the same without ``rows`` on one marker line.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import json
import sys
import time
import types
from pathlib import Path

MARKER = "VERL_PROMPT_RESULT "
SPLITS = {"train": "data/train.parquet", "val": "data/val.parquet"}


# ------------------------------------------------------------------- Ray stand-in


class _RayState:
    armed = False  # after verl's imports: any use of Ray raises
    touched: set[str] = set()


def _ray_used(name: str):
    if _RayState.armed:
        raise RuntimeError(f"{name}: Ray was used on a path this check runs without Ray")
    _RayState.touched.add(name)


class _RayPlaceholder(type):
    """A class standing for any Ray name: usable as a decorator, base or annotation."""

    def __call__(cls, *args, **kwargs):
        _ray_used(cls.__qualname__ + "()")
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # @ray.remote on a class or function leaves it as it is
        return _placeholder(cls.__qualname__ + "()")

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        _ray_used(f"{cls.__qualname__}.{name}")
        return _placeholder(f"{cls.__qualname__}.{name}")


def _placeholder(qualname: str) -> type:
    return _RayPlaceholder(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})


class _RayModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        _ray_used(f"{self.__name__}.{name}")
        return _placeholder(f"{self.__name__}.{name}")


class _RayFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "ray" or fullname.startswith("ray."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _RayModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def install_ray_standin() -> None:
    for name in [n for n in sys.modules if n == "ray" or n.startswith("ray.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _RayFinder())


# ------------------------------------------------------------------------ verl side


def compose(bundle: Path, base_dir: Path, full: bool = False):
    """The config ``recipe/launch.template.sh`` hands to ``main_ppo`` (paths made absolute);
    ``full``: a full fine-tune's bundle, whose model is ``model/full`` and has no adapter."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    model = [f"actor_rollout_ref.model.path={bundle / 'model/full'}"] if full else [
        f"actor_rollout_ref.model.path={base_dir}",
        f"actor_rollout_ref.model.lora_adapter_path={bundle / 'model/adapter'}"]
    overrides = [
        *model,
        f"actor_rollout_ref.model.tokenizer_path={bundle / 'model/tokenizer'}",
        f"data.train_files={bundle / SPLITS['train']}",
        f"data.val_files={bundle / SPLITS['val']}",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bundle / 'recipe/tool_config.yaml'}",
        f"reward.custom_reward_function.path={bundle / 'reward/compute_score.py'}",
    ]
    with initialize_config_dir(config_dir=str(bundle / "recipe"), version_base=None):
        cfg = hydra_compose(config_name="verl-overrides", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


class RecordingServer:
    """Stands in for verl's LLM server client: records the prompt, answers end-of-turn."""

    def __init__(self, end_id: int):
        self.end_id = end_id
        self.prompts: list[list[int]] = []

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_multimodal):
        from verl.workers.rollout.replica import TokenOutput

        self.prompts.append(list(prompt_ids))
        return TokenOutput(token_ids=[self.end_id], stop_reason="completed")


async def render_rows(cfg, datasets: dict) -> dict:
    """Each row's prompt ids from verl's agent loop (see the module docstring, step 3-4)."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import (
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.protocol import DataProto
    from verl.tools.tool_registry import load_all_tools
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class
    from verl.utils.rollout_trace import RolloutTraceConfig

    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    rollout = cfg.actor_rollout_ref.rollout
    tools = load_all_tools(tool_config_path=rollout.multi_turn.tool_config_path,
                           function_tool_path=rollout.multi_turn.function_tool_path)
    trace = rollout.trace
    RolloutTraceConfig.init(trace.project_name, trace.experiment_name, trace.get("backend"),
                            trace.get("token2text", False),
                            trace.get("max_samples_per_step_per_worker", None))
    agent_name = rollout.agent.default_agent_loop
    tokenizer = model_config.tokenizer
    server = RecordingServer(tokenizer.eos_token_id)
    sampling_params = {"temperature": rollout.temperature, "top_p": rollout.top_p,
                       "top_k": rollout.top_k, "repetition_penalty": 1.0,
                       "logprobs": rollout.calculate_log_probs}
    # AgentLoopWorker instantiates a loop per trajectory; a loop keeps no per-trajectory
    # state (that lives in AgentData), so one instance renders every row (and saves
    # verl's ~15 ms of Hydra instantiation per row).
    loop = hydra.utils.instantiate(
        config=_agent_loop_registry[agent_name],
        trainer_config=DictConfigWrap(config=cfg),
        server_manager=server,
        tokenizer=tokenizer,
        processor=model_config.processor,
        dataset_cls=get_dataset_class(cfg.data),
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap(tools),
    )
    _RayState.armed = True
    out: dict = {}
    for split, dataset in datasets.items():
        rows = []
        for i in range(len(dataset)):
            # A batch of one, as the trainer's dataloader and DataProto make it; the
            # worker passes each non-tensor field of a sample to the agent loop.
            batch = DataProto.from_single_dict(collate_fn([dataset[i]]))
            kwargs = {k: v[0] for k, v in batch.non_tensor_batch.items()}
            result = await loop.run(dict(sampling_params), **kwargs)
            info = kwargs["extra_info"]
            rows.append({
                "index": int(info["index"]),
                "task_id": info["miniverl"]["task_id"],
                "prompt_ids": [int(t) for t in result.prompt_ids],
                "server_prompt_ids": server.prompts[-1],
            })
        out[split] = rows
    return {"agent_loop": agent_name, "rows": out,
            "tool_schemas": [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
                             for t in tools]}


def builtin_schema_dumps() -> list[dict]:
    """Whether verl's tool schema model gives back each built-in environment's tool spec
    unchanged, keys in order (the chat template prints it with ``tojson``): a field verl's
    ``OpenAIFunctionToolSchema`` lacks would vanish from verl's prompt."""
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from miniverl.student.environments import get_environment, list_environments

    out = []
    for name in list_environments():
        for spec in get_environment(name).tool_specs():
            dumped = OpenAIFunctionToolSchema.model_validate(spec).model_dump(
                exclude_unset=True, exclude_none=True)
            out.append({"environment": name, "tool": spec["function"]["name"],
                        "unchanged": json.dumps(dumped) == json.dumps(spec),
                        "verl": dumped})
    return out


def main(bundle: Path, base_dir: Path, out_path: Path) -> int:
    bundle, base_dir = bundle.resolve(), base_dir.resolve()
    started = time.perf_counter()
    sys.path.insert(0, str(bundle / "reward"))  # the tool class lives beside the reward
    install_ray_standin()
    import pyarrow.parquet as pq
    import verl

    # Imported before the stand-in is armed: these modules touch Ray at import time.
    import verl.experimental.agent_loop.tool_agent_loop  # noqa: F401
    from verl.utils import hf_processor, hf_tokenizer
    from verl.utils.dataset.rl_dataset import get_dataset_class

    timing = {"import_s": time.perf_counter() - started}
    cfg = compose(bundle, base_dir)
    # main_ppo builds the datasets with the model path's tokenizer and processor.
    tokenizer = hf_tokenizer(str(base_dir), trust_remote_code=False)
    processor = hf_processor(str(base_dir), trust_remote_code=False, use_fast=True)
    # main_ppo.create_rl_dataset, whose module cannot be imported here (it needs the
    # trainer's torchdata): the configured dataset class over each file list.
    dataset_cls = get_dataset_class(cfg.data)
    datasets = {
        split: dataset_cls(data_files=files, tokenizer=tokenizer, processor=processor,
                           config=cfg.data, max_samples=-1)
        for split, files in (("train", cfg.data.train_files), ("val", cfg.data.val_files))
    }
    timing["datasets_s"] = time.perf_counter() - started - timing["import_s"]
    result = asyncio.run(render_rows(cfg, datasets))
    timing["render_s"] = time.perf_counter() - started - timing["import_s"] - timing["datasets_s"]
    result.update({
        "verl_version": verl.__version__,
        "parquet_rows": {s: pq.read_metadata(bundle / p).num_rows for s, p in SPLITS.items()},
        "dataset_rows": {s: len(d) for s, d in datasets.items()},
        "max_prompt_length": int(cfg.data.max_prompt_length),
        "rollout_prompt_length": int(cfg.actor_rollout_ref.rollout.prompt_length),
        "ray_touched_at_import": sorted(_RayState.touched),
        "builtin_tool_schemas": builtin_schema_dumps(),
        "timing_s": {k: round(v, 2) for k, v in timing.items()},
    })
    out_path.write_text(json.dumps(result))
    # verl prints to stdout too; the summary is the last line, after a marker.
    print(MARKER + json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
