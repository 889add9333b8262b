"""``--adapters NAME=DIR`` on the command line, and ``teacher status`` listing adapters.

What a user relies on (docs/teacher-server.md, "Several adapters in one process"): a bad
``--adapters`` value (no ``=``, an empty name, a name given twice, a directory that does
not exist or holds no PEFT adapter, more than 64, beside ``--adapter`` or ``--openai``)
is one ``error:`` line naming the value, the rule and the fix, with exit code 1, before
anything binds or loads; ``python -m miniverl.teacher_server`` says the same;
``miniverl teacher status`` prints one line per served adapter.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from miniverl.cli.app import run


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """A folder with a model directory, two adapter-shaped directories (the files' names
    are what is checked before loading) and an empty one."""
    (tmp_path / "model").mkdir()
    for name in ("calc", "chat"):
        adapter = tmp_path / "adapters" / name
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text("{}")
        (adapter / "adapter_model.safetensors").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


SERVE = ["teacher", "serve", "--model", "model", "--device", "cpu"]
CASES = [
    (["--adapters", "calc"], ["'calc' is not NAME=DIR", "e.g. --adapters calc=adapters/calc"]),
    (["--adapters", "calc="], ["'calc=' is not NAME=DIR"]),
    (["--adapters", "=adapters/calc"], ["=adapters/calc", "adapter name '' must be 1-64"]),
    (["--adapters", "../x=adapters/calc"], ["'../x'=adapters/calc", "starting with a letter"]),
    (["--adapters", "calc=adapters/calc", "--adapters", "calc=adapters/chat"],
     ["'calc=adapters/chat'", "given twice", "its own name"]),
    (["--adapters", "calc=adapters/missing"],
     ["calc=adapters/missing", "no such directory", "ORG/NAME@<40-hex>"]),
    (["--adapters", "calc=org/lora"], ["calc=org/lora", "pinned hub id"]),
    (["--adapters", "calc=empty"],
     ["calc=empty", "not a PEFT adapter directory", "adapter_model.safetensors",
      "PeftModel.save_pretrained"]),
    (["--adapter", "adapters/calc", "--adapters", "chat=adapters/chat"],
     ["--adapter adapters/calc", "chat=adapters/chat", "pass one of them"]),
    (["--openai", "127.0.0.1:8000", "--adapters", "chat=adapters/chat"],
     ["--openai 127.0.0.1:8000", "name no adapter"]),
    ([arg for i in range(65) for arg in ("--adapters", f"a{i}=adapters/calc")],
     ["65 adapters", "at most 64"]),
]


@pytest.mark.parametrize(("extra", "mentions"), CASES, ids=[" ".join(c[0])[:40] for c in CASES])
def test_a_bad_adapters_value_is_one_line_and_exit_1(folder, extra, mentions, capsys):
    code = run([*SERVE, *extra])
    captured = capsys.readouterr()
    assert code == 1, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.out + captured.err
    for mention in mentions:
        assert mention in lines[0], lines[0]


@pytest.mark.slow
def test_python_m_teacher_server_says_the_same(folder):
    from miniverl.student.teacher_process import teacher_command

    proc = subprocess.run(
        teacher_command(["--model", "model", "--adapters", "calc=adapters/calc",
                         "--adapters", "calc=adapters/chat"]),
        capture_output=True, text=True, timeout=60, cwd=folder)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: --adapters 'calc=adapters/chat': the name 'calc' is given twice; give each "
        "adapter its own name"
    ]


def test_teacher_status_lists_the_served_adapters(monkeypatch, capsys):
    import miniverl.cli.teacher_cmds as teacher_cmds

    digests = {"calc": "sha256:" + "1" * 64, "chat": "sha256:" + "2" * 64}

    class Admin:
        def status(self):
            return {"state": "READY", "instance": "f" * 32, "gen": 0, "inflight": 0,
                    "queue_depth": 0, "teacher": {"name": "base", "model": "/m/base",
                                                  "revision": None, "adapter_sha256": None},
                    "counters": {}, "memory": {"device": "cpu"},
                    "adapters": [{"name": n, "adapter_sha256": d} for n, d in digests.items()]}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(teacher_cmds, "_admin", lambda *a, **kw: Admin())
    assert run(["teacher", "status", "tcp://127.0.0.1:1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "adapter: calc sha256:111111111111" in out
    assert "adapter: chat sha256:222222222222" in out
