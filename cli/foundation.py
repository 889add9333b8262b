"""``miniverl doctor``, ``miniverl validate`` and ``miniverl schema``.

doctor says what this machine can run (extras, the installed training stack against
the tested version range, torch threads, CUDA devices and free memory, libzmq and
CURVE, a writable output directory); validate checks a recipe and
prints every error at once, or a short plan; schema prints a JSON Schema. These
commands work on the torch-free core install; torch is imported only by doctor, and
only when it is installed.
"""

from __future__ import annotations

# Imports inside command bodies are deliberate: `miniverl --help` stays fast and torch-free.
import importlib.util
import json
import os
import platform
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import typer
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

# extra -> (import name, distribution name) for each package it brings.
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "train": (
        ("torch", "torch"),
        ("transformers", "transformers"),
        ("peft", "peft"),
        ("accelerate", "accelerate"),
        ("tokenizers", "tokenizers"),
    ),
    "cuda": (("bitsandbytes", "bitsandbytes"),),
    "bridge": (("pyarrow", "pyarrow"),),
    "dev": (
        ("pytest", "pytest"),
        ("pytest_asyncio", "pytest-asyncio"),
        ("hypothesis", "hypothesis"),
        ("ruff", "ruff"),
    ),
}
INSTALL_HINTS = {
    "train": 'pip install torch==2.13.0 && pip install -e ".[train]"',
    "cuda": 'pip install -e ".[cuda]"  (needs an NVIDIA GPU)',
    "bridge": 'pip install -e ".[bridge]"',
    "dev": 'pip install -e ".[dev]"',
}
# name -> "module:function" returning a JSON Schema dict; other groups add theirs.
SCHEMAS: dict[str, str] = {"recipe": "miniverl.common.recipe:recipe_json_schema"}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# Packages whose range is tested (docs/compatibility.md, tests/compat/lowest.txt).
TESTED = ("torch", "transformers", "peft", "accelerate", "tokenizers", "bitsandbytes")


def compatibility_report() -> dict[str, dict[str, Any]]:
    """``{package: {range, installed, in_range}}`` for the training stack.

    The range is what this installation of miniverl declares (its package metadata, so
    pyproject.toml); ``in_range`` is None when the package is not installed.
    """
    report: dict[str, dict[str, Any]] = {}
    for text in metadata.requires("miniverl") or []:
        req = Requirement(text)
        name = req.name.lower()
        if name not in TESTED or name in report:
            continue
        installed = _version(name)
        try:
            # A local label (torch's +cpu) names a build of the same release.
            in_range = None if installed is None else req.specifier.contains(
                Version(installed).public, prereleases=True)
        except InvalidVersion:
            in_range = False
        report[name] = {"range": str(req.specifier), "installed": installed,
                        "in_range": in_range}
    return report


def _extras_report() -> dict[str, Any]:
    report: dict[str, Any] = {}
    for extra, packages in EXTRAS.items():
        found = {}
        missing = []
        for module, dist in packages:
            if importlib.util.find_spec(module) is None:
                missing.append(dist)
            else:
                found[dist] = _version(dist)
        report[extra] = {
            "installed": not missing,
            "packages": found,
            "missing": missing,
            "hint": INSTALL_HINTS[extra] if missing else None,
        }
    return report


def _torch_report() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {"installed": False}
    import torch

    out: dict[str, Any] = {
        "installed": True,
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cuda": torch.cuda.is_available(),
        "devices": [],
    }
    if out["cuda"]:
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            out["devices"].append(
                {
                    "index": i,
                    "name": torch.cuda.get_device_name(i),
                    "free_bytes": int(free),
                    "total_bytes": int(total),
                }
            )
    return out


def _zmq_report() -> dict[str, Any]:
    try:
        import zmq
    except ImportError:
        return {"installed": False}
    return {
        "installed": True,
        "pyzmq": zmq.pyzmq_version(),
        "libzmq": zmq.zmq_version(),
        "curve": bool(zmq.has("curve")),
    }


def _writable(output_dir: Path) -> dict[str, Any]:
    """Is ``output_dir`` writable? Checked without creating it when it does not exist."""
    path = output_dir.resolve()
    if path.is_dir():
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".miniverl-doctor-"):
                pass
            return {"path": str(output_dir), "writable": True}
        except OSError as exc:
            return {"path": str(output_dir), "writable": False, "reason": str(exc)}
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    ok = parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    reason = None if ok else f"{parent} is not writable"
    return {"path": str(output_dir), "writable": ok, "exists": False, "reason": reason}


def doctor_report(output_dir: Path) -> dict[str, Any]:
    """Everything ``miniverl doctor`` prints, as data."""
    return {
        "miniverl": _version("miniverl"),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "cpu_count": os.cpu_count(),
        "extras": _extras_report(),
        "compatibility": compatibility_report(),
        "torch": _torch_report(),
        "zmq": _zmq_report(),
        "output_dir": _writable(output_dir),
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _print_doctor(report: dict[str, Any]) -> None:
    echo = typer.echo
    echo(f"miniverl {report['miniverl']}  python {report['python']}  {report['os']}")
    echo(f"cpus: {report['cpu_count']}")
    for extra, info in report["extras"].items():
        if info["installed"]:
            versions = ", ".join(f"{k} {v}" for k, v in info["packages"].items())
            echo(f"extra {extra:<7} ok       {versions}")
        else:
            echo(f"extra {extra:<7} missing  {', '.join(info['missing'])}: {info['hint']}")
    echo("tested range (docs/compatibility.md):")
    for name, info in report["compatibility"].items():
        if info["installed"] is None:
            state = "not installed"
        elif info["in_range"]:
            state = f"{info['installed']} ok"
        else:
            state = (f"{info['installed']} OUTSIDE the tested range: "
                     f"pip install '{name}{info['range']}'")
        echo(f"  {name:<13} {info['range']:<10} {state}")
    torch = report["torch"]
    if torch["installed"]:
        echo(f"torch {torch['version']}: {torch['threads']} threads, cuda {torch['cuda']}")
        for dev in torch["devices"]:
            echo(
                f"  cuda:{dev['index']} {dev['name']}: {_gib(dev['free_bytes'])} free of "
                f"{_gib(dev['total_bytes'])}"
            )
    else:
        echo(f"torch not installed: {INSTALL_HINTS['train']}")
    zmq = report["zmq"]
    if zmq["installed"]:
        curve = "yes" if zmq["curve"] else "no (non-loopback TCP teachers are refused)"
        echo(f"libzmq {zmq['libzmq']} (pyzmq {zmq['pyzmq']}), CURVE: {curve}")
    else:
        echo("pyzmq not installed: pip install -e .")
    out = report["output_dir"]
    state = "writable" if out["writable"] else f"NOT writable ({out.get('reason')})"
    echo(f"output dir {out['path']}: {state}")


def _check_environment(recipe: Any) -> None:
    """Each environment's name and params must build an environment (torch-free)."""
    from miniverl.common.errors import ConfigError
    from miniverl.student.environments import get_environment, list_environments

    names = list_environments()
    sections = ([("environment", recipe.environment)] if recipe.environments is None else
                [(f"environments[{i}]", env) for i, env in enumerate(recipe.environments)])
    for where, env in sections:
        if env.name not in names:
            raise ConfigError(f"{where}.name: {env.name!r} is not a registered environment; "
                              f"one of {', '.join(names)}")
        try:
            get_environment(env.name, **env.params)
        except Exception as exc:  # plugins raise anything; report it as a config problem
            raise ConfigError(f"{where}.params: {env.name} rejected {env.params}: {exc}") from exc


def _check_engine(recipe: Any) -> str | None:
    """``rollout.engine: vllm`` needs vLLM importable here and serving the student's model
    (checked where the model is on disk already: a toy or a path; a gguf or hub model is
    checked when the engine starts). Returns the plan's note, or raises one line."""
    from miniverl.common.errors import ConfigError

    if recipe.rollout.engine != "vllm":
        return None
    try:
        from miniverl.student.rollout.vllm_engine import vllm_problem
    except ImportError as exc:  # torch is not installed: neither is vLLM's
        raise ConfigError(f"rollout.engine: vllm needs the student's install ({exc}); "
                          "pip install -e '.[train,vllm]'") from None
    model = recipe.student.model
    config = None
    if model.toy is not None or model.path is not None:
        from miniverl.common.modeling import resolve_model_dir

        config = json.loads((resolve_model_dir(model) / "config.json").read_text())
    device = "cuda" if recipe.student.device.startswith("cuda") else "cpu"
    if recipe.student.device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    problem = vllm_problem(config, device_type=device)
    if problem is not None:
        raise ConfigError(f"rollout.engine: vllm: {problem}")
    import vllm

    checked = "" if config is not None else " (its model is checked when the engine starts)"
    return f"vLLM {vllm.__version__} importable, serves the student{checked}"


def _check_toy_vocab(recipe: Any) -> str | None:
    """With the train extra installed, check the loss against the toy vocabulary."""
    from miniverl.common.recipe import check_vocab

    uses_toy = recipe.student.model.toy is not None or (
        recipe.teacher is not None and recipe.teacher.model.toy is not None
    )
    if not uses_toy or importlib.util.find_spec("transformers") is None:
        return None
    from miniverl.common.toy import build_toy_tokenizer

    vocab = len(build_toy_tokenizer())
    check_vocab(recipe, vocab)
    return f"toy vocabulary {vocab}"


def plan_lines(recipe: Any) -> list[str]:
    """A short human plan of what the recipe will do."""
    from miniverl.common.teacher_routes import route_of_environment

    mode = recipe.run.mode
    policy = {
        "opd": "strict on-policy: one update per fresh rollout batch of the current version",
        "replay": f"off-policy replay, labelled; rollouts up to {recipe.train.max_lag} versions old",
        "offline_kd": "off-policy: fixed trajectories, cached teacher targets",
        "sft": "supervised on oracle traces, no teacher",
        "dpo": "off-policy preference pairs; the teacher scores the reference",
        "rl": "on-policy RL on the task reward alone: group baseline, no teacher",
    }[mode]
    if mode == "sft" and recipe.train.fixed_set == "teacher":
        policy = "SeqKD: supervised on the teacher's own episodes, no teacher server"
    student = recipe.student
    tuning = f"LoRA r{student.lora.r}" if student.lora else "full fine-tune"
    lines = [
        f"mode         {mode} ({policy})",
        f"student      {student.model.describe()} on {student.device}, {student.dtype}, {tuning}",
    ]
    sections = recipe.teachers or ({"": recipe.teacher} if recipe.teacher else {})
    for name, t in sections.items():
        where = f"at {t.endpoint}" if t.endpoint else "launched by `miniverl up`"
        served = f", adapters {', '.join(t.adapters)}" if t.adapters else ""
        served += ", another tokenizer (xvocab targets)" if t.tokenizer == "other" else ""
        lines.append(f"teacher      {name + ': ' if name else ''}{t.model.describe()} {where}, "
                     f"memory {t.memory}, {t.mode}{served}")
    routed = route_of_environment(recipe)
    for env in recipe.environments or [recipe.environment]:
        weight = f", weight {env.weight:g}" if recipe.environments is not None else ""
        weight += f", teacher {routed[env.name]}" if env.name in routed else ""
        lines.append(
            f"environment  {env.name} ({env.difficulty}{weight}): {env.train_tasks} train / "
            f"{env.eval_tasks} eval / {env.test_tasks} test tasks"
        )
    if recipe.rollout.engine == "vllm":
        lines.append("sampling     vLLM in the student process, the trainer's weights synced "
                     "into it before every rollout batch (docs/rollouts.md)")
    train = recipe.train
    lines.append(
        f"cycles       {train.cycles} x {train.rollouts_per_cycle} rollouts (batch "
        f"{recipe.rollout.batch_size}), {train.updates_per_batch} update(s) per batch, lr {train.lr}"
    )
    if train.sft_warmup_steps:
        until = (
            f", ending early once the mean of 10 losses <= {train.sft_warmup_until_loss:g}"
            if train.sft_warmup_until_loss is not None
            else ""
        )
        warm_lr = train.sft_warmup_lr if train.sft_warmup_lr is not None else train.lr
        lines.append(
            f"warm-up      up to {train.sft_warmup_steps} SFT steps on oracle traces at lr "
            f"{warm_lr:g}{until}"
        )
    _list_line(lines, "batches", _batch_variants(recipe), "docs/training.md")
    ev = recipe.eval
    if ev.samples is not None:
        temperature = 1.0 if ev.temperature is None else ev.temperature
        lines.append(f"eval         {'greedy' if ev.greedy else 'sampled'}, and {ev.samples} "
                     f"samples per task at T={temperature:g} (docs/rollouts.md)")
    loss = recipe.loss
    if mode in ("sft", "dpo", "rl"):
        what = {"sft": "cross-entropy", "dpo": "DPO",
                "rl": f"REINFORCE on the verifier's score, {loss.reward_baseline or 'group'} "
                      f"baseline, positions {loss.positions}"}[mode]
        lines.append(f"objective    {what}")
    else:
        shape = (
            f"top-{loss.top_k} + tail"
            if loss.objective == "bucketed_topk_tail"
            else f"exact, vocab <= {loss.exact_max_vocab}"
        )
        lines.append(
            f"objective    {loss.divergence} over {loss.objective} ({shape}), positions "
            f"{loss.positions}"
        )
        _list_line(lines, "variants", _loss_variants(loss), "docs/losses.md")
        if any(t.tokenizer == "other" for t in sections.values()):
            lines.append(f"across       {loss.cross_vocab or 'sampled_token'} over byte groups "
                         "for a teacher with another tokenizer (docs/cross-tokenizer.md)")
    return lines


def _list_line(lines: list[str], label: str, items: list[str], page: str) -> None:
    """A plan line naming what a recipe turns on, with the page that explains it."""
    if items:
        lines.append(f"{label:<12} {'; '.join(items)} ({page})")


def _batch_variants(recipe) -> list[str]:
    """The batch-side variants a recipe sets: SeqKD, GKD mixing, groups."""
    from miniverl.common.recipe import on_policy_episodes

    train, out = recipe.train, []
    if train.fixed_set == "teacher":
        what = "SeqKD on" if recipe.run.mode == "sft" else "fixed set:"
        out.append(f"{what} the teacher's own episodes of the {recipe.environment.train_tasks} "
                   "training tasks, played once with its weights in this process")
    if train.on_policy_fraction is not None:
        n = train.rollouts_per_cycle
        fresh = on_policy_episodes(n, train.on_policy_fraction)
        out.append(f"GKD mixing: {fresh} fresh of {n} per batch, {n - fresh} from the fixed set")
    if recipe.rollout.group_size is not None:
        size = recipe.rollout.group_size
        out.append(f"{train.rollouts_per_cycle // size} tasks x {size} episodes per batch")
    return out


def _loss_variants(loss) -> list[str]:
    """The sampled-token estimator and the standard variants the loss section sets."""
    out = ["sampled-token estimator"] if loss.estimator == "sampled_token" else []
    if loss.importance_ratio_cap is not None:
        out.append(f"importance ratio capped at {loss.importance_ratio_cap:g}")
    if loss.log_ratio_clamp is not None:
        out.append(f"log-ratio clamped to +-{loss.log_ratio_clamp:g}")
    if loss.use_task_rewards:
        coef = 1.0 if loss.distillation_loss_coef is None else loss.distillation_loss_coef
        out.append(f"task reward ({loss.reward_baseline or 'group'} baseline) beside "
                   f"{coef:g} x distillation")
    if loss.aggregation == "sequence":
        out.append("per-sequence aggregation")
    return out


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""

    @app.command()
    def doctor(
        json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        output_dir: Path = typer.Option(
            Path("runs"), "--output-dir", help="Where runs would be written."
        ),
    ) -> None:
        """Say what this machine can run: extras, torch, CUDA, libzmq, output dir."""
        report = doctor_report(output_dir)
        if json_out:
            typer.echo(json.dumps(report, indent=2))
        else:
            _print_doctor(report)
        if not report["output_dir"]["writable"] or not report["zmq"]["installed"]:
            raise typer.Exit(1)

    @app.command()
    def validate(
        recipe_path: Path = typer.Argument(..., metavar="RECIPE", help="Recipe YAML file."),
        device_memory: str | None = typer.Option(
            None, "--device-memory", metavar="SIZE",
            help="Also plan the run's memory on one device of SIZE (24GiB, 80GB) and refuse "
            "a recipe that does not fit, naming the setting that would (docs/gpu.md)."),
    ) -> None:
        """Check a recipe; print every error with its location, or a short plan."""
        from miniverl.common.errors import ConfigError
        from miniverl.common.recipe import load_recipe, recipe_digest
        from miniverl.common.recipe_paths import path_problems

        try:
            recipe = load_recipe(recipe_path)
            problems = []
            try:
                _check_environment(recipe)
            except ConfigError as exc:
                problems.append(str(exc))
            engine_note = None
            try:
                engine_note = _check_engine(recipe)
            except ConfigError as exc:
                problems.append(str(exc))
            # What `up` would refuse about the recipe's own paths, before anything exists.
            problems += [f"{recipe_path}: {line}"
                         for line in path_problems(recipe, recipe_path.resolve().parent)]
            if problems:
                raise ConfigError("\n".join(problems))
            vocab_note = _check_toy_vocab(recipe)
        except ConfigError as exc:
            # One line per problem, each marked, so none hides behind another; a count
            # after several (one problem is its one line).
            problems = str(exc).splitlines()
            for line in problems:
                typer.echo(f"error: {line}", err=True)
            if len(problems) > 1:
                typer.echo(f"{recipe_path}: {len(problems)} problem(s); fix them and re-run",
                           err=True)
            raise typer.Exit(1) from None
        typer.echo(f"{recipe_path}: valid ({recipe_digest(recipe)[:19]})")
        for line in plan_lines(recipe):
            typer.echo(f"  {line}")
        if vocab_note:
            typer.echo(f"  checked      {vocab_note}")
        if device_memory is not None:
            from miniverl.common.memory_plan import check_recipe, parse_bytes

            try:
                lines, _, refused = check_recipe(recipe, parse_bytes(device_memory))
            except ConfigError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from None
            for line in lines:
                typer.echo(f"  {line}")
            if refused is not None:
                typer.echo(f"error: {recipe_path}: {refused}", err=True)
                raise typer.Exit(1)
        if engine_note:
            typer.echo(f"  checked      {engine_note}")

    @app.command()
    def schema(
        name: str = typer.Argument("recipe", help=f"One of: {', '.join(SCHEMAS)}."),
    ) -> None:
        """Print a JSON Schema (default: the recipe's)."""
        import importlib

        from miniverl.common.errors import ConfigError

        if name not in SCHEMAS:
            raise ConfigError(f"unknown schema {name!r}; available: {', '.join(SCHEMAS)}")
        module, func = SCHEMAS[name].split(":")
        typer.echo(json.dumps(getattr(importlib.import_module(module), func)(), indent=2))
