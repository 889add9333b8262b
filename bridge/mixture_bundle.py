"""What a bundle of a mixture, or of several teachers, holds beyond a one-environment bundle.

``export-verl`` of a run with ``environments:`` writes one bundle (``bundle.py``); this
module plans its parts:

- the environments: each one's rows tagged ``data_source: miniverl/<name>``, the tool
  union in ``tool_config.yaml`` (a tool name two environments define differently is
  refused), each row naming its own environment's tools in ``extra_info.tool_selection``
  (verl's tool agent shows a row those tools only, as miniverl showed them), and the
  provenance of each environment's split;
- the weights: verl draws ``train.parquet``'s rows uniformly (its ``RandomSampler``), so an
  environment's share of verl's episodes is its share of the rows; both shares are
  recorded and a difference is named (:func:`not_moved`);
- the teachers (:func:`teacher_entries`): one ``distillation.teacher_models`` entry per
  route, ``key`` the ``data_source`` of the route's environment (``teacher_key:
  data_source``), ``model_path`` a stand-in the launch script fills from
  ``TEACHER_<ROUTE>_MODEL_DIR``; a route scoring several environments becomes one entry
  per environment (verl matches one key per entry). Each entry's ``inference`` is verl's
  own ``teacher_model`` template (``distillation.yaml``, the same in 0.8.0 and 0.9.1) with
  its interpolations written as the values they resolve to, and ``num_replicas`` the
  route's GPUs (``--teacher-gpus``), so ``distillation.n_gpus_per_node * nnodes`` equals
  the teachers' sum as ``DistillationConfig`` checks;
- what does not move (:func:`not_moved`): one line each, printed by the export and
  listed in the bundle's README and ``provenance/source_run.json`` (``not_moved``: a fact
  of the run it came from, beside its recipe).

It plans; ``bundle.py`` writes files and ``doctor.py`` / ``import_bundle.py`` read them.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

from miniverl.bridge import artifacts, parquet, teacher_source
from miniverl.common.adapters import PINNED_HUB_ADAPTER
from miniverl.common.errors import ConfigError
from miniverl.common.hashing import prefixed, sha256_json
from miniverl.common.teacher_routes import SINGLE, Route

DATA_SOURCE_PREFIX = parquet.DATA_SOURCE_PREFIX
TEACHER_KEY = "data_source"
DEFAULT_TEACHER_GPUS = 1
# verl's DistillationConfig pops the entry of this name once several entries exist.
VERL_SINGLE_ENTRY = "teacher_model"
# verl's own teacher_model entry (verl/trainer/config/distillation/distillation.yaml, the
# same in 0.8.0 and 0.9.1), less what each entry sets: key, model_path, num_replicas, the
# tensor-parallel size and the values the template interpolates from the student's rollout
# (name, dtype, prompt and response length, temperature), which inference_block() writes.
TEACHER_TEMPLATE: dict[str, object] = {
    "gpu_memory_utilization": 0.5,
    "enforce_eager": True,
    "cudagraph_capture_sizes": None,
    "free_cache_engine": True,
    "data_parallel_size": 1,
    "expert_parallel_size": 1,
    "max_num_batched_tokens": 8192,
    "max_model_len": None,
    "max_num_seqs": 1024,
    "load_format": "auto",
    "engine_kwargs": {},
    "limit_images": None,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "disable_log_stats": True,
    "skip_tokenizer_init": True,
}
# actor_rollout_ref.rollout.dtype's default in both releases' ppo_trainer (the bundle does
# not set it); the template's `dtype: ${oc.select:actor_rollout_ref.rollout.dtype}`.
ROLLOUT_DTYPE = "bfloat16"


def data_source(environment: str) -> str:
    return DATA_SOURCE_PREFIX + environment


# ------------------------------------------------------------------------ environments


def tool_union(envs: list[parquet.EnvFacts]) -> list[dict]:
    """Every environment's tool specs, first definition order; the same tool name with two
    different schemas is refused (verl's tool_config holds one schema per name)."""
    seen: dict[str, tuple[str, dict]] = {}
    out = []
    for env in envs:
        for spec in env.tool_specs:
            name = spec.get("function", spec).get("name", "")
            if name in seen:
                if seen[name][1] != spec:
                    raise ConfigError(
                        f"environments {seen[name][0]} and {env.name} both define tool "
                        f"{name!r} with different schemas, and a verl tool_config.yaml holds "
                        "one schema per tool name; export a mixture whose tools agree")
                continue
            seen[name] = (env.name, spec)
            out.append(spec)
    return out


def split_provenance(env_cfg, env: parquet.EnvFacts, weight: float, tasks: dict) -> dict:
    """One environment's entry of the manifest: how its splits were made and what they hold."""
    return {
        "name": env.name,
        "data_source": data_source(env.name),
        "params": env.params,
        "difficulty": env_cfg.difficulty,
        "split_seed": env_cfg.split_seed,
        "weight": weight,
        "rows": {key: len(made) for key, made in tasks.items()},
        "tasks_sha256": {key: prefixed(sha256_json([t.to_dict() for t in made]))
                         for key, made in tasks.items()},
        "tools": env.tool_names,
    }


def weight_shares(environments: list[dict]) -> dict[str, dict[str, float]]:
    """Each environment's share of the episodes: miniverl's (its weight) and verl's (its
    rows of train.parquet, drawn uniformly)."""
    total_w = sum(e["weight"] for e in environments)
    total_rows = sum(e["rows"]["train"] for e in environments)
    return {e["name"]: {"miniverl": round(e["weight"] / total_w, 6),
                        "verl": round(e["rows"]["train"] / total_rows, 6)}
            for e in environments}


# ---------------------------------------------------------------------------- teachers


@dataclass(frozen=True)
class TeacherEntry:
    """One ``distillation.teacher_models`` entry: a route (for one of its environments)."""

    entry: str
    route: str
    environment: str
    gpus: int
    sentinel: str  # model_path stand-in, also the launch script's variable

    @property
    def key(self) -> str:
        return data_source(self.environment)


def _ident(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def route_folder(route: str) -> str:
    """The folder a route's teacher weights go in (its ``download``, the launch usage)."""
    return f"teacher-{_ident(route)}"


def route_sentinel(route: str) -> str:
    return f"TEACHER_{_ident(route).upper()}_MODEL_DIR"


def parse_teacher_gpus(values: list[str] | None, route_names: list[str]) -> dict[str, int]:
    """``--teacher-gpus`` values (``N`` for every route, ``ROUTE=N`` for one) -> GPUs per
    route (default :data:`DEFAULT_TEACHER_GPUS`)."""
    out = dict.fromkeys(route_names, DEFAULT_TEACHER_GPUS)
    for value in values or ():
        name, sep, count = value.rpartition("=")
        if not count.isdigit() or int(count) < 1:
            raise ConfigError(f"--teacher-gpus {value!r}: the GPU count must be a positive "
                              "integer; pass N (every teacher) or ROUTE=N")
        if sep and name not in out:
            raise ConfigError(f"--teacher-gpus {value!r}: {name!r} is not a teacher route of "
                              f"this run; pass one of {', '.join(route_names)}")
        for route in ([name] if sep else route_names):
            out[route] = int(count)
    return out


def teacher_entries(routed: dict[str, Route], gpus: dict[str, int]) -> list[TeacherEntry]:
    """One entry per route (per environment of a route that scores several)."""
    entries: list[TeacherEntry] = []
    used: set[str] = {VERL_SINGLE_ENTRY}
    for route in routed.values():
        for env in route.environments:
            base = _ident(route.name) if len(route.environments) == 1 \
                else f"{_ident(route.name)}__{_ident(env)}"
            name, n = base, 2
            while name in used:  # `teacher_model` would be popped by verl; never reuse one
                name, n = f"{base}_{n}", n + 1
            used.add(name)
            entries.append(TeacherEntry(name, route.name, env, gpus[route.name],
                                        route_sentinel(route.name)))
    return entries


def inference_block(max_prompt: int, max_response: int, temperature: float) -> dict:
    """An entry's ``inference``: verl's template, interpolations resolved, TP 1."""
    # A copy each: a dict shared by two entries would be written as a YAML alias.
    return {"_target_": "verl.workers.config.RolloutConfig", "name": "vllm",
            "dtype": ROLLOUT_DTYPE, **copy.deepcopy(TEACHER_TEMPLATE),
            "tensor_model_parallel_size": 1,
            "prompt_length": max_prompt, "response_length": max_response,
            "temperature": float(temperature)}


def teacher_overrides(entries: list[TeacherEntry], *, max_prompt: int, max_response: int,
                      temperature: float) -> dict[str, object]:
    """The dotted overrides of several teachers: pool, routing key and every entry."""
    flat: dict[str, object] = {
        "distillation.nnodes": 1,
        "distillation.n_gpus_per_node": sum(e.gpus for e in entries),
        "distillation.teacher_key": TEACHER_KEY,
    }
    for e in entries:
        prefix = f"distillation.teacher_models.{e.entry}"
        flat[f"{prefix}._target_"] = "verl.workers.config.DistillationTeacherModelConfig"
        flat[f"{prefix}.key"] = e.key
        flat[f"{prefix}.model_path"] = e.sentinel
        flat[f"{prefix}.num_replicas"] = e.gpus
        flat[f"{prefix}.inference"] = inference_block(max_prompt, max_response, temperature)
    return flat


def single_pool(gpus: int) -> dict[str, object]:
    """The pool of one teacher (``teacher_model``, tensor-parallel 1): verl gives it
    ``pool // 1`` replicas."""
    return {"distillation.nnodes": 1, "distillation.n_gpus_per_node": gpus}


def route_identity(run, recipe, route: Route) -> dict:
    """``model/base_model.json``'s entry for one route: the teacher it was (a prepared
    directory named as for one teacher), and for an adapter route the base, the adapter
    and that verl loads the merge of the two (its teacher entry has no adapter field)."""
    config = route.config
    dest = route_folder(route.name)
    if route.adapter is None:
        return teacher_source.teacher_identity(
            run, recipe.model_copy(update={"teacher": config, "teachers": None}),
            route=route.name, teacher=route.teacher, dest=dest)
    base = artifacts.base_identity(config.model, dest=f"{dest}-base")
    ref = config.adapters[route.adapter]
    # A pinned hub id (ORG/NAME@<40-hex>) names the adapter; a local directory is not
    # published, only its name.
    adapter = ({"name": route.adapter, "source": "hub", "hub_id": ref}
               if PINNED_HUB_ADAPTER.match(ref)
               else {"name": route.adapter, "source": "path", "directory_name": Path(ref).name})
    return {
        "source": "merged_adapter",
        "base": base,
        "adapter": adapter,
        "download": (f"merge adapter {route.adapter} into its base, then point "
                     f"{route_sentinel(route.name)} at the merged directory: "
                     "PeftModel.from_pretrained(base, ADAPTER).merge_and_unload()"
                     f".save_pretrained('{dest}')"),
    }


def _teacher_settings(where: str, config) -> list[str]:
    """One line for each setting of the teacher section ``where`` that verl has no field
    for (its teacher is a model verl starts and asks for log-probs, nothing else)."""
    return [f"{where}.{field} {value!r} does not move ({why})" for field, value, why in (
        ("endpoint", config.endpoint, "verl starts its own teacher from model_path"),
        ("scorer", None if config.scorer == "causal_lm" else config.scorer,
         "verl's teacher is the causal LM itself"),
        ("mode", None if config.mode == "standard" else config.mode,
         "verl's teacher scores the student's own tokens, never a privileged view"),
        ("min_success", config.min_success, "verl has no qualification gate"),
        ("min_recovery", config.min_recovery, "verl has no qualification gate"),
    ) if value is not None]


def not_moved(recipe, *, routed: dict[str, Route], entries: list[TeacherEntry],
              shares: dict[str, dict[str, float]] | None) -> list[str]:
    """Each thing the run trained with that the bundle cannot carry, one line each."""
    lines: list[str] = []
    mode = recipe.run.mode
    if mode != "opd":
        lines.append(
            f"run.mode {mode}: the bundle's verl config distils on the student's own "
            f"rollouts (distillation.enabled), and verl has no {mode}; import-verl gives "
            "the run's recipe back whole")
    if recipe.train.trajectories is not None:
        lines.append(
            "train.trajectories: the offline set is a local file the bundle does not hold; "
            "import-verl takes it back with --trajectories FILE")
    if shares:
        differ = {n: s for n, s in shares.items() if abs(s["miniverl"] - s["verl"]) > 1e-6}
        if differ:
            said = "; ".join(f"{n} {s['verl']:.0%} of verl's episodes, {s['miniverl']:.0%} "
                             "of miniverl's" for n, s in differ.items())
            lines.append(
                "environments' weights: verl draws train.parquet's rows uniformly, so each "
                f"environment's share is its share of the rows ({said}); change train_tasks "
                "to move the shares")
    for route in routed.values():
        if len(route.environments) > 1:
            names = [e.entry for e in entries if e.route == route.name]
            lines.append(
                f"route {route.name}: scores {', '.join(route.environments)}, and verl "
                "matches one data_source per teacher entry, so it becomes "
                f"{len(names)} entries ({', '.join(names)}), each its own teacher replica(s)")
        if route.adapter is not None:
            lines.append(
                f"route {route.name}: verl's teacher entry loads one model (no adapter field), "
                f"so its model_path is the base with adapter {route.adapter} merged "
                f"({route_sentinel(route.name)}; model/base_model.json names both)")
        where = "teacher" if route.teacher == SINGLE else f"teachers.{route.teacher}"
        lines += _teacher_settings(f"route {route.name}: {where}", route.config)
    if not routed and recipe.teacher is not None:
        lines += _teacher_settings("teacher", recipe.teacher)
    loss = recipe.loss
    if loss.objective == "bucketed_topk_tail":
        lines.append(
            "loss.objective bucketed_topk_tail: verl's distillation loss reads the teacher's "
            f"top-{loss.top_k} log-probs and has no tail bucket")
    else:
        lines.append(
            "loss.objective exact_full_vocab: verl's distillation loss reads the teacher's "
            f"top-{loss.top_k} log-probs, not the whole vocabulary")
    if loss.divergence == "reverse_kl" and loss.estimator == "full":
        lines.append(
            "loss.estimator full: verl's k3 estimates the reverse KL from the sampled token "
            "alone; the sum over the teacher's distribution does not move")
    if loss.positions != "all":
        lines.append(f"loss.positions {loss.positions}: verl distils every response token")
    if loss.temperature != 1.0:
        lines.append(f"loss.temperature {loss.temperature:g}: verl asks its teachers for "
                     "log-probs at temperature 1.0")
    return lines


def refuse_other_tokenizers(recipe, routed: dict[str, Route]) -> None:
    """A teacher of another tokenizer (the one teacher, or a route's) cannot score verl's
    student tokens."""
    if not routed and recipe.teacher is not None and recipe.teacher.tokenizer == "other":
        raise ConfigError(
            "teacher.tokenizer is other, and verl's teacher scores the student's token ids "
            "(no vocabulary map); export a run whose teacher shares the student's tokenizer")
    for route in routed.values():
        if route.config.tokenizer == "other":
            raise ConfigError(
                f"route {route.name} has tokenizer: other, and verl's teacher scores the "
                "student's token ids (no vocabulary map); export a run whose teachers share "
                "the student's tokenizer")
