"""The tests' toy kit: tiny model shapes, a tiny recipe builder and a started teacher.

Shapes are plain dicts (a recipe's ``model.toy`` section, or ``ToySpec(**shape)``),
named by what the tests use them for; their values are fixed on purpose, since
results, timings and the session's toy-model cache all depend on them. Beside them:
``toy_dir`` (the cached model directory), ``bare_qwen3`` (a tokenizer-less model for
numerics), ``alien_tokenizer_copy`` (a model another tokenizer fingerprint guards) and
the calculator tool schema. The recipe builder (``recipe_dict``, ``make_recipe``) makes
the few-second recipe the trainer tests share, with keyword overrides for the rest (it
and the ``STUDENT``/``TEACHER`` shapes come from ``miniverl.testing.toy_recipe``, which
the benchmarks build their runs from too); ``metrics``/``events`` read a run's
rows back. ``started_teacher`` runs a real ``python -m miniverl.teacher_server`` child
through ``miniverl.student.teacher_process`` and hands it over only once it answered
READY.

Not a test module (pytest collects nothing here), no fixtures and no fakes (those live
beside the tests that use them): import what you need as ``from tests.toy_kit import
...``. torch, transformers and miniverl are imported inside the functions (but for that
plain-dict module).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The trainer tests' pair of shapes (a 32-wide STUDENT, a 48-wide TEACHER) and the recipe
# builder live in miniverl.testing, which the benchmarks share; tests import them here.
from miniverl.testing.toy_recipe import STUDENT, TEACHER, recipe_dict  # noqa: F401

# -- shapes -----------------------------------------------------------------------------

# The student's shape without a seed: `up` and memory tests run student and teacher on
# it with different seeds (same tokenizer, other weights).
TWO_LAYER = {"hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 64}
# The cheapest model: teachers that are served, scored or loaded, not trained.
ONE_LAYER = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64}
# Grouped-query attention with two groups: generation, rollouts and scoring numerics.
FOUR_HEAD = {"hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64}
# 64 wide (the toy default): the 4-bit (nf4) student tests.
WIDE = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128}


def seeded(shape: Mapping[str, int], seed: int) -> dict[str, int]:
    """``shape`` with its initialisation seed set (other weights, same tokenizer)."""
    return {**shape, "seed": seed}


def toy_spec(shape: Mapping[str, int], seed: int | None = None):
    """The ``ToySpec`` of ``shape`` (its own seed, or ``seed``, or the default 0)."""
    from miniverl.common.recipe_models import ToySpec

    return ToySpec(**(dict(shape) if seed is None else seeded(shape, seed)))


def toy_dir(shape: Mapping[str, int], seed: int | None = None) -> Path:
    """The cached model directory (weights + toy tokenizer) of ``shape``; built on first use."""
    from miniverl.common.toy import toy_model_dir

    return toy_model_dir(toy_spec(shape, seed))


_QWEN3_NAMES = {"hidden": "hidden_size", "intermediate": "intermediate_size",
                "layers": "num_hidden_layers", "heads": "num_attention_heads",
                "kv_heads": "num_key_value_heads"}


def bare_qwen3(shape: Mapping[str, int], *, vocab: int, max_positions: int):
    """A ``Qwen3ForCausalLM`` of ``shape`` over ``vocab`` ids, no tokenizer, untied head.

    Initialised from torch's global RNG: the caller seeds it (``torch.manual_seed``).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sizes = {config_name: shape[toy_name] for toy_name, config_name in _QWEN3_NAMES.items()}
    config = Qwen3Config(vocab_size=vocab, head_dim=shape["hidden"] // shape["heads"],
                         max_position_embeddings=max_positions, **sizes)
    return Qwen3ForCausalLM(config)


def alien_tokenizer_copy(model_dir: Path, dest: Path) -> Path:
    """A copy of ``model_dir`` whose chat template has one more comment.

    Same weights, another tokenizer fingerprint: every swap or reload to it must be
    refused.
    """
    shutil.copytree(model_dir, dest)
    template = dest / "chat_template.jinja"
    if template.exists():
        template.write_text(template.read_text() + "{# another template #}")
    else:
        config = json.loads((dest / "tokenizer_config.json").read_text())
        config["chat_template"] = config.get("chat_template", "") + "{# another template #}"
        (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


# The calculator tool as a chat template receives it.
CALCULATOR_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]

# One short turn per episode: process start-up, not generation, dominates these runs.
ONE_TURN = {"max_turns": 1, "max_new_tokens_per_turn": 8, "max_total_tokens": 512}

# -- recipes ----------------------------------------------------------------------------


def make_recipe(mode: str, output_dir: Path | str, **kw: Any):
    """:func:`recipe_dict`, validated into a ``Recipe``."""
    from miniverl.common.recipe import Recipe

    return Recipe.model_validate(recipe_dict(mode, output_dir, **kw))


def write_recipe(path: Path, data: Mapping[str, Any]) -> Path:
    """Write a recipe dict as YAML (in the order it was built) and return ``path``."""
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """A finished run's ``metrics.jsonl`` rows."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(run_dir: Path, name: str | None = None) -> list[dict[str, Any]]:
    """A finished run's ``events.jsonl`` rows, only those named ``name`` if given."""
    path = Path(run_dir) / "events.jsonl"
    rows = [json.loads(line) for line in path.read_text().split("\n") if line.strip()]
    return [r for r in rows if name is None or r["event"] == name]


# -- a started teacher ------------------------------------------------------------------

TEACHER_WAIT_S = 240.0  # generous: the CI machine is small and often shared
MINIVERL = [sys.executable, "-c", "from miniverl.cli.app import main; main()"]
_CHILD_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class ServedTeacher:
    """A teacher child process: where it listens and where its two logs go."""

    endpoint: str
    proc: subprocess.Popen
    out: Path  # the child's stdout and stderr
    log: Path  # its JSON-lines event log (``--log``)

    def wait_ready(self, timeout_s: float = TEACHER_WAIT_S) -> dict[str, Any]:
        """Block until it answers READY; returns that PONG. Fails at once if it exits."""
        from miniverl.student.teacher_process import wait_until_ready

        return wait_until_ready(self.endpoint, self.proc, timeout_s, log=self.out)

    def stop(self) -> None:
        """SIGTERM (``SHUTDOWN drain``), then SIGKILL if it lingers; no-op once exited."""
        from miniverl.student.teacher_process import stop_teacher

        stop_teacher(self.proc)

    def events(self) -> list[str]:
        """The event names of its JSON-lines log, in order."""
        return [json.loads(line)["event"] for line in self.log.read_text().splitlines()]


def _teacher_paths(folder: Path, name: str, endpoint: str | None) -> tuple[str, Path, Path]:
    return endpoint or f"ipc://{folder}/{name}.sock", folder / f"{name}.out", folder / f"{name}.log"


def _teacher_args(model_dir: Path | str, log: Path, extra: Sequence[str]) -> list[str]:
    return ["--model", str(model_dir), "--device", "cpu", "--threads", "1", "--log", str(log),
            *extra]


def spawn_teacher(
    model_dir: Path | str,
    folder: Path,
    name: str = "teacher",
    *,
    endpoint: str | None = None,
    extra: Sequence[str] = (),
    cli: bool = False,
) -> ServedTeacher:
    """Start a teacher on ``model_dir`` without waiting for it (call ``wait_ready``).

    For starts that overlap other work; ``cli=True`` runs ``miniverl teacher serve``
    instead of ``python -m miniverl.teacher_server``. The endpoint defaults to
    ``ipc://FOLDER/NAME.sock``; output goes to ``NAME.out``, events to ``NAME.log``.
    """
    from miniverl.student.teacher_process import teacher_command

    endpoint, out, log = _teacher_paths(folder, name, endpoint)
    args = [*_teacher_args(model_dir, log, extra), "--bind", endpoint]
    cmd = [*MINIVERL, "teacher", "serve", *args] if cli else teacher_command(args)
    with out.open("ab") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=sink, env={**os.environ, **_CHILD_ENV})
    return ServedTeacher(endpoint, proc, out, log)


@contextlib.contextmanager
def started_teacher(
    model_dir: Path | str,
    folder: Path,
    name: str = "teacher",
    *,
    extra: Sequence[str] = (),
    cli: bool = False,
    timeout_s: float = TEACHER_WAIT_S,
) -> Iterator[ServedTeacher]:
    """A READY teacher on ``model_dir`` (CPU, one thread), stopped on exit.

    ``python -m miniverl.teacher_server`` is started through
    ``teacher_process.start_teacher``; ``cli=True`` serves with ``miniverl teacher
    serve`` instead. ``extra`` adds command-line flags (``--dtype float32``...). It
    listens on ``ipc://FOLDER/NAME.sock``; other paths are as in :func:`spawn_teacher`.
    """
    from miniverl.student.teacher_process import start_teacher

    if cli:
        teacher = spawn_teacher(model_dir, folder, name, extra=extra, cli=True)
        try:
            teacher.wait_ready(timeout_s)
        except BaseException:
            teacher.stop()
            raise
    else:
        endpoint, out, log = _teacher_paths(folder, name, None)
        proc = start_teacher(_teacher_args(model_dir, log, extra), endpoint=endpoint, log=out,
                             timeout_s=timeout_s, env={**os.environ, **_CHILD_ENV})
        teacher = ServedTeacher(endpoint, proc, out, log)
    try:
        yield teacher
    finally:
        teacher.stop()
