"""``miniverl bridge doctor BUNDLE``: recheck a verl bundle before it leaves the machine.

Checks, each reported as ``pass``, ``fail`` or ``skip`` with a one-line detail:

- ``hashes``: every file against ``SHA256SUMS`` (changed, missing, unlisted);
- ``layout``: the files the profile requires are present;
- ``required_verl``: ``REQUIRED_VERL.txt`` names the verl release the manifest names (0.8.0
  with its commit, or 0.9.1 with its wheel's sha256) and the profile;
- ``overrides``: fixed profile values, run-derived keys present, LoRA keys equal to the
  adapter's own config, bundle-relative paths that exist, no interpolation;
- ``parquet``: both splits have the exact schema the converter writes and every row's
  hashes still match (so nothing was truncated or edited);
- ``tool_config``: one Hermes schema per tool key the rows carry;
- ``reward``: ``reward/compute_score.py`` imports and scores every val ground truth as a
  success, and a garbage response as 0.0;
- ``adapter``: PEFT config + safetensors header (torch-free); with peft and
  transformers installed and the base available (a toy base is rebuilt locally), the
  adapter is loaded onto the base — otherwise ``skip`` says why;
- ``tokenizer``: fingerprint equals the manifest's; loads with transformers if present;
- ``privacy``: no secrets and no local paths in any text file or Parquet string.

``launchable`` is false while base or teacher weights are absent (``BASE_MODEL_DIR`` /
``TEACHER_MODEL_DIR``, as the launch script reads them) and ``distributed_execution``
is always ``"not tested"``. The result's JSON schema is in docs/verl-bridge.md.

Marked heavy step: the adapter load imports torch, transformers and peft inside
``_check_adapter``; nothing else here needs them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import yaml

from miniverl.bridge import parquet, profile
from miniverl.common.hashing import verify_sums
from miniverl.common.redact import redact_text
from miniverl.common.tokenizer_id import tokenizer_fingerprint
from miniverl.common.toy import toy_model_dir

DOCTOR_SCHEMA_VERSION = 1
STATUSES = ("pass", "fail", "skip")
_TEXT_SUFFIXES = (".json", ".yaml", ".yml", ".sh", ".txt", ".jinja", ".md")


class _Checks:
    def __init__(self) -> None:
        self.items: list[dict] = []

    def add(self, name: str, status: str, detail: str) -> None:
        self.items.append({"name": name, "status": status, "detail": detail})

    def run(self, name: str, fn, *args) -> None:
        """Run one check; an unexpected exception is that check's failure, not a crash."""
        try:
            status, detail = fn(*args)
        except Exception as exc:
            status, detail = "fail", f"{type(exc).__name__}: {exc}"
        self.add(name, status, detail)


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------ checks


def _check_hashes(bundle: Path):
    problems = verify_sums(bundle)
    if problems:
        return "fail", f"{len(problems)} problem(s): " + "; ".join(problems[:5])
    n = len((bundle / "SHA256SUMS").read_text(encoding="utf-8").splitlines())
    return "pass", f"{n} files match SHA256SUMS"


def _check_layout(bundle: Path):
    files = profile.BUNDLE_FILES
    required = [
        files[k]
        for k in (
            "train",
            "val",
            "overrides",
            "tool_config",
            "launch",
            "required_verl",
            "reward",
            "tool_impl",
            "base_model",
            "manifest",
            "source_run",
            "sums",
        )
    ]
    required += [f"{files['tokenizer_dir']}/tokenizer.json"]
    manifest = json.loads((bundle / files["manifest"]).read_text(encoding="utf-8"))
    if manifest.get("kind") == "lora":
        required += [
            f"{files['adapter_dir']}/adapter_config.json",
            f"{files['adapter_dir']}/adapter_model.safetensors",
        ]
    else:
        required += ["model/full/config.json"]
    missing = [r for r in required if not (bundle / r).is_file()]
    if missing:
        return "fail", "missing: " + ", ".join(missing)
    return "pass", f"{len(required)} required files present"


def _target(bundle: Path) -> profile.VerlTarget:
    """The verl release the bundle's manifest names (a ConfigError fails the check)."""
    manifest = json.loads((bundle / profile.BUNDLE_FILES["manifest"]).read_text(encoding="utf-8"))
    return profile.target_of_manifest(manifest)


def _check_required_verl(bundle: Path):
    text = (bundle / profile.BUNDLE_FILES["required_verl"]).read_text(encoding="utf-8")
    target = _target(bundle)
    expected = profile.required_verl_text(target)
    if text != expected:
        return "fail", f"expected {expected.strip().replace(chr(10), '; ')}"
    return "pass", text.strip().replace("\n", "; ")


def _check_overrides(bundle: Path):
    doc = yaml.safe_load((bundle / profile.BUNDLE_FILES["overrides"]).read_text(encoding="utf-8"))
    problems = []
    if doc.pop("defaults", None) != ["ppo_trainer", "_self_"]:
        problems.append("defaults must be [ppo_trainer, _self_]")
    if doc.pop("hydra", None) != {"searchpath": ["pkg://verl.trainer.config"]}:
        problems.append("hydra.searchpath must be [pkg://verl.trainer.config]")
    flat = profile.flatten(doc)
    manifest = json.loads((bundle / profile.BUNDLE_FILES["manifest"]).read_text(encoding="utf-8"))
    lora = manifest.get("kind") == "lora"
    fixed = profile.fixed_values(profile.target_of_manifest(manifest))
    for key, expected in fixed.items():
        if key == "actor_rollout_ref.rollout.load_format" and not lora:
            continue
        if flat.get(key) != expected:
            problems.append(f"{key} is {flat.get(key)!r}, profile needs {expected!r}")
    routes = ((manifest.get("teachers") or {}).get("routes") or {})
    single_path = "distillation.teacher_models.teacher_model.model_path"
    for key in profile.PROFILE_FROM_RUN:
        if key not in flat and not (routes and key == single_path):
            problems.append(f"{key} missing")
    # Several teachers: every route's entries, each keyed by its environment's data_source
    # and loading the route's model variable.
    for name, route in routes.items():
        for entry, key in (route.get("entries") or {}).items():
            prefix = f"distillation.teacher_models.{entry}"
            if flat.get(f"{prefix}.key") != key or flat.get(
                    f"{prefix}.model_path") != route.get("model_dir_variable"):
                problems.append(f"{prefix} must have key {key!r} and model_path "
                                f"{route.get('model_dir_variable')!r} (route {name})")
    for key, value in flat.items():
        if isinstance(value, str) and "${" in value:
            problems.append(f"{key} uses interpolation")
    if flat.get("distillation.distillation_loss.loss_mode") not in ("forward_kl_topk", "k3"):
        problems.append("distillation_loss.loss_mode must be forward_kl_topk or k3")
    loggers = flat.get("trainer.logger")
    known = set(profile.VERL_LOGGERS.values())
    if not isinstance(loggers, list) or "console" not in loggers or set(loggers) - known:
        problems.append(f"trainer.logger is {loggers!r}; it must list console and only "
                        f"{', '.join(sorted(known))}")
    if lora:
        adapter = json.loads(
            (bundle / profile.BUNDLE_FILES["adapter_dir"] / "adapter_config.json").read_text()
        )
        targets = adapter.get("target_modules")
        targets = sorted(targets) if isinstance(targets, list) else targets
        over_targets = flat.get("actor_rollout_ref.model.target_modules")
        over_targets = sorted(over_targets) if isinstance(over_targets, list) else over_targets
        # verl ignores lora_adapter_path unless lora_rank matches a real adapter.
        if flat.get("actor_rollout_ref.model.lora_rank") != adapter.get("r"):
            problems.append(
                f"lora_rank {flat.get('actor_rollout_ref.model.lora_rank')} != adapter r {adapter.get('r')}"
            )
        if flat.get("actor_rollout_ref.model.lora_alpha") != adapter.get("lora_alpha"):
            problems.append("lora_alpha differs from the adapter's lora_alpha")
        if over_targets != targets:
            problems.append(f"target_modules {over_targets} != adapter's {targets}")
    for key in (
        "data.train_files",
        "data.val_files",
        "reward.custom_reward_function.path",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    ) + (("actor_rollout_ref.model.lora_adapter_path",) if lora else ()):
        rel = flat.get(key)
        if not isinstance(rel, str) or rel.startswith("/") or not (bundle / rel).exists():
            problems.append(f"{key} must be a bundle-relative path that exists (got {rel!r})")
    if problems:
        return "fail", "; ".join(problems)
    return (
        "pass",
        f"{len(fixed)} profile values and {len(profile.PROFILE_FROM_RUN)} run keys",
    )


def _parquet_rows(bundle: Path, key: str):
    import pyarrow.parquet as pq

    return pq.read_table(bundle / profile.BUNDLE_FILES[key])


def _tools_of(table) -> list[str]:
    extra = table.schema.field("extra_info").type
    names = [extra.field(i).name for i in range(extra.num_fields)]
    if "tools_kwargs" not in names:
        return []
    tools = extra.field(names.index("tools_kwargs")).type
    return [tools.field(i).name for i in range(tools.num_fields)]


def _check_parquet(bundle: Path):
    details = []
    for key in ("train", "val"):
        table = _parquet_rows(bundle, key)
        # A mixture's rows also name their own tools (extra_info.tool_selection).
        selection = "tool_selection" in [f.name for f in table.schema.field("extra_info").type]
        expected = parquet.verl_schema(_tools_of(table), selection)
        if not table.schema.remove_metadata().equals(expected):
            return "fail", f"{key}: schema differs from the converter's explicit schema"
        if table.num_rows == 0:
            return "fail", f"{key}: no rows"
        for i, row in enumerate(table.to_pylist()):
            parquet.row_to_task(row, f"{key} row {i}")
        details.append(f"{key} {table.num_rows} rows")
    return "pass", ", ".join(details) + "; schema exact, every row's hashes match"


def _check_tool_config(bundle: Path):
    config = yaml.safe_load(
        (bundle / profile.BUNDLE_FILES["tool_config"]).read_text(encoding="utf-8")
    )
    names = []
    for entry in config.get("tools", []):
        fn = (entry.get("tool_schema") or {}).get("function") or {}
        params = fn.get("parameters") or {}
        if (
            entry.get("class_name") != "miniverl_tool.MiniverlTool"
            or not fn.get("name")
            or "description" not in fn
        ):
            return "fail", f"malformed tool entry {fn.get('name')!r}"
        if any("type" not in p for p in (params.get("properties") or {}).values()):
            return "fail", f"tool {fn['name']!r}: every parameter needs a type (verl's schema)"
        names.append(fn["name"])
    row_tools = _tools_of(_parquet_rows(bundle, "train"))
    if sorted(names) != sorted(row_tools):
        return "fail", f"tool_config has {sorted(names)}, rows carry {sorted(row_tools)}"
    return "pass", f"{len(names)} Hermes tool schemas: {', '.join(names)}"


def _check_reward(bundle: Path):
    module = _load_module(bundle / profile.BUNDLE_FILES["reward"], "miniverl_bundle_reward")
    fn = getattr(module, profile.REWARD_FN_NAME)
    rows = _parquet_rows(bundle, "val").to_pylist()
    failures = []
    for i, row in enumerate(rows):
        truth = row["reward_model"]["ground_truth"]
        success, score, reason = module.score_details(
            row["data_source"], truth, truth, row["extra_info"]
        )
        if not success or fn(row["data_source"], truth, truth, row["extra_info"]) != 1.0:
            failures.append(f"row {i}: {reason}")
    garbage = fn(
        rows[0]["data_source"],
        "\x00<tool_call>{",
        rows[0]["reward_model"]["ground_truth"],
        rows[0]["extra_info"],
    )
    if failures:
        return "fail", f"{len(failures)}/{len(rows)} ground truths not successes: " + "; ".join(
            failures[:3]
        )
    if garbage != 0.0:
        return "fail", f"garbage response scored {garbage}, expected 0.0"
    return "pass", f"{len(rows)}/{len(rows)} val ground truths score 1.0; garbage scores 0.0"


def _check_adapter(bundle: Path):
    manifest = json.loads((bundle / profile.BUNDLE_FILES["manifest"]).read_text(encoding="utf-8"))
    if manifest.get("kind") != "lora":
        return "skip", "full fine-tune bundle: no adapter"
    adir = bundle / profile.BUNDLE_FILES["adapter_dir"]
    config = json.loads((adir / "adapter_config.json").read_text(encoding="utf-8"))
    from safetensors import safe_open

    with safe_open(str(adir / "adapter_model.safetensors"), framework="numpy") as fh:
        keys = list(fh.keys())
    if not keys or not all("lora_" in k for k in keys):
        return "fail", "adapter_model.safetensors holds non-LoRA tensors or none"
    header = f"peft_type {config.get('peft_type')}, r={config.get('r')}, {len(keys)} tensors"
    missing = [m for m in ("torch", "transformers", "peft") if importlib.util.find_spec(m) is None]
    if missing:
        return (
            "skip",
            f"{header}; load skipped: {', '.join(missing)} not installed (pip install -e '.[train]')",
        )
    base = json.loads((bundle / profile.BUNDLE_FILES["base_model"]).read_text(encoding="utf-8"))
    # Heavy step: torch, transformers and peft are imported here only.
    if base.get("source") == "toy":
        base_dir = toy_model_dir(base["toy"])
    elif (
        os.environ.get("BASE_MODEL_DIR")
        and (Path(os.environ["BASE_MODEL_DIR"]) / "config.json").is_file()
    ):
        base_dir = Path(os.environ["BASE_MODEL_DIR"])
    else:
        return (
            "skip",
            f"{header}; load skipped: base weights absent (set BASE_MODEL_DIR; {base.get('download')})",
        )
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(base_dir)), str(adir)
    )
    n_lora = sum(1 for name, _ in model.named_parameters() if "lora_" in name)
    if n_lora != len(keys):
        return "fail", f"{header}; loaded {n_lora} LoRA parameters, file has {len(keys)}"
    return "pass", f"{header}; loaded onto the base with PeftModel.from_pretrained"


def _check_tokenizer(bundle: Path):
    tdir = bundle / profile.BUNDLE_FILES["tokenizer_dir"]
    manifest = json.loads((bundle / profile.BUNDLE_FILES["manifest"]).read_text(encoding="utf-8"))
    fp = tokenizer_fingerprint(tdir)
    if fp != manifest.get("tokenizer_fp"):
        return "fail", f"tokenizer fingerprint {fp} != manifest {manifest.get('tokenizer_fp')}"
    if importlib.util.find_spec("transformers") is None:
        return "pass", f"fingerprint {fp[:19]} matches; load skipped: transformers not installed"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tdir), local_files_only=True)
    if not getattr(tok, "chat_template", None):
        return "fail", "tokenizer has no chat template"
    return "pass", f"fingerprint {fp[:19]} matches; loads with a chat template ({len(tok)} tokens)"


def _check_privacy(bundle: Path):
    found = []
    for path in sorted(p for p in bundle.rglob("*") if p.is_file()):
        rel = path.relative_to(bundle).as_posix()
        if path.suffix in _TEXT_SUFFIXES or path.suffix == ".py" or path.name == "SHA256SUMS":
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.startswith("#!"):  # an interpreter line names a system path, not a user's
                text = text.partition("\n")[2]
            if redact_text(text) != text:
                found.append(rel)
        elif path.suffix == ".parquet":
            import pyarrow.parquet as pq

            text = json.dumps(pq.read_table(path).to_pylist(), ensure_ascii=False)
            if redact_text(text) != text:
                found.append(rel)
    if found:
        return "fail", "secrets or local paths in: " + ", ".join(found)
    return "pass", "no secrets or local paths found"


# ------------------------------------------------------------------------------ driver


def _weights_present(var: str) -> bool:
    value = os.environ.get(var)
    return bool(value) and (Path(value) / "config.json").is_file()


def _manifest_kind(manifest_path: Path) -> str:
    """The bundle's ``kind`` (lora | full); ``lora`` when the manifest is absent or unreadable
    (the hashes and layout checks already fail for it)."""
    try:
        kind = json.loads(manifest_path.read_bytes()).get("kind")
    except (OSError, ValueError, AttributeError):
        return "lora"
    return kind if kind in ("lora", "full") else "lora"


def _teacher_variables(manifest_path: Path) -> list[str]:
    """The launch script's teacher weight variables: one per route of several teachers,
    else ``TEACHER_MODEL_DIR``."""
    try:
        routes = (json.loads(manifest_path.read_bytes()).get("teachers") or {}).get("routes")
    except (OSError, ValueError, AttributeError):
        routes = None
    if isinstance(routes, dict) and routes:
        return [str(r.get("model_dir_variable")) for r in routes.values()]
    return ["TEACHER_MODEL_DIR"]


def doctor(bundle: Path) -> dict:
    """All checks on ``bundle``; the dict documented as the doctor JSON schema."""
    bundle = Path(bundle)
    checks = _Checks()
    if not (bundle / profile.BUNDLE_FILES["manifest"]).is_file():
        checks.add(
            "layout",
            "fail",
            f"{bundle.name} is not a miniverl verl bundle (no provenance/manifest.json)",
        )
    else:
        for name, fn in (
            ("hashes", _check_hashes),
            ("layout", _check_layout),
            ("required_verl", _check_required_verl),
            ("overrides", _check_overrides),
            ("parquet", _check_parquet),
            ("tool_config", _check_tool_config),
            ("reward", _check_reward),
            ("adapter", _check_adapter),
            ("tokenizer", _check_tokenizer),
            ("privacy", _check_privacy),
        ):
            checks.run(name, fn, bundle)
    blockers = []
    manifest_path = bundle / profile.BUNDLE_FILES["manifest"]
    kind = _manifest_kind(manifest_path)
    if kind == "lora" and not _weights_present("BASE_MODEL_DIR"):
        blockers.append("base model weights absent (BASE_MODEL_DIR)")
    for var in _teacher_variables(manifest_path):
        if not _weights_present(var):
            blockers.append(f"teacher model weights absent ({var})")
    ok = all(c["status"] != "fail" for c in checks.items)
    return {
        "schema_version": DOCTOR_SCHEMA_VERSION,
        "bundle": bundle.name,
        "profile": profile.PROFILE,
        "verl": _verl_identity(bundle),
        "ok": ok,
        "launchable": ok and not blockers,
        "launch_blockers": blockers if ok else ["failed checks", *blockers],
        "distributed_execution": "not tested",
        "checks": checks.items,
    }


def _verl_identity(bundle: Path) -> dict:
    """The release the bundle names, or the default's when its manifest names none we know
    (the ``required_verl`` check has failed then)."""
    try:
        return dict(_target(bundle).identity)
    except (OSError, ValueError):
        return dict(profile.verl_target(None).identity)


def format_report(result: dict) -> str:
    """Human-readable lines for the terminal."""
    lines = [
        f"bundle {result['bundle']} (profile {result['profile']}, verl {result['verl']['version']})"
    ]
    width = max(len(c["name"]) for c in result["checks"])
    for c in result["checks"]:
        detail = re.sub(r"\s+", " ", c["detail"])
        lines.append(f"  {c['status']:<4}  {c['name']:<{width}}  {detail}")
    lines.append(
        f"launchable: {str(result['launchable']).lower()}"
        + (f" ({'; '.join(result['launch_blockers'])})" if result["launch_blockers"] else "")
    )
    lines.append(f"distributed execution: {result['distributed_execution']}")
    lines.append("ok" if result["ok"] else "FAILED")
    return "\n".join(lines)
