"""Check a miniverl bundle with an official verl release's own code (0.8.0 or 0.9.1); run
with the python of that release's venv (``tests/bridge/setup_verl_venv.sh VERSION``).

    ~/.cache/miniverl/verl-VERSION-venv/bin/python tests/bridge/verl_check.py BUNDLE [BUNDLE ...]

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

A bundle of a mixture (``provenance/manifest.json`` lists ``environments``) is checked per
environment: the reward scores each environment's ground truth 1.0 and garbage 0.0, and
each tool of each environment runs once with that environment's row (its
``tool_selection``); and 5. ``routing``: ``DistillationConfig`` resolves the teacher keys,
every ``teacher_models`` entry's ``inference`` equals verl's own ``teacher_model``
template as it resolves, and every row of ``data/train.parquet``, batched by verl's
``collate_fn``, goes through verl's ``AgentLoopWorker._compute_teacher_logprobs`` to a
recording stand-in of each teacher's server: the teacher verl called must be the route
that scored the row's environment in the run (``provenance/source_run.json``'s recipe).

It does not start Ray, vLLM, FSDP or a training step: distributed execution is not
tested. verl is imported once (most of a check's time) and the bundles are checked one
after the other; each bundle's own modules (its ``reward/`` folder) are unloaded before the
next. Prints one JSON object per bundle, in order, with its ``bundle`` path; exits 1 if any
step of any bundle failed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from pathlib import Path

# The launch script's composition, shared with the prompt check (this folder is on
# sys.path: the script runs as `python tests/bridge/verl_check.py`).
from verl_prompt_check import _RayState, compose, install_ray_standin

MARKER = "VERL_CHECK_RESULT "


def main(bundles: list[Path]) -> int:
    install_ray_standin()
    import verl

    # Imported before the stand-in is armed: the agent loop touches Ray at import time.
    import verl.experimental.agent_loop.agent_loop  # noqa: F401

    _RayState.armed = True
    ok = True
    for bundle in (b.resolve() for b in bundles):
        try:
            results = _with_bundle_modules(bundle, check)
        except Exception as exc:  # outside the steps (say, no manifest): the next bundle runs
            results = {"bundle": str(bundle), "steps": {}, "ok": False,
                       "error": f"{type(exc).__name__}: {exc}",
                       "trace": traceback.format_exc(limit=4)}
        results["verl_version"] = verl.__version__
        ok = ok and results["ok"]
        # verl prints to stdout too; each result is one line, after a marker.
        print(MARKER + json.dumps(results, default=str), flush=True)
    return 0 if ok else 1


def _with_bundle_modules(bundle: Path, fn):
    """``fn(bundle)`` with ``reward/`` importable (the tool class ``miniverl_tool`` lives
    there); the modules imported from the bundle are unloaded afterwards, so the next
    bundle's own files are the ones that run."""
    reward = str(bundle / "reward")
    sys.path.insert(0, reward)
    try:
        return fn(bundle)
    finally:
        sys.path.remove(reward)
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(bundle) + "/"):
                del sys.modules[name]


def check(bundle: Path) -> dict:
    """The steps of the module docstring on one bundle: ``{"bundle", "steps", "ok"}``."""
    results: dict = {"bundle": str(bundle), "verl_version": None, "steps": {}}

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

    state: dict = {}
    manifest = json.loads((bundle / "provenance/manifest.json").read_text())
    mixture = "environments" in manifest

    @step("compose")
    def _compose():
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config

        full = manifest.get("kind") == "full"
        cfg = compose(bundle, Path("/nonexistent/base"), full=full)
        state["cfg"] = cfg
        unknown = _unknown_keys(bundle)
        try:
            validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg),
                            use_critic=need_critic(cfg))
            validated = "all checks"
        except (ModuleNotFoundError, ValueError) as exc:
            # validate_config's last check imports vLLM's rollout utilities (Ray and vLLM
            # at import) to compare lora_rank with vLLM's maximum; every check before it ran.
            # (Without vLLM that import fails: ModuleNotFoundError, or verl's ValueError
            # naming the vLLM version it found, None.)
            frames = traceback.extract_tb(exc.__traceback__)
            if not any(f.name == "validate_config" and "get_vllm_max_lora_rank" in (f.line or "")
                       for f in frames):
                raise
            validated = "all checks before vLLM's maximum LoRA rank (needs vLLM)"
        entry_point = "TaskRunnerV1" if cfg.trainer.get("use_v1", False) else "TaskRunner"
        model = cfg.actor_rollout_ref.model
        if full:  # a full fine-tune: verl's default loader, no LoRA
            assert model.lora_rank == 0 and model.lora_adapter_path is None, model
            assert cfg.actor_rollout_ref.rollout.load_format == "auto"
        else:
            adapter = json.loads((bundle / "model/adapter/adapter_config.json").read_text())
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
            if name == "distillation":
                state["distillation"] = obj
        distillation = state["distillation"]
        return {
            "teacher_keys": sorted(distillation.teacher_models),
            "teacher_pool": [distillation.nnodes, distillation.n_gpus_per_node],
            "teacher_world_sizes": {k: t.world_size
                                    for k, t in distillation.teacher_models.items()},
            "unknown_keys": unknown,
            "validate_config": validated,
            "use_critic": need_critic(cfg),
            "entry_point": entry_point,
            "dataclasses": dataclasses,
            "loss_mode": cfg.distillation.distillation_loss.loss_mode,
            "topk": cfg.distillation.distillation_loss.topk,
            "use_task_rewards": distillation.distillation_loss.use_task_rewards,
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
        state["dataset"] = ds
        state["first_rows"] = {}
        for i in range(len(ds)):
            source = ds.dataframe[i]["data_source"] if hasattr(ds, "dataframe") else None
            if source is not None and source not in state["first_rows"]:
                state["first_rows"][source] = ds[i]
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

    def _scores(fn, row):
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

    @step("reward")
    def _reward():
        from verl.trainer.ppo.reward import get_custom_reward_fn

        fn = get_custom_reward_fn(state["cfg"])
        scores = {}
        for source, row in state["first_rows"].items():
            scores[source] = _scores(fn, row)
        out = dict(scores[state["row"]["data_source"]])
        if mixture:
            out["by_data_source"] = scores
            # Every train row: its ground truth 1.0, garbage 0.0, counted per environment.
            counts: dict = {}
            for row in state["dataset"].dataframe:
                truth = row["reward_model"]["ground_truth"]
                tally = counts.setdefault(row["data_source"],
                                          {"rows": 0, "truth_1": 0, "garbage_0": 0})
                tally["rows"] += 1
                tally["truth_1"] += fn(row["data_source"], truth, truth, row["extra_info"]) == 1.0
                tally["garbage_0"] += fn(row["data_source"], "\x00<tool_call>{garbage", truth,
                                         row["extra_info"]) == 0.0
            assert all(t["rows"] == t["truth_1"] == t["garbage_0"] for t in counts.values()), \
                counts
            out["every_row"] = counts
        return out

    @step("tools")
    def _tools():
        from verl.tools.tool_registry import load_all_tools

        tools = {t.name: t for t in load_all_tools(str(bundle / "recipe/tool_config.yaml"), None)}

        async def call(name, row):
            tool = tools[name]
            kwargs = row["tools_kwargs"][name]
            instance_id, _ = await tool.create(create_kwargs=kwargs.get("create_kwargs", {}))
            response, reward, _ = await tool.execute(instance_id, _probe_args(tool))
            await tool.release(instance_id)
            return response.text

        if not mixture:
            name = sorted(tools)[0]
            text = asyncio.run(call(name, state["row"]))
            assert isinstance(text, str) and text, text
            return {"tools": sorted(tools), "called": name, "response": text[:80]}
        called = {}
        for source, row in state["first_rows"].items():
            # The tools verl's tool agent shows this row: its extra_info.tool_selection.
            selection = list(row["extra_info"]["tool_selection"])
            assert selection and set(selection) <= set(tools), (source, selection)
            called[source] = {}
            for name in selection:
                text = asyncio.run(call(name, row))
                assert isinstance(text, str) and text, (source, name, text)
                assert "could not start" not in text and "was not created" not in text, text
                called[source][name] = text[:60]
        return {"tools": sorted(tools), "called": called}

    if mixture:  # one environment's bundle has one teacher and no routing step

        @step("routing")
        def _routing():
            return _route_rows(bundle, state, manifest)

    results["ok"] = all(s["ok"] for s in results["steps"].values())
    return results


class _RecordingTeacher:
    """Stands in for one teacher's server client: records each call, answers log-probs."""

    def __init__(self, key: str):
        self.key = key
        self.calls = 0

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_):
        from types import SimpleNamespace

        self.calls += 1
        return SimpleNamespace(extra_fields={"prompt_ids": list(prompt_ids),
                                             "prompt_logprobs": [[0.0]] * len(prompt_ids)})


def _route_rows(bundle: Path, state: dict, manifest: dict) -> dict:
    """Every train row through verl's own teacher routing; see the module docstring."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.teacher_loop.teacher_manager import AsyncTeacherLLMServerManager
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    cfg, ds, distillation = state["cfg"], state["dataset"], state["distillation"]
    # Each entry is verl's own template as it resolves, but for what an entry sets.
    template = OmegaConf.to_container(cfg.distillation.teacher_models.teacher_model.inference,
                                      resolve=True)
    own = {"tensor_model_parallel_size"}
    for name, node in cfg.distillation.teacher_models.items():
        got = OmegaConf.to_container(node.inference, resolve=True)
        differ = sorted(k for k in set(template) | set(got)
                        if k not in own and template.get(k) != got.get(k))
        assert not differ, (name, {k: (template.get(k), got.get(k)) for k in differ})
    clients = {key: _RecordingTeacher(key) for key in distillation.teacher_models}
    worker = SimpleNamespace(
        distillation_enabled=True, teacher_key=cfg.distillation.teacher_key,
        teacher_server_manager=AsyncTeacherLLMServerManager(config=cfg, teacher_client=clients))
    # The route of each environment in the run, and of each teacher key in the bundle.
    source = json.loads((bundle / "provenance/source_run.json").read_text())["recipe"]
    routed = source.get("teachers") is not None or (source.get("teacher") or {}).get("adapters")
    expected = {}
    for member in source["environments"]:
        teacher = member.get("teacher") or "teacher"
        route = teacher if member.get("adapter") is None else f"{teacher}/{member['adapter']}"
        expected["miniverl/" + member["name"]] = route if routed else "teacher"
    variable_route = {r["model_dir_variable"]: name
                      for name, r in manifest["teachers"]["routes"].items()}
    route_of_key = {key: variable_route.get(t.model_path, "teacher")
                    for key, t in distillation.teacher_models.items()}
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in range(len(ds))]))
    counts: dict = {}
    wrong = []

    async def route_all():
        for i in range(len(batch)):
            # As AgentLoopWorker.generate_sequences hands each sample's fields on.
            kwargs = {k: v[i] for k, v in batch.non_tensor_batch.items() if k != "__do_sample__"}
            before = {k: c.calls for k, c in clients.items()}
            output = SimpleNamespace(multi_modal_data={}, mm_processor_kwargs=None,
                                     extra_fields={})
            await AgentLoopWorker._compute_teacher_logprobs(
                worker, output, prompt_ids=[1, 2], response_ids=[3], validate=False,
                sample_kwargs=kwargs)
            called = [k for k, c in clients.items() if c.calls != before[k]]
            assert len(called) == 1, called
            row_source = str(kwargs["data_source"])
            route = route_of_key[called[0]]
            counts.setdefault(route, {}).setdefault(row_source, 0)
            counts[route][row_source] += 1
            if route != expected[row_source]:
                wrong.append((i, row_source, route, expected[row_source]))

    asyncio.run(route_all())
    assert not wrong, wrong[:5]
    return {"rows": len(batch), "rows_by_route": counts, "expected_route": expected,
            "teacher_key": cfg.distillation.teacher_key}


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
                # A teacher entry of several (distillation.teacher_models.<entry>) has the
                # keys of verl's own single entry, teacher_model.
                parts = dotted.split(".")
                if parts[:2] == ["distillation", "teacher_models"] and len(parts) > 3:
                    dotted = ".".join(["distillation", "teacher_models", "teacher_model",
                                       *parts[3:]])
                try:
                    found = OmegaConf.select(own, dotted, default=absent, throw_on_missing=True)
                except MissingMandatoryValue:  # a key verl declares ??? (no default)
                    found = None
                if found is absent:
                    unknown.append(f"{prefix}{key}")

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
    sys.exit(main([Path(arg) for arg in sys.argv[1:]]))
