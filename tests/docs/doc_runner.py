"""Run a page's ``run`` blocks in order, in one scratch working copy, each under a limit.

A page gets a fresh directory holding copies of ``recipes/``, ``examples/`` and
``benchmarks/`` (without its results), so ``miniverl up recipes/toy_cpu_opd.yaml`` and
``cd examples/testing`` mean what they mean at the repository root, and nothing a
block writes reaches the checkout. Blocks of one page share that directory and run in
page order, so a later block sees what an earlier one wrote. A shell block runs under
``bash -e -o pipefail``, a Python block under ``python -c`` (the directory is on
``sys.path`` as at a REPL). ``miniverl`` is on ``PATH`` and ``MINIVERL_CACHE`` is the
session's (tests/conftest.py), so toy models are built once per test session.

Each block runs in its own process group: past its limit the whole group is killed,
and whatever a block left running in the background (a teacher for the next block) is
ended when the page is done.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.docs.doc_blocks import Block, parse_page
from tests.docs.doc_checks import check_commands, check_python, check_yaml
from tests.extras import missing

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("recipes", "examples", "benchmarks")
NOT_COPIED = shutil.ignore_patterns("results", "__pycache__", ".pytest_cache", "*.pyc")
OUTPUT_TAIL_CHARS = 3000


def working_copy(dest: Path) -> Path:
    """``dest`` with copies of the folders documented commands name; returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, dest / name, ignore=NOT_COPIED)
    return dest


def block_env() -> dict[str, str]:
    """The environment of a block: ours, with this interpreter's ``miniverl`` first on PATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class PageRunner:
    """Runs blocks of one page in ``cwd``; ``close()`` ends what they left running."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.groups: list[int] = []
        self.timings: list[tuple[str, float]] = []

    def __enter__(self) -> PageRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, block: Block) -> str | None:
        """Run ``block``; None when it passed, else why it failed (with its output)."""
        assert block.marker is not None and block.marker.kind == "run"
        if block.kind == "shell":
            argv = ["bash", "-e", "-o", "pipefail", "-c", block.text]
        else:
            argv = [sys.executable, "-c", block.text]
        log = self.cwd.parent / f"{self.cwd.name}-block-{block.line}.log"
        started = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env=block_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.groups.append(proc.pid)
            try:
                code = proc.wait(timeout=block.marker.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        seconds = time.monotonic() - started
        self.timings.append((block.where, seconds))
        output = log.read_text(encoding="utf-8", errors="replace")
        tail = output[-OUTPUT_TAIL_CHARS:]
        if code is None:
            return f"still running after its {block.marker.timeout_s:g} s limit; output:\n{tail}"
        if code != 0:
            return f"exited {code} after {seconds:.1f} s; output:\n{tail}"
        missing = [text for text in block.marker.expect if text not in output]
        if missing:
            return f"output lacks {missing} (expect=); output:\n{tail}"
        return None

    def close(self) -> None:
        """End every process group a block started (a background server, say)."""
        for pgid in self.groups:
            _kill_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for pgid in self.groups:
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
            _kill_group(pgid, signal.SIGKILL)
        self.groups.clear()


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    """A live (not zombie) process is in group ``pgid``; without /proc, any process."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":  # state, ppid, pgrp
            return True
    return False


def check_block(block: Block, cwd: Path, runner: PageRunner) -> list[str]:
    """Why ``block`` fails as its marker says to check it (empty: it passes)."""
    marker = block.marker
    if marker is None or marker.kind == "skip":
        return []
    if marker.kind == "run":
        failure = runner.run(block)
        return [failure] if failure else []
    if block.kind == "python":
        return check_python(block)
    if block.kind == "yaml":
        return check_yaml(block, cwd)
    return check_commands(block.text, cwd, listing=block.kind == "listing")


def missing_needs(page: Path) -> list[str]:
    """Why each ``run`` block of ``page`` whose ``needs=`` module does not import here is
    not run (tests/extras.missing: the reason names the extra and its install line)."""
    return [f"run {b.where}: {reason}" for b in parse_page(page).blocks
            if b.marker and b.marker.kind == "run"
            for reason in map(missing, b.marker.needs) if reason]


def page_failures(page: Path, scratch: Path) -> list[str]:
    """Run and check every marked block of ``page`` in a working copy under ``scratch``.

    Once a ``run`` block fails, the page's later ``run`` blocks are not run (they may
    depend on it); ``check-only`` blocks are still checked. A ``run`` block whose
    ``needs=`` module does not import here is left out (:func:`missing_needs` says why).
    """
    blocks = [b for b in parse_page(page).blocks if b.marker and b.marker.kind != "skip"
              and not any(map(missing, b.marker.needs))]
    if not blocks:
        return []
    cwd = working_copy(scratch / "work")
    failures: list[str] = []
    run_failed = False
    with PageRunner(cwd) as runner:
        for block in blocks:
            if block.marker.kind == "run" and run_failed:
                failures.append(f"run {block.where}: not run, an earlier block of the page failed")
                continue
            problems = check_block(block, cwd, runner)
            run_failed = run_failed or (block.marker.kind == "run" and bool(problems))
            failures += [f"{block.marker.kind} {block.where}: {problem}" for problem in problems]
    return failures
