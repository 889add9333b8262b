"""The several-teachers benchmark (benchmarks/several_bench.py, docs/several-teachers.md).

Its smoke form (benchmarks/smoke/several.yaml) runs end to end on a fresh clone: the base
and its three adapters are prepared (each adapter alone, on the prepared base), one
teacher process serves them all, the specialists' arm routes each domain to its own
adapter and the generalist's both to one, SeqKD plays each domain's prompts with its own
adapter, and the analysis reads every domain apart. A bad config is one line.
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

import several_bench as bench  # noqa: E402

SMOKE = "benchmarks/smoke/several.yaml"
# Documented command (docs/several-teachers-bench.md) -> its smoke form.
SEVERAL_SMOKE = {
    "python benchmarks/several_bench.py --update-committed":
        f"python benchmarks/several_bench.py --config {SMOKE}",
    "python benchmarks/several_bench.py --update-committed --resume":
        f"python benchmarks/several_bench.py --config {SMOKE} --resume",
    "python benchmarks/several_bench.py --config benchmarks/several/v2.yaml --update-committed":
        f"python benchmarks/several_bench.py --config {SMOKE} --resume",
}


def _routes(run_dir: Path) -> set[str]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().split("\n")
            if line.strip()]
    return {name for row in rows for name in (row.get("by_teacher") or {})}


@pytest.mark.slow  # preparations of 2 steps, 9 grid and main cells of 2 updates: about 60 s
def test_the_smoke_runs_on_a_fresh_clone(tmp_path):
    from tests.student.benchmark.test_smoke import assert_untouched, fresh_clone, run

    clone = fresh_clone(tmp_path / "clone")
    for command in SEVERAL_SMOKE.values():
        run(clone, command)
    out = clone / "runs/benchmarks/several-smoke"
    summary = json.loads((out / "several_bench_smoke.json").read_text())
    assert summary["grid"]["complete"] and summary["main"]["complete"]
    assert set(summary["grid"]["chosen"]) == {"seqkd", "specialists", "generalist"}
    arms = summary["main"]["arms"]
    assert set(arms) == {"seqkd", "specialists", "generalist"}
    for arm in ("specialists", "generalist"):
        for reading in ("t1", "calculator/t1", "jsonnav/t1", "jsonnav/tool_calls_t1",
                        "t1_vs_seqkd", "calculator/t1_vs_seqkd"):
            assert reading in arms[arm], (arm, reading)
    assert "t1_vs_generalist" in arms["specialists"]
    evals = summary["start"]["evals"]
    for name in ("student", "base", "adapter:calc", "adapter:nav", "adapter:gen"):
        assert set(evals[f"{name}:test"]["domains"]) == {"calculator", "jsonnav"}
    # Each adapter was prepared alone on the prepared base: no weights of its own.
    prepared = summary["start"]["prepared"]
    assert prepared["adapter:calc"]["base"] and "model_dir" not in prepared["adapter:calc"]
    # The routes each arm's cells scored through, in one teacher process.
    results = json.loads((out / "main" / "results.json").read_text())
    by_arm = {}
    for cell in results["cells"]:
        by_arm.setdefault(cell["arm"], []).append(out / "main" / cell["result"]["run_dir"])
    assert all(_routes(r) == {"teacher/calc", "teacher/nav"} for r in by_arm["specialists"])
    assert all(_routes(r) == {"teacher/gen"} for r in by_arm["generalist"])
    # SeqKD played each domain's prompts with its own adapter (the episode cache keys it).
    keys = list((out / "targets" / "seqkd" / "teacher_episodes").iterdir())
    assert len(keys) == 2
    assert (out / "main" / "teacher.log").is_file()  # the one teacher process of the phase
    # Counters per route, and no stale reply trained on.
    for arm in ("specialists", "generalist"):
        assert arms[arm]["stale_dropped"] == 0 and arms[arm]["routes"]
    assert_untouched(clone)


def test_every_documented_several_command_has_a_smoke_form():
    text = (ROOT / "docs" / "several-teachers-bench.md").read_text(encoding="utf-8")
    found, fence = set(), None
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        line = re.split(r"\s+#|\s{3,}", line.strip(), maxsplit=1)[0].strip()
        if fence in ("bash", "sh", "") and line.startswith("python benchmarks/several_bench.py"):
            found.add(" ".join(line.split()))
    assert found and not found - set(SEVERAL_SMOKE), sorted(found - set(SEVERAL_SMOKE))


def test_version_2_is_version_1_with_rank_1_adapters():
    one, first = bench.load_config(bench.CONFIG)
    two, second = bench.load_config(ROOT / "benchmarks/several/v2.yaml")
    assert {k: v for k, v in two.items() if k not in ("name", "output_dir")} == \
        {k: v for k, v in one.items() if k not in ("name", "output_dir")}
    assert second.model_copy(update={"adapters": first.adapters}) == first
    for name, rel in second.adapters.items():
        r1 = yaml.safe_load((ROOT / "benchmarks/several" / rel).read_text())
        r16 = yaml.safe_load((ROOT / "benchmarks/several" / first.adapters[name]).read_text())
        assert r1["student"]["lora"]["r"] == 1 and r16["student"]["lora"]["r"] == 16
        r1["student"]["lora"], r1["run"]["name"] = r16["student"]["lora"], r16["run"]["name"]
        assert r1 == r16


def test_the_committed_config_is_what_the_docs_say():
    raw, settings = bench.load_config(bench.CONFIG)
    assert [a["name"] for a in raw["arms"]] == ["seqkd", "specialists", "generalist"]
    assert raw["baseline"] == "seqkd" and len(raw["seeds"]) >= 3
    assert set(settings.adapters) == {"calc", "nav", "gen"}
    recipe = yaml.safe_load((ROOT / "benchmarks/several" / raw["recipe"]).read_text())
    assert [m["adapter"] for m in recipe["environments"]] == ["calc", "nav"]
    generalist = next(a for a in raw["arms"] if a["name"] == "generalist")
    assert {m["adapter"] for m in generalist["overrides"]["environments"]} == {"gen"}


@pytest.mark.parametrize("change, says", [
    (lambda d: d.pop("several"), "has no several: section"),
    (lambda d: d["several"].update(main_split="eval"),
     "grid_split and main_split are both 'eval'"),
    (lambda d: d["several"].update(also_against=["rl"]),
     "several.also_against names ['rl'], not arms of"),
    (lambda d: d["several"].update(lr_grid=[1e-3, 1e-3]), "must hold distinct positive rates"),
])
def test_a_bad_config_is_one_line(tmp_path, change, says):
    data = yaml.safe_load((ROOT / SMOKE).read_text())
    change(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SystemExit) as info:
        bench.load_config(path)
    (line,) = str(info.value).splitlines()
    assert line.startswith("error: ") and says in line


def test_an_adapter_preparation_must_train_an_adapter(tmp_path):
    from miniverl.common.errors import ConfigError
    from miniverl.common.recipe_models import ModelSource
    from miniverl.student.teacher_prep import prepare_model

    prep = tmp_path / "whole.yaml"
    prep.write_text((ROOT / "benchmarks/smoke/several_base.yaml").read_text())
    model = yaml.safe_load(prep.read_text())["student"]["model"]
    with pytest.raises(ConfigError, match="student.lora is null.*set student.lora"):
        prepare_model(prep, ModelSource.model_validate(model), what="several.adapters.calc",
                      adapter=True)
