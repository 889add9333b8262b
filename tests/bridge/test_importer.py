"""Level 2 importer: every whitelisted field maps with a label, everything else is refused."""

from __future__ import annotations

import json

import pytest
import yaml

from miniverl.bridge.import_fields import WHITELIST
from miniverl.bridge.importer import import_config, import_verl
from miniverl.common.errors import ConfigError

REV = "c1899de289a04d12100db370d81485cdf75e47ca"
TREV = "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e"
BASE = {
    "actor_rollout_ref.model.path": "Qwen/Qwen3-0.6B",
    "distillation.teacher_models.teacher_model.model_path": "Qwen/Qwen3-1.7B",
}

# One accepted value per whitelisted field, with the label and recipe target it must get.
CASES = {
    "data.train_files": ("~/d/train.parquet", "informational", None, None),
    "data.val_files": (["a.parquet"], "informational", None, None),
    "data.prompt_key": ("prompt", "exact", None, None),
    "data.max_prompt_length": (300, "derived", None, None),
    "data.max_response_length": (200, "derived", "rollout.max_new_tokens_per_turn", 200),
    "data.seed": (5, "exact", "run.seed", 5),
    "actor_rollout_ref.model.path": (
        "Qwen/Qwen3-0.6B",
        "derived",
        "student.model.hub_id",
        "Qwen/Qwen3-0.6B",
    ),
    "actor_rollout_ref.model.lora_adapter_path": (None, "informational", None, None),
    "actor_rollout_ref.model.enable_gradient_checkpointing": (True, "informational", None, None),
    "actor_rollout_ref.model.lora_rank": (8, "exact", "student.lora.r", 8),
    "actor_rollout_ref.model.lora_alpha": (16, "exact", "student.lora.alpha", 16),
    "actor_rollout_ref.model.target_modules": (
        ["q_proj"],
        "exact",
        "student.lora.target_modules",
        ["q_proj"],
    ),
    "actor_rollout_ref.actor.optim.lr": (1e-5, "exact", "train.lr", 1e-5),
    "trainer.save_freq": (5, "exact", "train.save_every", 5),
    "trainer.test_freq": (3, "exact", "train.eval_every", 3),
    "trainer.project_name": ("proj", "informational", None, None),
    "trainer.experiment_name": ("exp-1", "exact", "run.name", "exp-1"),
    "trainer.logger": (["console", "tensorboard"], "exact", "run.loggers",
                       ["jsonl", "tensorboard"]),
    "trainer.total_epochs": (3, "informational", None, None),
    "distillation.enabled": (True, "derived", "run.mode", "opd"),
    "distillation.distillation_loss.topk": (32, "exact", "loss.top_k", 32),
    "distillation.distillation_loss.loss_mode": ("k3", "derived", "loss.divergence", "reverse_kl"),
    "distillation.distillation_loss.use_policy_gradient": (False, "exact", None, None),
    "distillation.distillation_loss.use_task_rewards": (False, "exact", None, None),
    "distillation.distillation_loss.distillation_loss_coef": (1.0, "exact", None, None),
    "distillation.distillation_loss.loss_max_clamp": (None, "exact", None, None),
    "distillation.distillation_loss.log_prob_min_clamp": (None, "exact", None, None),
    "distillation.teacher_models.teacher_model.model_path": (
        "Qwen/Qwen3-1.7B",
        "derived",
        "teacher.model.hub_id",
        "Qwen/Qwen3-1.7B",
    ),
}


def _get(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_every_whitelisted_field_has_a_case():
    assert set(CASES) == set(WHITELIST)


@pytest.mark.parametrize("key", sorted(CASES))
def test_whitelisted_field_is_labelled_and_mapped(key):
    # A user relies on each documented field landing where the report says.
    value, label, target, expected = CASES[key]
    result = import_config({**BASE, key: value}, revision=REV, teacher_revision=TREV)
    finding = next(f for f in result.findings if f.field == key)
    assert finding.label == label, finding
    assert not result.refused, [f.to_dict() for f in result.refused]
    if target:
        assert _get(result.recipe, target) == expected


@pytest.mark.parametrize(
    ("key", "value", "family"),
    [
        ("critic.enable", True, "critic"),
        ("critic.optim.lr", 1e-5, "critic"),
        ("algorithm.adv_estimator", "grpo", "PPO/GRPO"),
        ("algorithm.use_kl_in_reward", True, "PPO/GRPO"),
        ("actor_rollout_ref.actor.clip_ratio", 0.2, "PPO/GRPO"),
        ("actor_rollout_ref.actor.ppo_epochs", 2, "PPO/GRPO"),
        ("ray_init.num_cpus", 8, "Ray resources"),
        ("trainer.n_gpus_per_node", 8, "Ray resources"),
        ("trainer.nnodes", 2, "Ray resources"),
        ("actor_rollout_ref.actor.strategy", "fsdp", "FSDP/Megatron"),
        ("actor_rollout_ref.actor.fsdp_config.param_offload", True, "FSDP/Megatron"),
        ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", 2, "FSDP/Megatron"),
        ("actor_rollout_ref.rollout.name", "vllm", "vLLM/SGLang"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 2, "vLLM/SGLang"),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", 0.5, "vLLM/SGLang"),
        ("actor_rollout_ref.rollout.mode", "async", "async rollout"),
        ("actor_rollout_ref.rollout.agent.num_workers", 8, "async rollout"),
        ("defaults", ["ppo_trainer"], "interpolation"),
    ],
)
def test_refused_family_names_the_field(key, value, family):
    # Fail closed: a silently dropped critic or estimator would train another algorithm.
    result = import_config({**BASE, key: value}, revision=REV, teacher_revision=TREV)
    refused = {f.field: f for f in result.refused}
    assert any(k == key or k.startswith(key) for k in refused), refused
    note = next(f.note for k, f in refused.items() if k == key or k.startswith(key))
    assert family in note


def test_unknown_field_refused():
    result = import_config(
        {**BASE, "data.mystery": 1, "brand_new": {"x": 2}}, revision=REV, teacher_revision=TREV
    )
    assert {f.field for f in result.refused} == {"data.mystery", "brand_new.x"}
    assert all("unknown field" in f.note for f in result.refused)


def test_several_teacher_entries_outside_a_bundle_are_one_refusal(tmp_path):
    # Only miniverl's own bundle says which environment each data_source is: a hand-written
    # routing is refused whole, in one line naming the entries and the way in, and the
    # teacher it never names is not a second error.
    entries = {f"distillation.teacher_models.{name}.{field}": value
               for name in ("math", "code")
               for field, value in (("key", name), ("model_path", "Qwen/Qwen3-1.7B"))}
    routing = {"distillation.teacher_key": "data_source", **entries}
    student = {"actor_rollout_ref.model.path": BASE["actor_rollout_ref.model.path"]}
    result = import_config({**student, **routing}, revision=REV, teacher_revision=TREV)
    [refused] = result.refused
    assert refused.field == "distillation.teacher_models" and refused.value == routing
    assert "teacher entries code, math" in refused.note
    assert "imports only as a bundle export-verl wrote" in refused.note
    assert "teachers: and environments:" in refused.note
    # Beside verl's own teacher_model entry too; one teacher_model alone is one teacher.
    result = import_config({**BASE, **entries}, revision=REV, teacher_revision=TREV)
    assert [f.field for f in result.refused] == ["distillation.teacher_models"]
    assert not import_config(BASE, revision=REV, teacher_revision=TREV).refused
    # The command: exit 1, the one line, a report naming every routing key.
    src = tmp_path / "verl.yaml"
    src.write_text(yaml.safe_dump({**student, **routing}))
    with pytest.raises(ConfigError) as err:
        import_verl(src, tmp_path / "r.yaml", revision=REV)
    assert str(err.value).count("\n") == 1 and "(1 problem(s)" in str(err.value)
    report = json.loads((tmp_path / "import-report.json").read_text())
    assert report["fields"][0]["value"] == routing and not report["ok"]


@pytest.mark.parametrize(
    "value", ["${oc.env:HOME}", "ckpt/${trainer.project_name}", "${oc.select:a.b, 1}"]
)
def test_interpolation_refused_even_in_whitelisted_field(value):
    result = import_config(
        {**BASE, "trainer.experiment_name": value}, revision=REV, teacher_revision=TREV
    )
    assert [f.field for f in result.refused] == ["trainer.experiment_name"]
    assert "interpolation" in result.refused[0].note


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("data.prompt_key", "question"),
        ("distillation.enabled", False),
        ("distillation.distillation_loss.loss_mode", "mse"),
        ("distillation.distillation_loss.use_policy_gradient", True),
        ("distillation.distillation_loss.use_task_rewards", True),
        ("distillation.distillation_loss.loss_max_clamp", 10.0),
        ("actor_rollout_ref.model.lora_rank", -1),
        ("actor_rollout_ref.model.target_modules", 7),
    ],
)
def test_whitelisted_field_with_unsupported_value_fails(key, value):
    result = import_config({**BASE, key: value}, revision=REV, teacher_revision=TREV)
    assert [(f.field, f.label) for f in result.refused] == [(key, "unsupported")]


def test_hub_model_without_pinned_revision_fails():
    result = import_config(BASE)
    assert {f.field for f in result.refused} == set(BASE)
    assert all("--revision" in f.note or "--teacher-revision" in f.note for f in result.refused)


def test_lora_rank_zero_is_full_finetune():
    result = import_config(
        {**BASE, "actor_rollout_ref.model.lora_rank": 0}, revision=REV, teacher_revision=TREV
    )
    assert result.recipe["student"]["lora"] is None


def test_import_writes_valid_recipe_and_report(tmp_path):
    from miniverl.common.recipe import load_recipe

    config = {
        "actor_rollout_ref": {
            "model": {
                "path": "Qwen/Qwen3-0.6B",
                "lora_rank": 16,
                "lora_alpha": 32,
                "target_modules": "all-linear",
            },
            "actor": {"optim": {"lr": 2e-5}},
        },
        "data": {"max_prompt_length": 512, "max_response_length": 256, "seed": 1},
        "trainer": {"experiment_name": "qwen opd", "save_freq": 10},
        "distillation": {
            "enabled": True,
            "distillation_loss": {"topk": 32, "loss_mode": "forward_kl_topk"},
            "teacher_models": {"teacher_model": {"model_path": "Qwen/Qwen3-1.7B"}},
        },
    }
    src = tmp_path / "verl.yaml"
    src.write_text(yaml.safe_dump(config))
    report, report_path = import_verl(
        src, tmp_path / "out" / "recipe.yaml", revision=REV, teacher_revision=TREV
    )
    recipe = load_recipe(tmp_path / "out" / "recipe.yaml")
    assert recipe.student.lora.r == 16 and recipe.rollout.max_total_tokens == 768
    assert recipe.run.name == "qwen-opd" and recipe.loss.top_k == 32
    on_disk = json.loads(report_path.read_text())
    assert on_disk["ok"] and report_path.parent == tmp_path / "out"
    assert {f["label"] for f in on_disk["fields"]} <= {"exact", "derived", "informational"}


def test_refused_import_writes_report_but_no_recipe(tmp_path):
    src = tmp_path / "verl.yaml"
    src.write_text(yaml.safe_dump({**BASE, "critic": {"enable": True}, "data": {"odd": 1}}))
    out = tmp_path / "recipe.yaml"
    with pytest.raises(ConfigError) as info:
        import_verl(src, out, revision=REV, teacher_revision=TREV)
    lines = str(info.value).splitlines()[1:]
    assert lines == [
        "critic.enable: critic: miniverl trains no value model",
        "data.odd: unknown field: not in the import whitelist",
    ]
    assert not out.exists()
    report = json.loads((tmp_path / "import-report.json").read_text())
    assert report["ok"] is False and report["counts"]["refused"] == 2


def test_cli_refusal_exits_1_one_line_per_field(tmp_path):
    import subprocess
    import sys

    src = tmp_path / "verl.yaml"
    src.write_text(yaml.safe_dump({"critic": {"enable": True}, "ray_init": {"num_cpus": 2}}))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "miniverl.cli.app",
            "import-verl",
            str(src),
            "--out",
            str(tmp_path / "r.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert (
        "critic.enable: critic" in proc.stderr and "ray_init.num_cpus: Ray resources" in proc.stderr
    )


def test_lora_rank_zero_is_a_full_finetune_whatever_the_shape_fields_say():
    # verl configs keep lora_alpha/target_modules next to lora_rank 0; they describe nothing.
    result = import_config(
        {**BASE, "actor_rollout_ref.model.lora_rank": 0, "actor_rollout_ref.model.lora_alpha": 16,
         "actor_rollout_ref.model.target_modules": "all-linear"},
        revision=REV, teacher_revision=TREV,
    )
    assert not result.refused and result.recipe["student"]["lora"] is None
    labels = {f.field: f.label for f in result.findings}
    assert labels["actor_rollout_ref.model.lora_alpha"] == "informational"
    assert labels["actor_rollout_ref.model.target_modules"] == "informational"
