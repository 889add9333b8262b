"""The distillation benchmark's script (benchmarks/distill_bench.py, docs/distillbench.md).

A reader of its table trusts four things this file checks: the training seconds at each
evaluation are the run's own rollout, teacher-wait and update seconds plus the fixed
set's preparation, never evaluation time; the equal-wall-clock budget reads the last
evaluation an arm had reached by then; no arm runs from a warm start outside the
preregistered band (one line naming the figure and the fix); and the grid's choice and
the phases' configs are what the docs say. A slow test runs the smoke config end to end
on a fresh clone as the docs write the commands.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import distill_bench as bench  # noqa: E402

SMOKE = "benchmarks/smoke/distill.yaml"
SMOKE_V3 = "benchmarks/smoke/distill_v3.yaml"
SMOKE_V4 = "benchmarks/smoke/distill_v4.yaml"
SMOKE_V5 = "benchmarks/smoke/distill_v5.yaml"
# Documented command (docs/distillbench.md) -> its smoke form, in this order.
DISTILL_SMOKE = {
    "python benchmarks/distill_bench.py --phase grid":
        f"python benchmarks/distill_bench.py --config {SMOKE} --phase grid",
    "python benchmarks/distill_bench.py --phase main":
        f"python benchmarks/distill_bench.py --config {SMOKE} --phase main",
    "python benchmarks/distill_bench.py --resume":
        f"python benchmarks/distill_bench.py --config {SMOKE} --resume",
    "python benchmarks/distill_bench.py --analyze-only":
        f"python benchmarks/distill_bench.py --config {SMOKE} --analyze-only",
    "python benchmarks/distill_bench.py": f"python benchmarks/distill_bench.py --config {SMOKE} "
                                          "--output-dir runs/benchmarks/distill-smoke-again",
    # Version 3 (its own config; in parts, then --resume).
    "python benchmarks/distill_bench.py --config benchmarks/distill/v3.yaml --update-committed "
    "--part-minutes 45": f"python benchmarks/distill_bench.py --config {SMOKE_V3} "
                         "--output-dir runs/benchmarks/distill-v3-doc --part-minutes 45",
    "python benchmarks/distill_bench.py --config benchmarks/distill/v3.yaml --update-committed "
    "--resume --part-minutes 45": f"python benchmarks/distill_bench.py --config {SMOKE_V3} "
                                  "--output-dir runs/benchmarks/distill-v3-doc --resume "
                                  "--part-minutes 45",
    # Version 4 (its own config; in parts, then --resume).
    "python benchmarks/distill_bench.py --config benchmarks/distill/v4.yaml --update-committed "
    "--part-minutes 45": f"python benchmarks/distill_bench.py --config {SMOKE_V4} "
                         "--output-dir runs/benchmarks/distill-v4-doc --part-minutes 45",
    "python benchmarks/distill_bench.py --config benchmarks/distill/v4.yaml --update-committed "
    "--resume --part-minutes 45": f"python benchmarks/distill_bench.py --config {SMOKE_V4} "
                                  "--output-dir runs/benchmarks/distill-v4-doc --resume "
                                  "--part-minutes 45",
    # Version 5 (--version 5 names benchmarks/distill/v5.yaml; in parts, then --resume).
    "python benchmarks/distill_bench.py --version 5 --update-committed --part-minutes 45":
        f"python benchmarks/distill_bench.py --config {SMOKE_V5} "
        "--output-dir runs/benchmarks/distill-v5-doc --part-minutes 45",
    "python benchmarks/distill_bench.py --version 5 --update-committed --resume "
    "--part-minutes 45": f"python benchmarks/distill_bench.py --config {SMOKE_V5} "
                         "--output-dir runs/benchmarks/distill-v5-doc --resume --part-minutes 45",
}


def _write(run_dir: Path, events: list[dict], rows: list[dict]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def _eval(version: int, greedy: float, t1: float, unseen: float | None = None) -> dict:
    e = {"event": "eval", "version": version, "success": greedy, "n": 4,
         "sampled": {"success": t1}}
    if unseen is not None:
        e["coverage"] = {"unseen_share": unseen}
    return e


def _row(step: int, rollout: float, wait: float, update: float) -> dict:
    return {"step": step, "time_rollout_s": rollout, "time_teacher_wait_s": wait,
            "time_update_s": update, "wall_s": 1000.0 * step}  # wall_s holds eval time too


def test_training_seconds_are_rollout_wait_update_and_preparation_never_evaluation(tmp_path):
    run = _write(tmp_path / "kd", [
        _eval(0, 0.1, 0.2),
        {"event": "teacher_set_played", "time_load_s": 2.0, "time_play_s": 5.0},
        # offline KD's set event: its sampling time already holds the teacher's playing.
        {"event": "offline_targets_scored", "time_sample_s": 7.5, "time_teacher_wait_s": 0.5},
        _eval(2, 0.3, 0.4, unseen=0.5),
        _eval(4, 0.5, 0.6),
        _eval(4, 0.5, 0.7, unseen=0.25),  # the final eval of the version evaluated last
    ], [_row(1, 1.0, 0.5, 0.25), _row(2, 1.0, 0.5, 0.25), _row(3, 2.0, 0.0, 1.0),
        _row(4, 2.0, 0.0, 1.0)])
    curve = bench.read_curve(run)
    assert [p["update"] for p in curve] == [0, 2, 4]
    assert [p["train_s"] for p in curve] == [0.0, 8.0 + 3.5, 8.0 + 3.5 + 6.0]
    assert curve[-1]["t1"] == 0.7 and curve[-1]["unseen_states_greedy"] == 0.25
    # SeqKD (sft) has no set event: its teacher's loading and playing are its preparation.
    seqkd = _write(tmp_path / "seqkd", [
        _eval(0, 0.1, 0.2),
        {"event": "teacher_set_played", "time_load_s": 2.0, "time_play_s": 5.0},
        _eval(1, 0.2, 0.3)], [_row(1, 0.5, 0.0, 0.5)])
    assert [p["train_s"] for p in bench.read_curve(seqkd)] == [0.0, 8.0]
    assert bench.preparation_s([]) == 0.0
    # Episodes read from the arm's shared cache cost what they cost the cell that played
    # them: each cell is charged for the generation it trains on, played or read.
    charged = {"event": "teacher_set_played", "time_load_s": 0.0, "time_play_s": 0.0,
               "from_cache": 4, "time_charged_s": 6.5}
    assert bench.preparation_s([charged]) == 6.5
    assert bench.preparation_s([charged, {"event": "offline_targets_scored",
                                          "time_sample_s": 0.25}]) == 6.75


def test_a_run_without_its_start_eval_starts_from_the_warm_students_measured_once(tmp_path):
    # eval.before: false in every cell: update 0 is the warm student's one eval on the
    # same split (start_evals), at 0 training seconds; a run with its own keeps its own.
    run = _write(tmp_path / "sft", [_eval(2, 0.3, 0.4)], [_row(1, 1.0, 0.0, 0.5),
                                                         _row(2, 1.0, 0.0, 0.5)])
    start = {"greedy": 0.8, "t1": 0.6, "unseen_states": 0.2, "n": 128}
    curve = bench.read_curve(run, start)
    assert [(p["update"], p["train_s"], p["t1"]) for p in curve] == [(0, 0.0, 0.6), (2, 3.0, 0.4)]
    assert [p["update"] for p in bench.read_curve(run)] == [2]
    own = _write(tmp_path / "own", [_eval(0, 0.1, 0.2)], [])
    assert bench.read_curve(own, start)[0]["t1"] == 0.2


def test_the_wall_clock_budget_reads_the_last_evaluation_reached_by_then():
    curve = [{"update": 0, "train_s": 0.0}, {"update": 16, "train_s": 50.0},
             {"update": 32, "train_s": 100.0}]
    assert bench.at_seconds(curve, 49.9)["update"] == 0
    assert bench.at_seconds(curve, 50.0)["update"] == 16
    assert bench.at_seconds(curve, 1e9)["update"] == 32
    assert bench.at_update(curve, 16)["train_s"] == 50.0 and bench.at_update(curve, 8) is None


def _cell(arm: str, seed: int, curve: list[dict]) -> dict:
    return {"arm": arm, "seed": seed, "status": "ok", "curve": curve,
            "training_s": curve[-1]["train_s"], "preparation_s": 0.0, "wall_s": 1.0}


def _point(update, train_s, greedy, t1):
    return {"update": update, "train_s": train_s, "greedy": greedy, "t1": t1,
            "unseen_states": 0.5}


def test_both_budgets_pair_every_arm_with_the_baseline_seed_by_seed():
    import numpy as np

    cells = []
    for seed in (1, 2, 3):
        cells.append(_cell("sft", seed, [_point(0, 0, 0.4, 0.4), _point(64, 10, 0.5, 0.5)]))
        # Slower: by 10 training seconds it had reached update 0 only.
        cells.append(_cell("opd", seed, [_point(0, 0, 0.4, 0.4),
                                         _point(64, 40, 0.5 + 0.1 * seed, 0.6)]))
    arms = bench.compare(cells, "sft", [0, 64], [10.0], np.random.default_rng(0))
    final = arms["opd"]["updates=64"]
    assert final["t1"]["mean"] == pytest.approx(0.6)
    assert final["greedy_vs_sft"]["mean"] == pytest.approx(0.2) and final["greedy_vs_sft"]["n"] == 3
    assert final["t1_vs_sft"]["low"] == pytest.approx(0.1)
    at_10 = arms["opd"]["seconds=10"]
    assert at_10["updates_reached"] == {"1": 0, "2": 0, "3": 0}
    assert at_10["t1_vs_sft"]["mean"] == pytest.approx(-0.1)
    assert "t1_vs_sft" not in arms["sft"]["updates=64"]


def test_the_warm_start_gate_refuses_a_figure_outside_the_band_in_one_line():
    record = {"steps": 600, "eval": {"split": "eval", "n": 64, "success": 0.1,
                                     "sampled": {"success": 0.125}}}
    with pytest.raises(SystemExit) as info:
        bench.check_warm_start(record, (0.3, 0.7), "warm_student.yaml")
    (line,) = str(info.value).splitlines()
    assert "0.125" in line and "[0.3, 0.7]" in line and "warm_student.yaml's train.cycles" in line
    assert "new commit before any result" in line
    assert bench.check_warm_start({**record, "eval": {"sampled": {"success": 0.3}}},
                                  (0.3, 0.7), "w.yaml") == 0.3
    with pytest.raises(SystemExit, match="eval.samples unset"):
        bench.check_warm_start({"eval": {"success": 0.5}}, (0.3, 0.7), "w.yaml")
    start = bench.start_summary({"eval": {"success": 0.2, "sampled": {"success": 0.4}}},
                                {"eval": {"success": 0.9, "sampled": {"success": 0.85}}},
                                (0.3, 0.7))
    assert start["warm_student"]["in_band"] is True
    assert start["teacher_margin"] == {"greedy": pytest.approx(0.7), "t1": pytest.approx(0.45)}


def test_the_grid_chooses_the_best_t1_rate_and_refuses_an_incomplete_grid():
    def cell(name, t1, greedy):
        return {"arm": name, "status": "ok", "curve": [_point(64, 1, greedy, t1)]}

    cells = [cell("sft-lr0", 0.4, 0.5), cell("sft-lr1", 0.5, 0.4), cell("sft-lr2", 0.5, 0.4),
             cell("opd-lr0", 0.1, 0.1), cell("opd-lr1", 0.1, 0.3), cell("opd-lr2", 0.2, 0.0)]
    chosen, table = bench.choose_rates(cells, ["sft", "opd"], [3e-4, 1e-3, 3e-3])
    assert chosen == {"sft": 1e-3, "opd": 3e-3}  # sft: a tie goes to the lower rate
    assert [r["t1"] for r in table["sft"]["grid"]] == [0.4, 0.5, 0.5]
    with pytest.raises(SystemExit, match="grid of arm opd is incomplete"):
        bench.choose_rates(cells[:5], ["sft", "opd"], [3e-4, 1e-3, 3e-3])


def test_the_phase_configs_are_valid_benchmarks_with_the_grid_and_the_choice(tmp_path):
    from miniverl.student.benchmark.config import cell_recipe, load_benchmark_config

    raw, settings = bench.load_config(bench.CONFIG)
    grid = bench.write_phase_config(raw, settings, "grid", bench.CONFIG.parent, tmp_path / "grid")
    config, base = load_benchmark_config(grid)
    assert config.seeds == [settings.grid_seed]
    assert len(config.arms) == len(settings.lr_grid) * len(raw["arms"])
    lrs = {a.name: a.overrides["train"]["lr"] for a in config.arms}
    assert [lrs[f"opd_rkl-lr{i}"] for i in range(len(settings.lr_grid))] == settings.lr_grid
    assert {a.overrides["eval"]["split"] for a in config.arms} == {"eval"}
    chosen = {a["name"]: 1e-3 for a in raw["arms"]}
    main = bench.write_phase_config(raw, settings, "main", bench.CONFIG.parent, tmp_path / "main",
                                    chosen)
    config, base = load_benchmark_config(main)
    assert config.seeds == [1, 2, 3, 4, 5] and config.baseline == "sft"
    assert {a.overrides["eval"]["split"] for a in config.arms} == {"test"}
    # The offline arms share one targets cache per arm, across seeds and phases.
    gkd = next(a for a in config.arms if a.name == "gkd")
    recipe = cell_recipe(config, base, gkd, 3, tmp_path / "main")
    assert Path(recipe["cache"]["dir"]) == tmp_path / "main" / "../targets/gkd"
    assert recipe["train"]["lr"] == 1e-3 and recipe["train"]["oracle_tasks"] == 2048
    sft = cell_recipe(config, base, config.arms[0], 3, tmp_path / "main")
    assert "dir" not in (sft.get("cache") or {})
    # SeqKD's seeds and rates share one cache of the teacher's episodes.
    seqkd = cell_recipe(config, base, next(a for a in config.arms if a.name == "seqkd"), 3,
                        tmp_path / "main")
    assert Path(seqkd["cache"]["dir"]) == tmp_path / "main" / "../targets/seqkd"
    # Every cell recipe is a valid recipe (the teacher-set arms once the benchmark names
    # the prepared teacher's weights in place of teacher.prepare, as a run does).
    from miniverl.common.recipe import Recipe

    for arm in config.arms:
        recipe = cell_recipe(config, base, arm, 1, tmp_path / "main")
        if (arm.overrides.get("train") or {}).get("fixed_set") == "teacher":
            recipe["teacher"].pop("prepare")
        Recipe.model_validate(recipe)


def test_a_bad_distill_section_is_one_line(tmp_path):
    data = yaml.safe_load(bench.CONFIG.read_text())
    data["distill"]["main_split"] = "eval"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SystemExit) as info:
        bench.load_config(path)
    (line,) = str(info.value).splitlines()
    assert "grid_split and main_split are both 'eval'" in line


def test_every_documented_distill_command_has_a_smoke_form():
    text = (ROOT / "docs" / "distillbench.md").read_text(encoding="utf-8")
    found = set()
    for block in re.findall(r"^```(?:bash|sh|)\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.splitlines():
            line = re.split(r"\s+#|\s{3,}", line.strip(), maxsplit=1)[0].strip()
            if line.startswith("python benchmarks/distill_bench.py"):
                found.add(" ".join(line.split()))
    assert found and not found - set(DISTILL_SMOKE), sorted(found - set(DISTILL_SMOKE))


def test_the_smoke_config_is_small():
    raw, settings = bench.load_config(ROOT / SMOKE)
    assert len(raw["arms"]) == 2 and raw["seeds"] == [1] and raw["budget"]["updates"] == 2


@pytest.fixture(scope="module")
def doc_clone(tmp_path_factory) -> Path:
    """A fresh clone in which every documented command ran in its smoke form, in order.

    The version 3, 4 and 5 tests read their smoke runs there (``runs/benchmarks/
    distill-v{3,4,5}-doc``) instead of running the same configs again."""
    from tests.student.benchmark.test_smoke import fresh_clone, run

    clone = fresh_clone(tmp_path_factory.mktemp("distill") / "clone")
    for command in DISTILL_SMOKE.values():
        run(clone, command)
    return clone


@pytest.mark.slow
def test_the_distill_benchmark_runs_on_a_fresh_clone(doc_clone):
    from tests.student.benchmark.test_smoke import assert_untouched, run

    clone = doc_clone
    summary = json.loads((clone / "runs/benchmarks/distill-smoke/distill_bench_smoke.json")
                         .read_text())
    assert summary["complete"] and set(summary["grid"]["choice"]) == {"sft", "gkd"}
    assert {c["arm"] for c in summary["main"]["cells"]} == {"sft", "gkd"}
    assert summary["start"]["warm_student"]["t1"] is not None
    # The committed results' runs are not in a clone: --analyze-only says so, writes nothing.
    out = run(clone, "python benchmarks/distill_bench.py --analyze-only --update-committed",
              code=1)
    raw, _ = bench.load_config(bench.CONFIG)
    committed = (clone / bench.committed_analysis(raw["name"]).relative_to(ROOT)).is_file()
    expected = "a fresh clone has none" if committed else "run the benchmark first"
    assert expected in out and "Traceback" not in out
    assert_untouched(clone)


@pytest.mark.slow
def test_a_run_in_parts_stops_at_a_cell_boundary_and_resumes(tmp_path):
    out = tmp_path / "parts"
    common = ["--config", str(ROOT / SMOKE), "--output-dir", str(out), "--phase", "grid"]
    assert bench.main([*common, "--part-minutes", "0.0001"]) == 3  # after its first cell
    first = json.loads((out / "grid" / "results.json").read_text())
    assert len(first["cells"]) == 1
    assert bench.main([*common, "--resume"]) == 0
    done = json.loads((out / "grid" / "results.json").read_text())
    assert len(done["cells"]) == 4 and done["cells"][0] == first["cells"][0]
    with pytest.raises(SystemExit) as info:
        bench.main([*common, "--part-minutes", "0"])
    assert "--part-minutes 0 must be positive" in str(info.value)


def test_coverage_is_read_at_t1_and_the_time_split_is_kept(tmp_path):
    # Issue 41: each point's coverage is the T=1 episodes' (the update-0 row's reading),
    # greedy's beside it; the seconds keep where they went (rollout, wait, update).
    t1_cov = {**_eval(2, 0.9, 0.7, unseen=0.0), "sampled": {"success": 0.7,
                                                            "coverage": {"unseen_share": 0.125}}}
    run = _write(tmp_path / "sft", [t1_cov], [_row(1, 1.0, 0.5, 0.25), _row(2, 2.0, 0.0, 1.0)])
    (point,) = bench.read_curve(run)
    assert point["unseen_states"] == 0.125 and point["unseen_states_greedy"] == 0.0
    assert point["time_split"] == {"rollout_s": 3.0, "teacher_wait_s": 0.5, "update_s": 1.25,
                                   "preparation_s": 0.0}
    cell = bench.analyze_cell({"arm": "sft", "seed": 1, "result": {
        "status": "ok", "updates": 2, "wall_s": 9.0, "run_dir": str(run)}}, tmp_path)
    assert cell["time_split"]["rollout_s"] == 3.0
    # An OPD run has no fixed-set source: without its kept episodes no figure is made up.
    opd = _write(tmp_path / "opd", [_eval(2, 0.9, 0.7)], [_row(1, 1.0, 0.5, 0.25)])
    assert bench.read_curve(opd)[0]["unseen_states"] is None


def test_a_second_reference_arm_is_paired_seed_by_seed_and_changes_no_figure():
    import copy

    import numpy as np

    cells = []
    for seed, (a, b) in enumerate([(0.90, 0.88), (0.92, 0.91), (0.91, 0.93)], start=1):
        cells.append(_cell("sft", seed, [_point(0, 0, 0.5, 0.5), _point(32, 10, 1.0, 0.95)]))
        cells.append(_cell("seqkd", seed, [_point(0, 0, 0.5, 0.5), _point(32, 90, 1.0, b)]))
        cells.append(_cell("gkd", seed, [_point(0, 0, 0.5, 0.5), _point(32, 40, 1.0, a)]))
    block = {"cells": cells, "arms": bench.compare(cells, "sft", [0, 32], [60.0],
                                                   np.random.default_rng(0))}
    before = copy.deepcopy(block["arms"])
    bench.add_comparisons(block, "sft", ["seqkd"])
    pair = block["arms"]["gkd"]["updates=32"]["t1_vs_seqkd"]
    assert pair["per_seed"] == pytest.approx({"1": 0.02, "2": 0.01, "3": -0.02})
    assert (pair["above"], pair["below"], pair["n"]) == (2, 1, 3)
    assert pair["mean"] == pytest.approx(0.01 / 3)
    base = block["arms"]["gkd"]["updates=32"]["t1_vs_sft"]
    assert {k: base[k] for k in ("mean", "low", "high", "n")} == before["gkd"]["updates=32"][
        "t1_vs_sft"] and base["below"] == 3
    assert "t1_vs_seqkd" not in block["arms"]["seqkd"]["updates=32"]
    # Within 60 s SeqKD had reached update 0 only: the pair reads what each had by then.
    assert block["arms"]["gkd"]["seconds=60"]["t1_vs_seqkd"]["per_seed"]["1"] == pytest.approx(
        0.40)


def test_the_plateau_and_margin_gates_stop_the_script_in_one_line():
    # Version 3 (docs/distillbench.md): a warm student at the plateau of the user's data,
    # a teacher at least the margin above it, both checked before the first cell.
    warm = {"evals": [{"update": 400, "t1": 0.58}, {"update": 600, "t1": 0.60},
                      {"update": 800, "t1": 0.61}]}
    teacher = {"eval": {"sampled": {"success": 0.945}}}
    on = bench.DistillSettings(lr_grid=[1e-3], grid_seed=1, grid_split="eval",
                               main_split="test", warm_start=(0.0, 1.0), wall_clock_s=[10],
                               plateau_tolerance=0.02, teacher_margin=0.15)
    gates = bench.check_gates(warm, teacher, on, "warm.yaml")
    assert gates == {"plateau": 0.61, "margin": pytest.approx(0.335)}
    off = on.model_copy(update={"plateau_tolerance": None, "teacher_margin": None})
    assert bench.check_gates({}, None, off, "warm.yaml") == {}
    rising = {"evals": [{"update": 600, "t1": 0.50}, {"update": 800, "t1": 0.61}]}
    with pytest.raises(SystemExit, match=r"the warm student \(warm\.yaml\) is not at a plateau"):
        bench.check_gates(rising, teacher, on, "warm.yaml")
    with pytest.raises(SystemExit, match=r"below the required margin 0\.4") as exc:
        bench.check_gates(warm, teacher, on.model_copy(update={"teacher_margin": 0.4}), "w")
    assert "\n" not in str(exc.value)


def test_version_3_reads_the_gap_each_arm_closes_and_the_seconds_to_rls_final_score():
    import numpy as np

    cells = []
    for seed in (1, 2):
        # rl ends at T=1 0.7 (seed 1) and 0.8 (seed 2).
        # (_point: update, training seconds, greedy, T=1)
        cells.append(_cell("rl", seed, [_point(0, 0, 0.6, 0.5),
                                        _point(64, 50, 0.7, 0.6 + 0.1 * seed)]))
        # opd reaches rl's final score at its first evaluation (30 s) for seed 1 only.
        cells.append(_cell("opd", seed, [_point(0, 0, 0.6, 0.5), _point(32, 30, 0.7, 0.7),
                                         _point(64, 60, 0.8, 0.75)]))
    block = {"cells": cells,
             "arms": bench.compare(cells, "rl", [0, 64], [], np.random.default_rng(0))}
    bench.add_gap_closed(block, {"t1": 0.5, "greedy": 0.6}, {"t1": 1.0, "greedy": 1.0})
    # opd's mean T=1 after 64 updates is 0.75: half of the gap from 0.5 to 1.0.
    assert block["arms"]["opd"]["updates=64"]["t1_gap_closed"] == pytest.approx(0.5)
    assert block["arms"]["rl"]["updates=64"]["t1_gap_closed"] == pytest.approx(0.5)
    assert block["arms"]["opd"]["updates=0"]["t1_gap_closed"] == pytest.approx(0.0)
    assert block["gap"] == {"start": {"greedy": 0.6, "t1": 0.5},
                            "teacher": {"greedy": 1.0, "t1": 1.0}}
    bench.add_time_to_reach(block, "rl")
    reach = block["arms"]["opd"]["seconds_to_rl_final"]
    assert reach["per_seed"] == {"1": 30, "2": None}  # seed 2's 0.8 was never reached
    assert (reach["reached"], reach["of"], reach["mean_s"]) == (1, 2, 30.0)
    assert block["arms"]["rl"]["seconds_to_rl_final"]["reached"] == 2
    # No gap (a teacher no better than the start): no share is made up.
    bench.add_gap_closed(block, {"t1": 0.5, "greedy": 0.6}, {"t1": 0.5, "greedy": 0.6})
    assert block["arms"]["opd"]["updates=64"]["t1_gap_closed"] is None


def test_a_student_prepared_on_the_teachers_episodes_names_the_prepared_teacher(tmp_path):
    raw, _ = bench.load_config(ROOT / "benchmarks" / "distill" / "v3.yaml")
    config_dir = ROOT / "benchmarks" / "distill"
    assert bench.on_teacher_samples(config_dir / raw["student_prepare"])["prepare"] == \
        "teacher.yaml"
    assert bench.on_teacher_samples(config_dir / "warm_student.yaml") is None
    raw = {**raw, "name": f"v3-test-{tmp_path.name}"}
    path = bench.resolve_student_prepare(raw, config_dir, str(tmp_path / "teacher"))
    try:
        assert path == bench.student_prepare_path(raw, config_dir)
        data = yaml.safe_load(path.read_text())
        assert data["teacher"]["model"] == {"path": str(tmp_path / "teacher")}
        assert "prepare" not in data["teacher"] and data["train"]["fixed_set"] == "teacher"
        from miniverl.common.recipe import Recipe

        Recipe.model_validate(data)  # what prepare_model trains
        # The phase configs name that copy as the student preparation.
        phase = bench.phase_config(raw, bench.load_config(
            ROOT / "benchmarks" / "distill" / "v3.yaml")[1], "grid", config_dir, tmp_path / "grid")
        assert (tmp_path / "grid" / phase["student_prepare"]).resolve() == path.resolve()
    finally:
        path.unlink()
        path.parent.rmdir()


@pytest.mark.slow
def test_the_version_4_smoke_narrows_one_arm_to_the_users_prompts(doc_clone):
    # benchmarks/smoke/distill_v4.yaml: seqkd on the whole pool, seqkd_user on its first
    # half, each paired with the baseline, rl and seqkd_user (run by the documented
    # commands, which exited 0).
    out = doc_clone / "runs/benchmarks/distill-v4-doc"
    summary = json.loads((out / "distill_bench_v4_smoke.json").read_text())
    main = summary["main"]
    assert summary["complete"] and main["also_against"] == ["rl", "seqkd_user"]
    assert "t1_vs_seqkd_user" in main["arms"]["seqkd"]["updates=2"]
    from miniverl.common.trajectory import read_trajectories
    from miniverl.student.environments.registry import make_tasks

    user = {t.id for t in make_tasks("calculator", "train", 8, "easy", 0,
                                     params={"units": False, "chain": 3})}
    for arm in ("seqkd", "seqkd_user"):
        run = next(c for c in main["cells"] if c["arm"] == arm)["run_dir"]
        played = {t.task_id for t in read_trajectories(out / "main" / run /
                                                       "trajectories.jsonl")}
        assert played <= user if arm == "seqkd_user" else played - user, (arm, played)


@pytest.mark.slow
def test_the_version_3_smoke_runs_end_to_end(doc_clone):
    # The student prepared on what the prepared teacher plays, an rl arm with no teacher
    # section, the gap and time-to-rl readings (benchmarks/smoke/distill_v3.yaml, run by
    # the documented commands, which exited 0).
    out = doc_clone / "runs/benchmarks/distill-v3-doc"
    summary = json.loads((out / "distill_bench_v3_smoke.json").read_text())
    assert summary["complete"] and set(summary["grid"]["choice"]) == {"seqkd", "rl", "opd_rl"}
    main = summary["main"]
    assert main["gap"]["start"]["t1"] is not None and main["also_against"] == ["rl"]
    for arm, entry in main["arms"].items():
        assert entry["seconds_to_rl_final"]["of"] == 1
        assert "t1_gap_closed" in entry["updates=2"]
        if arm != "rl":
            assert "t1_vs_rl" in entry["updates=2"]
    rl_run = next(c for c in main["cells"] if c["arm"] == "rl")["run_dir"]
    events = [json.loads(line) for line in
              (out / "main" / rl_run / "events.jsonl").read_text().splitlines()]
    assert not any(e["event"] == "teacher_connected" for e in events)  # no teacher asked


@pytest.mark.slow
def test_the_version_5_smoke_runs_every_new_path_end_to_end(doc_clone):
    # benchmarks/smoke/distill_v5.yaml: a grid extended once (with two rates every choice
    # is an edge), the control's arms with the warm student as their teacher, fixed sets
    # charged as used, a seconds budget, each cell's clip binding share.
    out = doc_clone / "runs/benchmarks/distill-v5-doc"  # the documented commands exited 0
    summary = json.loads((out / "distill_bench_v5_smoke.json").read_text())
    assert summary["complete"] and summary["grid"]["extensions"] == ["grid_ext1"]
    for row in summary["grid"]["choice"].values():
        assert len(row["grid"]) == 3 and row["at_edge"] in ("low", "high", None)
    main = summary["main"]
    warm = json.loads((out / "start_evals.json").read_text())["warm:eval"]["model"]
    for cell in main["cells"]:
        assert 0.0 <= cell["signal"]["clip_binding_share"] <= 1.0 and cell["signal"]["clip"] == 1.0
        # Whether a 2-update toy cell trains for the smoke's 1 s depends on the machine's
        # load; what the record must say is whether it did.
        assert cell["reached_budget_s"] is (cell["training_s"] >= 1), cell["arm"]
        resolved = yaml.safe_load((out / "main" / cell["run_dir"] / "recipe.resolved.yaml")
                                  .read_text())
        teacher = (resolved.get("teacher") or {}).get("model", {}).get("path", "")
        assert teacher.endswith(warm) == (cell["arm"] in ("sft_own", "opd_self")), cell["arm"]
        # The committed start (distill.start), read where the clone holds it: no cell prepares.
        start = doc_clone / "benchmarks/smoke/start_v5"
        assert resolved["student"]["model"]["path"] == str(start / "warm")
        assert teacher == str(start / ("warm" if cell["arm"] in ("sft_own", "opd_self")
                                       else "teacher")), cell["arm"]
    for arm, entry in main["arms"].items():
        short = sum(c["reached_budget_s"] is False for c in main["cells"] if c["arm"] == arm)
        assert entry["short_of_budget_s"] == short and "half_gap_s" not in entry  # no gap here


def test_the_training_signal_counts_updates_with_nothing_to_learn():
    # Version 3's finding: on prompts the student has learned by heart, every training
    # episode of most updates succeeds, and RL and OPD have ~nothing to learn from.
    rows = [{"phase": "train", "train_success": 1.0, "loss": 1e-9, "grad_norm": 1e-7},
            {"phase": "train", "train_success": 1.0, "loss": -2e-9, "grad_norm": 2e-7},
            {"phase": "train", "train_success": 0.75, "loss": 0.02, "grad_norm": 0.5},
            {"phase": "warmup", "train_success": None, "loss": 3.0, "grad_norm": 9.0}]
    signal = bench.training_signal(rows)
    assert signal["updates"] == 3 and signal["all_right_share"] == 2 / 3
    assert signal["train_success"] == pytest.approx(2.75 / 3)
    assert signal["abs_loss_median"] == 2e-9 and signal["grad_norm_median"] == 2e-7
    sft = bench.training_signal([{"phase": "train", "train_success": None, "loss": 0.5,
                                  "grad_norm": 0.1}])
    assert sft["all_right_share"] is None and sft["abs_loss_median"] == 0.5


def test_any_arm_may_be_the_baseline_its_group_stays_out_of_the_start_evals(tmp_path, monkeypatch):
    # Issue 54: with an on-policy baseline (rollout.group_size 4) the start evaluations
    # ended in a pydantic traceback: the evaluation recipe kept the group in sft mode.
    raw, _ = bench.load_config(ROOT / "benchmarks/distill/v4.yaml")
    seen = []

    def fake_evaluate(recipe, model_dir, adapter=None):
        seen.append(recipe)
        return {"success": 0.5, "n": 4, "sampled": {"success": 0.25}}, 0.1

    monkeypatch.setattr(bench, "evaluate_dir", fake_evaluate)
    for baseline in ("opd_rkl", "rl", "opd_rl", "seqkd"):
        out = bench.start_evals({**raw, "baseline": baseline}, ROOT / "benchmarks/distill",
                                {"warm": str(tmp_path / f"warm-{baseline}")}, "eval",
                                tmp_path / f"{baseline}.json")
        assert out["warm"]["t1"] == 0.25 and out["warm"]["greedy"] == 0.5
    assert len(seen) == 4
    for recipe in seen:
        assert recipe.run.mode == "sft" and recipe.rollout.group_size is None
        assert recipe.eval.split == "eval" and recipe.teacher is None
    # Every arm's evaluation is the same, whichever arm the recipe came from.
    assert len({r.model_dump_json(exclude={"student"}) for r in seen}) == 1


def test_the_clip_binding_share_counts_the_updates_the_clip_rescaled(tmp_path):
    # Version 5 reports, per cell and arm, the share of updates whose gradient norm
    # before the clip exceeded train.max_grad_norm (metrics' grad_norm is before it).
    rows = [{"phase": "train", "grad_norm": g, "loss": 0.1} for g in (0.01, 0.04, 0.06, 1.2)]
    signal = bench.training_signal(rows, clip=0.05)
    assert signal["clip"] == 0.05 and signal["clip_binding_share"] == 0.5
    assert signal["grad_norm_after_median"] == pytest.approx(0.045)  # 0.04 and 0.05
    assert "clip_binding_share" not in bench.training_signal(rows)
    run = tmp_path / "run"
    run.mkdir()
    assert bench.run_clip(run) is None
    (run / "recipe.resolved.yaml").write_text("train: {max_grad_norm: 0.3}\n")
    assert bench.run_clip(run) == 0.3
    import numpy as np

    cells = [{**_cell("opd", s, [_point(0, 0, 0.4, 0.4), _point(8, 5, 0.5, 0.5)]),
              "signal": {"updates": 8, "clip_binding_share": share, "train_success": 0.5}}
             for s, share in ((1, 1.0), (2, 0.5))]
    arms = bench.compare(cells, "opd", [8], [], np.random.default_rng(0))
    assert arms["opd"]["mean_signal"]["clip_binding_share"] == 0.75
    assert "grad_norm_after_median" not in arms["opd"]["mean_signal"]


def test_seconds_to_close_half_the_gap_per_seed():
    import numpy as np

    cells = [_cell("seqkd", 1, [_point(0, 0, 0.6, 0.6), _point(16, 40, 0.7, 0.79),
                                _point(32, 80, 0.8, 0.8)]),
             _cell("seqkd", 2, [_point(0, 0, 0.6, 0.6), _point(16, 45, 0.7, 0.7)]),
             _cell("opd", 1, [_point(0, 0, 0.6, 0.6), _point(16, 20, 0.9, 0.85)])]
    block = {"cells": cells,
             "arms": bench.compare(cells, "seqkd", [0, 16], [], np.random.default_rng(0))}
    # start 0.6, teacher 1.0: half the gap is T=1 0.8.
    bench.add_half_gap_seconds(block, {"t1": 0.6, "greedy": 0.6}, {"t1": 1.0, "greedy": 1.0})
    half = block["arms"]["seqkd"]["half_gap_s"]
    assert half["goal_t1"] == pytest.approx(0.8)
    assert half["per_seed"] == {"1": 80, "2": None} and (half["reached"], half["of"]) == (1, 2)
    assert block["arms"]["opd"]["half_gap_s"]["mean_s"] == 20
    gone = {"cells": cells, "arms": {"opd": {}}}
    bench.add_half_gap_seconds(gone, {"t1": 0.6}, {"t1": 0.6})  # no gap: nothing read
    assert gone["arms"]["opd"] == {}


def test_the_grid_is_extended_until_every_choice_is_inside_it(tmp_path):
    def cell(name, t1):
        return {"arm": name, "status": "ok", "curve": [_point(64, 1, t1, t1)]}

    grid = [1e-4, 3e-4, 1e-3]
    cells = [cell("seqkd-lr0", 0.6), cell("seqkd-lr1", 0.7), cell("seqkd-lr2", 0.8),
             cell("opd-lr0", 0.7), cell("opd-lr1", 0.6), cell("opd-lr2", 0.5),
             cell("rl-lr0", 0.6), cell("rl-lr1", 0.7), cell("rl-lr2", 0.6)]
    _, table = bench.choose_rates(cells, ["seqkd", "opd", "rl"], grid)
    assert [table[a]["at_edge"] for a in ("seqkd", "opd", "rl")] == ["high", "low", None]
    new = bench.grid_extension(table, 10 ** 0.5, (1e-6, 1e-1))
    assert new == {"seqkd": pytest.approx(1e-3 * 10 ** 0.5), "opd": pytest.approx(1e-4 / 10 ** 0.5)}
    assert bench.grid_extension(table, 10 ** 0.5, (1e-6, 2e-3)) == {"opd": new["opd"]}
    # Each arm's own rates: the extension's cell <arm>-lr3 ran the arm's fourth rate.
    rates = {"seqkd": [*grid, new["seqkd"]], "opd": [*grid, new["opd"]], "rl": grid}
    cells += [cell("seqkd-lr3", 0.75), cell("opd-lr3", 0.65)]
    chosen, table = bench.choose_rates(cells, ["seqkd", "opd", "rl"], rates)
    assert chosen == {"seqkd": 1e-3, "opd": 1e-4, "rl": 3e-4}
    assert all(table[a]["at_edge"] is None for a in chosen)
    assert bench.grid_extension(table, 10 ** 0.5, (1e-6, 1e-1)) == {}
    # arm_rates reads an extension's rates from its folder's derived config.
    raw, settings = bench.load_config(ROOT / "benchmarks/distill/v4.yaml")
    names = [a["name"] for a in raw["arms"]]
    folder = tmp_path / "grid_ext1"
    data = bench.extension_config(raw, settings, ROOT / "benchmarks/distill", folder,
                                  {"seqkd": (3, new["seqkd"]), "opd_rkl": (3, new["opd"])})
    assert [a["name"] for a in data["arms"]] == ["seqkd-lr3", "opd_rkl-lr3"]
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(data))
    (folder / "results.json").write_text("{}")
    assert bench.extension_dirs(tmp_path) == [folder]
    rates = bench.arm_rates(tmp_path, names, settings.lr_grid)
    assert rates["seqkd"] == [*settings.lr_grid, pytest.approx(new["seqkd"])]
    assert rates["opd_rkl"][3] == pytest.approx(new["opd"]) and rates["rl"] == settings.lr_grid


def test_a_fixed_set_is_charged_up_front_or_as_it_is_used(tmp_path):
    # Version 5 reads every arm at equal seconds: SeqKD's teacher plays the set of its
    # planned cycles before the first update, and "as_used" charges by each update the
    # share of those episodes trained on by then; versions 1-4 charged all of it at once.
    events = [{"event": "teacher_set_played", "episodes": 64, "time_load_s": 1.0,
               "time_play_s": 63.0}, _eval(4, 0.5, 0.5), _eval(8, 0.6, 0.6),
              _eval(16, 0.7, 0.7)]
    rows = [_row(step, 0.0, 0.0, 0.5) for step in range(1, 17)]
    run = _write(tmp_path / "seqkd", events, rows)
    (run / "recipe.resolved.yaml").write_text("train: {rollouts_per_cycle: 8}\n")
    assert bench.set_share_used(run, events, 4) == 0.5 and bench.set_share_used(run, events, 16) == 1
    up_front = bench.read_curve(run)
    as_used = bench.read_curve(run, charge_set="as_used")
    assert [p["train_s"] for p in up_front] == [66.0, 68.0, 72.0]
    assert [p["train_s"] for p in as_used] == [34.0, 68.0, 72.0]  # 64 s x 4/8, then all
    assert as_used[0]["time_split"]["preparation_s"] == 32.0
    # A mixing arm (GKD) draws only its fixed part of each batch from the set.
    (run / "recipe.resolved.yaml").write_text(
        "train: {rollouts_per_cycle: 8, on_policy_fraction: 0.5}\n")
    assert bench.set_share_used(run, events, 4) == 0.25
    # No set (OPD) or no resolved recipe: nothing to share out.
    assert bench.set_share_used(run, [], 4) == 1.0
    (run / "recipe.resolved.yaml").unlink()
    assert bench.set_share_used(run, events, 4) == 1.0



def test_a_run_in_parts_resumes_only_on_the_machine_that_started_it(tmp_path):
    """Cells spend seconds and train models whose numerics the libraries and the CPU
    decide: the first part writes the machine's record, a resume on the same machine
    goes on, and one on another machine is one line naming what differs."""
    here = bench.machine_record()
    assert {"torch", "transformers", "cpu_model", "cpu_capability", "cpus"} <= set(here)
    assert bench.check_machine(tmp_path, resume=False) == here
    assert json.loads((tmp_path / bench.MACHINE_FILE).read_text()) == here
    assert bench.check_machine(tmp_path, resume=True) == here
    other = {**here, "transformers": "0.0.1"}
    with pytest.raises(SystemExit) as exc:
        bench.check_machine(tmp_path, resume=True, here=other)
    message = str(exc.value)
    assert "\n" not in message and message.startswith("error: --resume on another machine")
    assert f"transformers 0.0.1 here, {here['transformers']} there" in message
    assert "--output-dir" in message
    # A run started afresh (no --resume) on another machine writes its own record.
    assert bench.check_machine(tmp_path, resume=False, here=other) == other


def test_a_run_in_parts_resumes_only_from_the_weights_it_started_from(tmp_path):
    """One recipe can prepare different weights on two machines of one label (the
    record of version 5's first attempt): the first part writes each preparation's
    weights digest, and a resume whose preparations differ is one line naming which."""
    warm, teacher, out = tmp_path / "warm", tmp_path / "teacher", tmp_path / "out"
    for folder, data in ((warm, b"w" * 64), (teacher, b"t" * 64)):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(data)
    prepared = {"warm": {"model_dir": str(warm)}, "teacher": {"model_dir": str(teacher)},
                "none": None}
    first = bench.check_start(out, resume=False, prepared=prepared)
    assert set(first) == {"warm", "teacher"} and first["warm"] != first["teacher"]
    assert bench.check_start(out, resume=True, prepared=prepared) == first
    (warm / "model.safetensors").write_bytes(b"x" * 64)
    with pytest.raises(SystemExit) as exc:
        bench.check_start(out, resume=True, prepared=prepared)
    message = str(exc.value)
    assert "\n" not in message and "from other prepared weights" in message
    assert f"warm {bench.check_start(tmp_path / 'other', False, prepared)['warm']} here" in message
    assert "teacher" not in message.split("(")[1].split(")")[0]
    (warm / "model.safetensors").unlink()
    with pytest.raises(SystemExit, match="holds no .safetensors weights; remove that folder"):
        bench.check_start(out, resume=True, prepared=prepared)


def test_a_part_reads_an_earlier_parts_cells_from_the_committed_analysis(tmp_path):
    """Run folders are git-ignored: a part on a fresh clone reads the cells an earlier
    part ran from the analysis that part committed; a cell whose folder is here is read
    from it."""
    run = _write(tmp_path / "grid" / "runs" / "a-1", [_eval(2, 0.3, 0.4)],
                 [_row(1, 1.0, 0.0, 0.5), _row(2, 1.0, 0.0, 0.5)])
    cell = {"arm": "a-lr0", "seed": 1,
            "result": {"status": "ok", "updates": 2, "wall_s": 9.0, "run_dir": "runs/a-1"}}
    here = bench.analyze_cell(cell, tmp_path / "grid")
    assert here["training_s"] == 3.0 and here["curve"][-1]["t1"] == 0.4
    output = tmp_path / "analysis.json"
    output.write_text(json.dumps({"grid": {"cells": [here]}, "main": None}))
    kept = bench.kept_cells(output)
    assert set(kept) == {"runs/a-1"}
    for path in sorted(run.iterdir()):
        path.unlink()
    run.rmdir()
    assert bench.analyze_cell(cell, tmp_path / "grid", kept=kept) == here
    assert bench.kept_cells(tmp_path / "none.json") == {}


def test_each_part_is_logged_with_the_host_and_machine_it_ran_on(tmp_path):
    first = bench.log_part(tmp_path, resume=False)
    second = bench.log_part(tmp_path, resume=True)
    parts = json.loads((tmp_path / bench.PARTS_FILE).read_text())
    assert parts == [first, second] and [p["resume"] for p in parts] == [False, True]
    assert {"started_at", "host", "boot_id", "machine"} <= set(first)
    assert first["machine"] == bench.machine_record()
    # A fresh start (no --resume) begins a new log.
    assert json.loads((tmp_path / bench.PARTS_FILE).read_text()) == parts
    bench.log_part(tmp_path, resume=False)
    assert len(json.loads((tmp_path / bench.PARTS_FILE).read_text())) == 1
