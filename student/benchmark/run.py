"""Run a matched-budget benchmark: every arm × seed cell, one comparison, resumable.

:func:`run_benchmark` runs every cell of a config
(:mod:`~miniverl.student.benchmark.config`) through an injectable
``run_cell(recipe_dict, seed) -> CellResult`` (the default, :class:`TrainerCells`,
trains with the student trainer, imported when a cell runs), and after each cell
atomically rewrites ``results.json`` (schema-validated
:class:`~miniverl.student.benchmark.results.BenchmarkResults`), ``summary.md`` and
``report.html`` in the output folder. ``resume=True`` keeps the finished cells of an
interrupted benchmark and runs the rest; failed cells run again.

The output folder is ``runs/benchmarks/<name>`` (git-ignored) unless ``output_dir`` names
another; the config's committed ``output_dir`` is written only with ``update_committed``
(:mod:`~miniverl.student.benchmark.outputs`). Each cell's ``run_dir`` is stored relative
to the output folder.

This module does not train anything itself and imports no torch until a default cell
runs. Run with ``miniverl benchmark CONFIG [--resume] [--output-dir DIR |
--update-committed]``.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from miniverl.common.atomic import atomic_write_text
from miniverl.common.clock import utc_now
from miniverl.common.errors import ConfigError
from miniverl.common.recipe import TEACHER_MODES, Recipe
from miniverl.common.recipe_models import ModelSource
from miniverl.common.recipe_paths import anchored
from miniverl.student.benchmark.config import (
    BenchmarkConfig,
    cell_recipe,
    committed_output_dir,
    digest,
    fresh_output_dir,
    load_benchmark_config,
)
from miniverl.student.benchmark.export import collect_environment
from miniverl.student.benchmark.gates import margin_gate, plateau_gate
from miniverl.student.benchmark.html import render_benchmark_html
from miniverl.student.benchmark.outputs import choose_output_dir, refuse_committed, relative_to
from miniverl.student.benchmark.results import (
    BenchmarkResults,
    CellRecord,
    CellResult,
    cell_result_from_run,
    load_results,
)
from miniverl.student.benchmark.stats import summarize, summary_markdown
from miniverl.student.teacher_prep import prepare_model
from miniverl.student.teacher_process import start_teacher, stop_teacher

RunCell = Callable[[dict[str, Any], int], CellResult]


OUTPUTS = ("results.json", "summary.md", "report.html")


def _write_outputs(out_dir: Path, results: BenchmarkResults) -> None:
    BenchmarkResults.model_validate(results.model_dump())  # never publish an invalid file
    atomic_write_text(out_dir / "results.json", results.model_dump_json(indent=2) + "\n")
    atomic_write_text(out_dir / "summary.md", summary_markdown(results))
    atomic_write_text(out_dir / "report.html", render_benchmark_html(results))


def run_benchmark(
    config_path: str | Path,
    *,
    resume: bool = False,
    run_cell: RunCell | None = None,
    output_dir: str | Path | None = None,
    update_committed: bool = False,
    on_cell: Callable[[CellRecord], None] | None = None,
) -> tuple[BenchmarkResults, Path]:
    """Run (or continue) every arm × seed cell; returns the results and the output folder.

    The folder is ``output_dir``, else the config's committed ``output_dir`` when
    ``update_committed``, else ``runs/benchmarks/<name>``; committed files are written
    only when ``update_committed``.
    """
    config, base = load_benchmark_config(config_path)
    out_dir = output_folder(config, output_dir, update_committed=update_committed)
    results_path = out_dir / "results.json"
    config_dump = config.dump()
    config_digest = digest({"config": config_dump, "recipe": base})
    if results_path.exists() and not resume and not update_committed:
        raise ConfigError(
            f"{results_path} already exists (an earlier run); pass --resume to continue it, "
            "or --output-dir DIR for a fresh folder"
        )
    if resume and results_path.exists():
        results = load_results(results_path)
        if results.config_digest != config_digest:
            raise ConfigError(
                f"{results_path} was made by a different config or base recipe "
                f"({results.config_digest[:19]} != {config_digest[:19]}); resume needs the same config, "
                "or start a fresh output_dir"
            )
        results.cells = [c for c in results.cells if c.result.status == "ok"]
        results.complete = False
    else:
        results = BenchmarkResults(
            name=config.name,
            config_digest=config_digest,
            config=config_dump,
            metric=config.metric,
            baseline=config.baseline,
            updated_at=utc_now(),
            environment=collect_environment(),
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    owned = None
    if run_cell is None:
        folder = Path(config_path).resolve().parent
        run_cell = owned = TrainerCells(
            config.teacher_endpoint, out_dir, recipe_dir=(folder / config.recipe).parent,
            student_prepare=folder / config.student_prepare if config.student_prepare else None,
        )
    try:
        if owned is not None and config.student_prepare_band is not None:
            owned.check_student_band(base, config.student_prepare_band)
        if owned is not None and (config.student_prepare_plateau is not None
                                  or config.teacher_margin is not None):
            owned.check_plateau_and_margin(base, plateau=config.student_prepare_plateau,
                                           margin=config.teacher_margin)
        _run_cells(config, base, out_dir, results, run_cell, on_cell)
    finally:
        if owned is not None:
            owned.close()
    results.summary = summarize(results, config)
    results.complete = all(c.result.status == "ok" for c in results.cells)
    results.updated_at = utc_now()
    _write_outputs(out_dir, results)
    return results, out_dir


def output_folder(config: BenchmarkConfig, output_dir: str | Path | None, *,
                  update_committed: bool = False, root: Path | None = None) -> Path:
    """Where a run of ``config`` writes (the config's folders named from ``root``, default
    the working directory); ConfigError before it would rewrite a committed file."""
    root = root or Path()
    out_dir = choose_output_dir(Path(output_dir) if output_dir else None,
                                update_committed=update_committed,
                                committed=root / committed_output_dir(config),
                                fresh=root / fresh_output_dir(config))
    refuse_committed([out_dir / name for name in OUTPUTS], update_committed=update_committed)
    return out_dir


def _run_cells(
    config: BenchmarkConfig,
    base: dict[str, Any],
    out_dir: Path,
    results: BenchmarkResults,
    run_cell: RunCell,
    on_cell: Callable[[CellRecord], None] | None,
) -> None:
    done = {(c.arm, c.seed) for c in results.cells}
    # Seed-major order: an interrupted benchmark still holds complete pairs to compare.
    for seed in config.seeds:
        for arm in config.arms:
            if (arm.name, seed) in done:
                continue
            recipe = cell_recipe(config, base, arm, seed, out_dir)
            try:
                result = run_cell(recipe, seed)
            except Exception as exc:  # one broken cell must not lose the others
                result = CellResult(status="failed", error=f"{type(exc).__name__}: {exc}"[:500])
            if result.run_dir is not None:  # stored relative to the results: no machine path
                result.run_dir = relative_to(result.run_dir, out_dir)
            matched = None
            if (
                config.budget.kind == "updates"
                and result.status == "ok"
                and result.updates is not None
            ):
                matched = result.updates == config.budget.updates
            record = CellRecord(
                arm=arm.name,
                seed=seed,
                recipe_digest=digest(recipe),
                budget_matched=matched,
                finished_at=utc_now(),
                result=result,
            )
            results.cells.append(record)
            results.summary = summarize(results, config)
            results.updated_at = utc_now()
            _write_outputs(out_dir, results)
            if on_cell:
                on_cell(record)


class TrainerCells:
    """The default ``run_cell``: train one recipe with the student trainer.

    Arms that need a teacher use ``teacher_endpoint``; when it is None, one teacher
    process is started for each distinct teacher section the cells name
    (``python -m miniverl.teacher_server --recipe``, READY before the first cell that
    needs it trains), kept for every later cell that names the same section, and
    stopped by :meth:`close`. The teacher is frozen, so every arm and seed with the
    same teacher is scored by the same process; an arm that overrides its teacher gets
    its own. A recipe with several teachers (``teachers:``) gets one process per teacher
    without an ``endpoint`` (``--recipe-teacher NAME``), passed to the trainer by name.

    Prepared models are made once, before the first cell that needs them, and cached
    (``student/teacher_prep.py``): a base recipe's ``teacher.prepare`` (resolved against
    ``recipe_dir``; only for an arm that needs a teacher) and the config's
    ``student_prepare``. Each cell's recipe then names
    the prepared directories (``model.path``), so it says what was trained and served;
    preparation time is not part of any cell's wall time.
    """

    def __init__(self, teacher_endpoint: str | None, work_dir: Path, *,
                 recipe_dir: Path | None = None, student_prepare: Path | None = None):
        self.endpoint = teacher_endpoint
        self.work_dir = work_dir
        self.recipe_dir = recipe_dir or Path.cwd()
        self.student_prepare = student_prepare
        # teacher section digest -> (its process, its endpoint), one per distinct teacher
        self.processes: dict[str, tuple[subprocess.Popen, str]] = {}
        self._prepared: dict[str, Any] = {}  # prep recipe path -> its PreparedModel

    def _prepare(self, prep: Path, model: dict[str, Any], what: str) -> Any:
        """``prep``'s preparation (trained now or found cached), made once per benchmark."""
        key = str(prep.resolve())
        if key not in self._prepared:
            self._prepared[key] = prepare_model(prep, ModelSource.model_validate(model),
                                                what=what, model_field="the base recipe's model")
        return self._prepared[key]

    def _prepared_dir(self, prep: Path, model: dict[str, Any], what: str) -> str:
        return str(self._prepare(prep, model, what).model_dir)

    def check_student_band(self, base: dict[str, Any], band: tuple[float, float]) -> float:
        """The student preparation's held-out success (T=1 when its eval sampled, else
        greedy), prepared now if not cached; ConfigError (one line naming the figure, the
        band and the fix) when it lies outside ``band``. Run before the first cell."""
        assert self.student_prepare is not None
        prepared = self._prepare(self.student_prepare, base["student"]["model"], "student_prepare")
        evaluation = prepared.record.get("eval") or {}
        sampled = evaluation.get("sampled") or {}
        which, value = (("T=1", sampled.get("success")) if sampled
                        else ("greedy", evaluation.get("success")))
        low, high = band
        if value is None or not low <= value <= high:
            shown = "none" if value is None else f"{value:.3f}"
            raise ConfigError(
                f"the student preparation's {which} success is {shown} on "
                f"{evaluation.get('split')} (n={evaluation.get('n')}, "
                f"{prepared.record.get('steps')} SFT steps of {self.student_prepare.name}), "
                f"outside student_prepare_band [{low:g}, {high:g}]; change its train.cycles "
                "in a new commit before any result (fewer steps if above, more if below)")
        return float(value)

    def check_plateau_and_margin(self, base: dict[str, Any], *, plateau: float | None,
                                 margin: float | None) -> dict[str, float]:
        """The two gates of student/benchmark/gates.py on the preparations' records:
        the student preparation's last two validation evaluations within ``plateau``, and
        the base recipe's prepared teacher at least ``margin`` above it (T=1). Each
        prepared now if not cached; ConfigError (one line) when a gate fails. Run before
        the first cell."""
        assert self.student_prepare is not None
        prepared = self._prepare(self.student_prepare, base["student"]["model"], "student_prepare")
        what = f"the student preparation ({self.student_prepare.name})"
        curve = prepared.record.get("evals") or []
        out: dict[str, float] = {}
        if plateau is not None:
            out["plateau"] = plateau_gate(curve, plateau, what)
        if margin is not None:
            scored = [p for p in curve if p.get("t1") is not None]
            level = out.get("plateau", scored[-1]["t1"] if scored else None)
            teacher = base.get("teacher") or {}
            if level is None or not teacher.get("prepare"):
                raise ConfigError(
                    f"teacher_margin needs {what}'s T=1 evaluations and the base recipe's "
                    "teacher.prepare; give both, or set teacher_margin: null")
            record = self._prepare(self.recipe_dir / teacher["prepare"], teacher["model"],
                                   "teacher.prepare").record
            t1 = ((record.get("eval") or {}).get("sampled") or {}).get("success")
            out["margin"] = margin_gate(t1, level, margin,
                                        f"the teacher ({teacher['prepare']})")
        return out

    def with_prepared_models(self, recipe_dict: dict[str, Any]) -> dict[str, Any]:
        """``recipe_dict`` with prepared models as ``model.path`` (prepared on first use),
        and every relative ``model.path`` of its student and launched teachers made
        absolute against the base recipe's folder, as ``load_recipe`` reads a recipe
        file's (common/recipe_paths.py): the teacher process reads a copy elsewhere."""
        recipe = copy.deepcopy(recipe_dict)
        for section in [recipe.get("student"), recipe.get("teacher"),
                        *(recipe.get("teachers") or {}).values()]:
            if not isinstance(section, dict) or not isinstance(section.get("model"), dict):
                continue
            engine = str(section.get("endpoint") or "").startswith(("http://", "https://"))
            if isinstance(section["model"].get("path"), str) and not engine:
                section["model"]["path"] = os.path.normpath(anchored(
                    self.recipe_dir.resolve(), section["model"]["path"]))
        teacher = recipe.get("teacher")
        # sft arms need none, but a SeqKD arm (train.fixed_set: teacher) plays with the
        # teacher's weights itself; read before validating, which refuses an unprepared one.
        mode = (recipe_dict.get("run") or {}).get("mode")
        seqkd = (recipe_dict.get("train") or {}).get("fixed_set") == "teacher"
        named = recipe.get("teachers") if isinstance(recipe.get("teachers"), dict) else {}
        sections = {"teacher": teacher, **{f"teachers.{n}": t for n, t in named.items()}}
        for where, section in sections.items():
            if ((mode in TEACHER_MODES or seqkd) and isinstance(section, dict)
                    and section.get("prepare")):
                prep = self.recipe_dir / section.pop("prepare")
                section["model"] = {"path": self._prepared_dir(prep, section["model"],
                                                               f"{where}.prepare")}
        if self.student_prepare is not None:
            student = recipe["student"]
            student["model"] = {"path": self._prepared_dir(
                self.student_prepare, student["model"], "student_prepare")}
        return recipe

    def _served(self, recipe_dict: dict[str, Any], name: str | None,
                startup_timeout_s: float) -> str:
        """The endpoint of the process serving ``recipe_dict``'s teacher (``name``: its
        teacher of ``teachers:``), started now unless a process already serves that
        very section."""
        section = recipe_dict["teachers"][name] if name else recipe_dict["teacher"]
        key = digest(section)
        if key in self.processes:
            return self.processes[key][1]
        with socket.socket() as probe:  # a free loopback port for this teacher
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        endpoint = f"tcp://127.0.0.1:{port}"
        # The first teacher keeps the plain names; another gets its own files.
        tag = "" if not self.processes else f"-{name or 'teacher'}-{len(self.processes)}"
        recipe_path = self.work_dir / f"teacher_recipe{tag}.yaml"
        recipe_path.write_text(yaml.safe_dump(recipe_dict, sort_keys=False), encoding="utf-8")
        args = ["--recipe", str(recipe_path), "--log", str(self.work_dir / f"teacher{tag}.log")]
        if name:
            args += ["--recipe-teacher", name]
        process = start_teacher(args, endpoint=endpoint,
                                log=self.work_dir / f"teacher{tag}.stderr",
                                timeout_s=startup_timeout_s)
        self.processes[key] = (process, endpoint)
        return endpoint

    def __call__(self, recipe_dict: dict[str, Any], seed: int) -> CellResult:
        # start-up: the trainer imports torch, needed only when a default cell trains
        from miniverl.student.train.trainer import Trainer

        recipe_dict = self.with_prepared_models(recipe_dict)
        recipe = Recipe.model_validate(recipe_dict)
        endpoint, endpoints = self.endpoint, None
        timeout = recipe.runtime.teacher_startup_timeout_s
        if recipe.needs_teacher and recipe.teachers is not None:
            endpoints = {name: section.endpoint or self._served(recipe_dict, name, timeout)
                         for name, section in recipe.teachers.items()}
        elif recipe.needs_teacher and endpoint is None and recipe.teacher.endpoint is None:
            endpoint = self._served(recipe_dict, None, timeout)
        start = time.perf_counter()
        with Trainer(recipe, teacher_endpoint=endpoint, teacher_endpoints=endpoints,
                     show_progress=False) as trainer:
            result = trainer.train()
        wall = time.perf_counter() - start
        return cell_result_from_run(
            result.run_dir,
            wall_s=wall,
            final_version=result.final_version,
            status="ok" if result.status == "completed" else "failed",
        )

    def close(self) -> None:
        for process, _ in self.processes.values():
            stop_teacher(process)
        self.processes = {}
