"""Our bundle checked by official verl code, one venv per supported release (marker ``verl``).

Each target of ``bridge/profile.py`` (verl 0.8.0 and 0.9.1) has its own venv from
``tests/bridge/setup_verl_venv.sh VERSION`` (``.ci/run`` creates both). A bundle is
exported for that target (``export-verl --verl-version``) and ``verl_check.py`` runs in
that venv: Hydra composition (every key the bundle writes is one verl's own config has),
RLHFDataset, get_custom_reward_fn and the tool classes run for real; Ray, vLLM, FSDP and
a training step do not. Without a venv its case skips and says how to create it. One
``verl_check.py`` process per release checks every bundle of this module (importing verl
takes most of a check's time); each test asserts on its own bundle's result.
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


def _add_keys_the_release_lacks(bundle: Path) -> None:
    """``rollout.skip`` (0.8.0 declares it, 0.9 removed it) and ``data.not_a_verl_key``."""
    overrides = bundle / "recipe/verl-overrides.yaml"
    doc = yaml.safe_load(overrides.read_text())
    doc["actor_rollout_ref"]["rollout"]["skip"] = {"enable": False}
    doc["data"]["not_a_verl_key"] = 1
    overrides.write_text(yaml.safe_dump(doc, sort_keys=False))


def _swap_teacher_keys(bundle: Path) -> None:
    """calc's teacher entry keyed by jsonnav's data_source and nav's by calculator's."""
    path = bundle / "recipe/verl-overrides.yaml"
    text = path.read_text()
    text = (text.replace("key: miniverl/calculator", "key: SWAP")
            .replace("key: miniverl/jsonnav", "key: miniverl/calculator")
            .replace("key: SWAP", "key: miniverl/jsonnav"))
    path.write_text(text)


def _export_bundles(version: str, runs: dict, out: Path) -> dict[str, Path]:
    """Every bundle this module checks with ``version``, by name."""
    from miniverl.bridge.bundle import export_verl

    bundles = {}
    for name, run in runs.items():
        bundles[name] = out / name
        export_verl(run, bundles[name], verl_version=version)
    edits = {"toy-unknown-keys": ("toy", _add_keys_the_release_lacks)}
    if version == "0.9.1":
        edits["two-teachers-swapped"] = ("two-teachers", _swap_teacher_keys)
    for name, (source, edit) in edits.items():
        bundles[name] = out / name
        shutil.copytree(bundles[source], bundles[name])
        edit(bundles[name])
    return bundles


def _run_checks(version: str, bundles: dict[str, Path], workdir: Path) -> dict[str, dict]:
    """``{name: result}`` from one ``verl_check.py`` process checking every bundle; a bundle
    without a result line gets one whose ``error`` has the process's stderr."""
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_CACHE": str(workdir / "hf-datasets"),
    }
    proc = subprocess.run(
        [str(venv_python(version)), str(HERE / "verl_check.py"),
         *(str(b) for b in bundles.values())],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=workdir,
    )
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("VERL_CHECK_RESULT "):
            result = json.loads(line[len("VERL_CHECK_RESULT ") :])
            found[result["bundle"]] = result
    missing = {"error": f"no result line; rc={proc.returncode}\n{proc.stderr[-3000:]}"}
    return {name: found.get(str(path.resolve()), missing) for name, path in bundles.items()}


@pytest.fixture(scope="module")
def verl_checks(toy_run, mixture_run, two_teacher_run, tmp_path_factory):
    """``result(version, name)``: the check of bundle ``name`` by verl ``version``. The first
    call for a release exports and checks all of its bundles in one process; without the
    release's venv it skips and says how to create it."""
    runs = {"toy": toy_run, "mixture": mixture_run, "two-teachers": two_teacher_run}
    done: dict[str, dict | str] = {}

    def result(version: str, name: str) -> dict:
        if version not in done:
            workdir = tmp_path_factory.mktemp(f"verl-{version}")
            done[version] = verl_ready(version) or _run_checks(
                version, _export_bundles(version, runs, workdir), workdir)
        checked = done[version]
        if isinstance(checked, str):
            pytest.skip(checked)
        found = checked[name]
        assert "error" not in found, f"{name} (verl {version}): {found['error']}\n" + found.get(
            "trace", "")
        return found

    return result


@pytest.fixture(params=sorted(profile.VERL_TARGETS))
def target(request) -> str:
    """One verl target's version."""
    return request.param


def test_bundle_passes_official_verl_code(target, verl_checks):
    # A user hands the bundle to the verl release it names: that release's own config,
    # dataset, reward and tool code must accept it as written.
    version = target
    result = verl_checks(version, "toy")
    failed = {k: v for k, v in result["steps"].items() if not v["ok"]}
    assert not failed, "toy: " + json.dumps(failed, indent=2)
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


def test_a_key_the_release_lacks_fails_the_check(target, verl_checks):
    # 0.9 removed rollout.skip, which 0.8.0 still declares: a bundle writing it must
    # fail the 0.9.1 check (its RolloutConfig refuses the key; a key outside the
    # dataclass sections is named by unknown_keys, since Hydra adds an unknown key of
    # the primary config silently) and pass the 0.8.0 one (_add_keys_the_release_lacks).
    version = target
    compose = verl_checks(version, "toy-unknown-keys")["steps"]["compose"]
    if version == "0.8.0":
        assert compose["ok"] and compose["unknown_keys"] == ["data.not_a_verl_key"], compose
    else:
        assert not compose["ok"] and "skip" in compose["error"], compose


# ------------------------------------------------------- mixtures and several teachers


@pytest.fixture(params=[(v, kind) for v in sorted(profile.VERL_TARGETS)
                        for kind in ("mixture", "two teachers")],
                ids=lambda p: f"{p[0]}-{p[1].replace(' ', '-')}")
def mixture_target(request) -> tuple[str, str]:
    """``(version, kind)``: a mixture run (one teacher) or a run of two teachers, for one
    verl target."""
    return request.param


def test_a_mixture_bundle_passes_official_verl_code(mixture_target, verl_checks):
    # Every environment's reward and tools, and verl's own routing of every train row to
    # the teacher whose route scored that row's environment in the run.
    version, kind = mixture_target
    name = kind.replace(" ", "-")
    result = verl_checks(version, name)
    failed = {k: v for k, v in result["steps"].items() if not v["ok"]}
    assert not failed, f"{name}: " + json.dumps(failed, indent=2)
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


def test_a_teacher_keyed_by_another_environment_fails_the_routing_check(verl_checks):
    # calc's entry keyed by jsonnav's data_source and nav's by calculator's
    # (_swap_teacher_keys): verl then routes each row to the other route's teacher, and
    # the check must say so.
    routing = verl_checks("0.9.1", "two-teachers-swapped")["steps"]["routing"]
    assert not routing["ok"] and "miniverl/calculator', 'nav', 'calc'" in routing["error"], routing
