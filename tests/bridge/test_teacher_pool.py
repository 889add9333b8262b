"""Every bundle's teacher pool passes the arithmetic verl's trainer and its
``DistillationConfig`` check, out of the box (no ``--teacher-gpus``), for both releases;
and every bundle trains on the divergence alone (``use_task_rewards: false``).

The checks are verl's own, read from both releases' source (0.8.0 and 0.9.1 agree):
``TaskRunner.init_resource_pool_mgr`` (0.8.0 ``trainer/main_ppo.py``) and
``PPOTrainer._init_resource_pool_mgr`` (0.9.1 ``trainer/ppo/v1/trainer_base.py``) refuse a
pool whose ``n_gpus_per_node`` or ``nnodes`` is not above 0;
``DistillationConfig._resolve_teacher_models`` gives one ``teacher_model`` the whole pool
(its per-replica world size must divide it) and pops ``teacher_model`` beside several
entries; ``__post_init__`` then needs the teachers' world sizes to sum to the pool. A key
the bundle does not write takes verl's default (``distillation/distillation.yaml``). The
same bundles pass verl's own dataclass in test_verl_real.py (marker ``verl``).
"""

from __future__ import annotations

import shutil

import pytest
import yaml

from miniverl.bridge import profile
from miniverl.bridge.bundle import export_verl
from miniverl.bridge.doctor import doctor
from miniverl.bridge.importer import import_verl
from miniverl.common.errors import ConfigError
from miniverl.common.hashing import write_sums

# verl's defaults for what a bundle may leave out (distillation.yaml, both releases; the
# pipeline size from RolloutConfig, which the template does not set).
VERL_DEFAULTS = {"distillation.n_gpus_per_node": 8, "distillation.nnodes": 0}
INFERENCE_DEFAULTS = {"tensor_model_parallel_size": 2, "data_parallel_size": 1,
                      "pipeline_model_parallel_size": 1}


def verl_pool_problems(flat: dict) -> list[str]:
    """What verl's trainer and DistillationConfig refuse in the teacher pool of ``flat``."""
    n_gpus = flat.get("distillation.n_gpus_per_node", VERL_DEFAULTS["distillation.n_gpus_per_node"])
    nnodes = flat.get("distillation.nnodes", VERL_DEFAULTS["distillation.nnodes"])
    problems = []
    if n_gpus <= 0:
        problems.append("config.distillation.n_gpus_per_node must be greater than 0")
    if nnodes <= 0:
        problems.append("config.distillation.nnodes must be greater than 0")
    pool = n_gpus * nnodes
    entries = sorted({k.split(".")[2] for k in flat if k.startswith("distillation.teacher_models.")}
                     | {"teacher_model"})

    def per_replica(entry):
        prefix = f"distillation.teacher_models.{entry}.inference."
        size = 1
        for name, default in INFERENCE_DEFAULTS.items():
            size *= flat.get(prefix + name, default)
        return size

    if len(entries) == 1:
        if pool % per_replica("teacher_model"):
            problems.append(f"per_replica_world_size ({per_replica('teacher_model')}) must divide "
                            f"the pool ({pool})")
            return problems  # verl raises here
        world = pool // per_replica("teacher_model") * per_replica("teacher_model")
    else:
        entries.remove("teacher_model")  # popped by verl beside other entries
        world = sum(flat.get(f"distillation.teacher_models.{e}.num_replicas", 0) * per_replica(e)
                    for e in entries)
    if world != pool:
        problems.append(f"teachers' world sizes ({world}) must match the pool ({pool})")
    return problems


def _flat(bundle) -> dict:
    return profile.flatten(yaml.safe_load((bundle / "recipe/verl-overrides.yaml").read_text()))


@pytest.fixture(scope="module", params=[(v, kind) for v in sorted(profile.VERL_TARGETS)
                                        for kind in ("one teacher", "mixture", "two teachers")],
                ids=lambda p: f"{p[0]}-{p[1].replace(' ', '-')}")
def default_bundle(request, toy_run, mixture_run, two_teacher_run, tmp_path_factory):
    """``(kind, bundle)``: a run exported for one verl target with no --teacher-gpus."""
    version, kind = request.param
    run = {"one teacher": toy_run, "mixture": mixture_run, "two teachers": two_teacher_run}[kind]
    out = tmp_path_factory.mktemp("pool") / "bundle"
    export_verl(run, out, verl_version=version)
    return kind, out


def test_every_default_bundle_has_a_pool_verl_accepts(default_bundle):
    kind, bundle = default_bundle
    flat = _flat(bundle)
    assert verl_pool_problems(flat) == []
    # One GPU per teacher: the single teacher's, or one per route.
    assert flat["distillation.nnodes"] == 1
    assert flat["distillation.n_gpus_per_node"] == (2 if kind == "two teachers" else 1)


def test_verl_s_default_pool_is_refused_by_the_same_arithmetic(default_bundle):
    # What a one-teacher bundle wrote before it had a pool: verl's 0 nodes, refused by its
    # trainer; and a teacher of verl's default tensor-parallel 2 does not fit one GPU.
    kind, bundle = default_bundle
    flat = _flat(bundle)
    unset = {k: v for k, v in flat.items()
             if k not in ("distillation.nnodes", "distillation.n_gpus_per_node")}
    assert "config.distillation.nnodes must be greater than 0" in verl_pool_problems(unset)
    if kind != "two teachers":
        del flat["distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size"]
        assert verl_pool_problems(flat) == ["per_replica_world_size (2) must divide the pool (1)"]


def test_every_bundle_trains_without_task_rewards(default_bundle):
    # verl's default (true) adds its PPO loss on task-reward advantages to the distillation
    # loss; the run trained on the divergence alone.
    _, bundle = default_bundle
    assert _flat(bundle)["distillation.distillation_loss.use_task_rewards"] is False


def test_task_rewards_turned_on_fail_doctor_and_import(toy_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    edited = tmp_path / "bundle"
    shutil.copytree(toy_bundle, edited)
    path = edited / "recipe/verl-overrides.yaml"
    path.write_text(path.read_text().replace("use_task_rewards: false", "use_task_rewards: true"))
    write_sums(edited)  # re-signed: only the content checks can catch it
    checks = {c["name"]: c for c in doctor(edited)["checks"]}
    assert checks["overrides"]["status"] == "fail"
    assert ("distillation.distillation_loss.use_task_rewards is True, profile needs False"
            in checks["overrides"]["detail"])
    with pytest.raises(ConfigError, match="use_task_rewards"):
        import_verl(path, tmp_path / "recipe.yaml")
