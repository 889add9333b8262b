"""Our bundle checked by official verl code, one venv per supported release (marker ``verl``).

Each target of ``bridge/profile.py`` (verl 0.8.0 and 0.9.1) has its own venv from
``tests/bridge/setup_verl_venv.sh VERSION`` (``.ci/run`` creates both). A bundle is
exported for that target (``export-verl --verl-version``) and ``verl_check.py`` runs in
that venv: Hydra composition (every key the bundle writes is one verl's own config has),
RLHFDataset, get_custom_reward_fn and the tool classes run for real; Ray, vLLM, FSDP and
a training step do not. Without a venv its case skips and says how to create it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from miniverl.bridge import profile

pytestmark = pytest.mark.verl

HERE = Path(__file__).resolve().parent
VENVS = Path(os.environ.get("MINIVERL_VERL_VENVS", Path.home() / ".cache/miniverl"))


def venv_python(version: str) -> Path:
    """The venv ``setup_verl_venv.sh VERSION`` creates (``$MINIVERL_VERL_VENVS``)."""
    return VENVS / f"verl-{version}-venv" / "bin" / "python"


# The default target's venv (test_verl_prompt_parity.py runs there).
PYTHON = venv_python(profile.DEFAULT_VERL_VERSION)
VENV = PYTHON.parents[1]


def verl_ready(version: str) -> str | None:
    """Why the venv of ``version`` cannot be used, or None."""
    python = venv_python(version)
    if not python.is_file():
        return (f"no verl {version} venv at {python.parents[1]}; create it with: "
                f"bash tests/bridge/setup_verl_venv.sh {version}")
    probe = subprocess.run(
        [str(python), "-c", "from importlib.metadata import version; print(version('verl'))"],
        capture_output=True, text=True, timeout=120,
    )
    if probe.returncode != 0 or probe.stdout.strip() != version:
        return (f"verl {version} is not installed in {python.parents[1]}: "
                f"{(probe.stderr or probe.stdout).strip()[-300:]}")
    return None


@pytest.fixture(scope="module", params=sorted(profile.VERL_TARGETS))
def target_bundle(request, toy_run, tmp_path_factory):
    """``(version, bundle)``: the toy run exported for one verl target."""
    from miniverl.bridge.bundle import export_verl

    version = request.param
    reason = verl_ready(version)
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp(f"bundle-{version}") / "bundle"
    export_verl(toy_run, out, verl_version=version)
    return version, out


def _run_check(version: str, bundle: Path) -> dict:
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_CACHE": str(bundle.parent / "hf-datasets"),
    }
    proc = subprocess.run(
        [str(venv_python(version)), str(HERE / "verl_check.py"), str(bundle)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=bundle.parent,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("VERL_CHECK_RESULT ")]
    assert lines, f"no result line; rc={proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("VERL_CHECK_RESULT ") :])


def test_bundle_passes_official_verl_code(target_bundle):
    # A user hands the bundle to the verl release it names: that release's own config,
    # dataset, reward and tool code must accept it as written.
    version, bundle = target_bundle
    result = _run_check(version, bundle)
    failed = {k: v for k, v in result["steps"].items() if not v["ok"]}
    assert not failed, json.dumps(failed, indent=2)
    assert result["verl_version"] == version
    assert set(result["steps"]) == {"compose", "dataset", "reward", "tools"}
    compose = result["steps"]["compose"]
    assert compose["unknown_keys"] == [], compose["unknown_keys"]
    assert compose["entry_point"] == profile.VERL_TARGETS[version].trainer
    # DistillationConfig accepts the default pool (no --teacher-gpus): one GPU on one node,
    # the single teacher's one replica of tensor-parallel 1 (verl's trainer refuses 0
    # nodes, its own default); and no task-reward policy loss beside the divergence.
    assert compose["teacher_pool"] == [1, 1]
    assert compose["teacher_world_sizes"] == {"default": 1}
    assert compose["use_task_rewards"] is False
    assert result["steps"]["reward"]["ground_truth_score"] == 1.0
    assert result["steps"]["reward"]["garbage_score"] == 0.0
    assert (
        result["steps"]["dataset"]["longest_prompt_tokens"]
        <= result["steps"]["dataset"]["max_prompt_length"]
    )


def test_a_key_the_release_lacks_fails_the_check(target_bundle, tmp_path):
    # 0.9 removed rollout.skip, which 0.8.0 still declares: a bundle writing it must
    # fail the 0.9.1 check (its RolloutConfig refuses the key; a key outside the
    # dataclass sections is named by unknown_keys, since Hydra adds an unknown key of
    # the primary config silently) and pass the 0.8.0 one.
    version, bundle = target_bundle
    edited = tmp_path / "bundle"
    shutil.copytree(bundle, edited)
    overrides = edited / "recipe/verl-overrides.yaml"
    doc = yaml.safe_load(overrides.read_text())
    doc["actor_rollout_ref"]["rollout"]["skip"] = {"enable": False}
    doc["data"]["not_a_verl_key"] = 1
    overrides.write_text(yaml.safe_dump(doc, sort_keys=False))
    compose = _run_check(version, edited)["steps"]["compose"]
    if version == "0.8.0":
        assert compose["ok"] and compose["unknown_keys"] == ["data.not_a_verl_key"], compose
    else:
        assert not compose["ok"] and "skip" in compose["error"], compose


# ------------------------------------------------------- mixtures and several teachers


@pytest.fixture(scope="module", params=[(v, kind) for v in sorted(profile.VERL_TARGETS)
                                        for kind in ("mixture", "two teachers")],
                ids=lambda p: f"{p[0]}-{p[1].replace(' ', '-')}")
def mixture_bundle(request, mixture_run, two_teacher_run, tmp_path_factory):
    """``(version, kind, bundle)``: a mixture run (one teacher) or a run of two teachers
    exported for one verl target."""
    from miniverl.bridge.bundle import export_verl

    version, kind = request.param
    reason = verl_ready(version)
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp(f"mix-{version}") / "bundle"
    export_verl(mixture_run if kind == "mixture" else two_teacher_run, out, verl_version=version)
    return version, kind, out


def test_a_mixture_bundle_passes_official_verl_code(mixture_bundle):
    # Every environment's reward and tools, and verl's own routing of every train row to
    # the teacher whose route scored that row's environment in the run.
    version, kind, bundle = mixture_bundle
    result = _run_check(version, bundle)
    failed = {k: v for k, v in result["steps"].items() if not v["ok"]}
    assert not failed, json.dumps(failed, indent=2)
    steps = result["steps"]
    assert steps["compose"]["unknown_keys"] == []
    rows = {"miniverl/calculator": 6, "miniverl/jsonnav": 6}
    if kind == "two teachers":
        assert steps["compose"]["teacher_keys"] == sorted(rows)
        assert steps["routing"]["rows_by_route"] == {"calc": {"miniverl/calculator": 6},
                                                     "nav": {"miniverl/jsonnav": 6}}
    else:
        assert steps["compose"]["teacher_keys"] == ["default"]
        assert steps["routing"]["rows_by_route"] == {"teacher": rows}
    assert steps["compose"]["teacher_pool"][0] * steps["compose"]["teacher_pool"][1] == sum(
        steps["compose"]["teacher_world_sizes"].values())
    assert steps["compose"]["use_task_rewards"] is False
    assert {s: t["rows"] for s, t in steps["reward"]["every_row"].items()} == rows
    assert steps["tools"]["called"]["miniverl/calculator"].keys() == {"calculator", "convert"}
    assert steps["tools"]["called"]["miniverl/jsonnav"].keys() == {"get", "keys", "find"}


def test_a_teacher_keyed_by_another_environment_fails_the_routing_check(tmp_path,
                                                                       two_teacher_run):
    # calc's entry keyed by jsonnav's data_source and nav's by calculator's: verl then
    # routes each row to the other route's teacher, and the check must say so.
    from miniverl.bridge.bundle import export_verl

    version = "0.9.1"
    reason = verl_ready(version)
    if reason:
        pytest.skip(reason)
    bundle = tmp_path / "bundle"
    export_verl(two_teacher_run, bundle, verl_version=version)
    path = bundle / "recipe/verl-overrides.yaml"
    text = path.read_text()
    text = (text.replace("key: miniverl/calculator", "key: SWAP")
            .replace("key: miniverl/jsonnav", "key: miniverl/calculator")
            .replace("key: SWAP", "key: miniverl/jsonnav"))
    path.write_text(text)
    routing = _run_check(version, bundle)["steps"]["routing"]
    assert not routing["ok"] and "miniverl/calculator', 'nav', 'calc'" in routing["error"], routing
