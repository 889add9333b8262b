"""Our bundle checked by official verl 0.8.0 code, in its own venv (marker ``verl``).

The venv comes from ``tests/bridge/setup_verl_venv.sh`` (``.ci/run`` creates it). Without
it this test skips and says how to create it. What runs and what does not is described
in ``verl_check.py``: Hydra composition, RLHFDataset, get_custom_reward_fn and the tool
classes run for real; Ray, vLLM, FSDP and a training step do not.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.verl

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("MINIVERL_VERL_VENV", Path.home() / ".cache/miniverl/verl-0.8.0-venv"))
PYTHON = VENV / "bin" / "python"


def _verl_ready() -> str | None:
    if not PYTHON.is_file():
        return f"no verl venv at {VENV}; create it with: bash tests/bridge/setup_verl_venv.sh"
    probe = subprocess.run(
        [str(PYTHON), "-c", "import verl; print(verl.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0 or probe.stdout.strip() != "0.8.0":
        return (
            f"verl 0.8.0 not importable in {VENV}: {(probe.stderr or probe.stdout).strip()[-300:]}"
        )
    return None


def test_bundle_passes_official_verl_code(toy_bundle):
    reason = _verl_ready()
    if reason:
        pytest.skip(reason)
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_CACHE": str(toy_bundle.parent / "hf-datasets"),
    }
    proc = subprocess.run(
        [str(PYTHON), str(HERE / "verl_check.py"), str(toy_bundle)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=toy_bundle.parent,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("VERL_CHECK_RESULT ")]
    assert lines, f"no result line; rc={proc.returncode}\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1][len("VERL_CHECK_RESULT ") :])
    failed = {k: v for k, v in result["steps"].items() if not v["ok"]}
    assert not failed, json.dumps(failed, indent=2)
    assert result["verl_version"] == "0.8.0"
    assert set(result["steps"]) == {"compose", "dataset", "reward", "tools"}
    assert result["steps"]["reward"]["ground_truth_score"] == 1.0
    assert result["steps"]["reward"]["garbage_score"] == 0.0
    assert (
        result["steps"]["dataset"]["longest_prompt_tokens"]
        <= result["steps"]["dataset"]["max_prompt_length"]
    )
