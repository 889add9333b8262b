"""``miniverl up`` with an engine server as the teacher: it attaches, starts no teacher.

What a user relies on (docs/engine-student.md): a recipe whose ``teacher.endpoint`` is a
vLLM or SGLang server's ``http://`` URL runs under ``miniverl up`` as under ``miniverl
train``: the student reaches the server itself, ``up`` starts no teacher process and
the run completes its updates. The server here is ``miniverl.testing.HostileEngine``
answering honestly in each shape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.extras import require

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_up_attaches_to_an_engine_teacher_and_completes(tmp_path, flavour):
    require("httpx")
    from miniverl.common.modeling import load_tokenizer
    from miniverl.testing import HostileEngine
    from miniverl.testing.toy_recipe import recipe_dict
    from tests.toy_kit import TEACHER, toy_dir, write_recipe

    tok = load_tokenizer(toy_dir(TEACHER))
    with HostileEngine(tokenize=lambda t, s: tok.encode(t, add_special_tokens=s),
                       vocab_size=len(tok), flavour=flavour) as engine:
        recipe = recipe_dict("opd", tmp_path / "runs", cycles=2, sections={
            "teacher": {"model": {"path": engine.model}, "endpoint": engine.url,
                        "api": engine.flavour},
            "loss": {"top_k": 4}})
        path = write_recipe(tmp_path / "recipe.yaml", recipe)
        done = subprocess.run(
            [str(Path(sys.executable).with_name("miniverl")), "up", str(path), "--quiet"],
            cwd=tmp_path, text=True, capture_output=True, timeout=600,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        scored = [r for r, _ in engine.requests if r in ("/v1/completions", "/generate")]
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = next((tmp_path / "runs").iterdir())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    [connected] = [e for e in events if e["event"] == "teacher_connected"]
    assert connected["endpoint"] == engine.url
    assert events[-1]["event"] == "run_completed" and events[-1]["version"] == 2
    assert not (run_dir / "logs" / "teacher.log").exists()  # up started no teacher
    assert scored  # the student's SCOREs went to the engine
