"""The admin token of a teacher process without CURVE (ipc), through the real CLI.

The teacher writes a random token beside its socket (0600) at start; ``miniverl
teacher park|wake|shutdown`` find it there by default, a wrong token file is refused
with one line, and the file is gone once the teacher has stopped.
"""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from tests.toy_kit import MINIVERL, TEACHER, started_teacher, toy_dir

pytestmark = pytest.mark.integration


def _cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*MINIVERL, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout_s)


def test_admin_commands_use_the_token_beside_the_socket(tmp_path):
    # Users rely on: their own admin commands just work; anyone else's are refused.
    with started_teacher(toy_dir(TEACHER), tmp_path) as teacher:
        token = tmp_path / "teacher.admin-token"
        assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
        assert len(token.read_text().strip()) == 64
        wrong = tmp_path / "wrong.admin-token"
        wrong.write_text("00" * 32)
        refused = _cli("teacher", "shutdown", teacher.endpoint, "--admin-token", wrong)
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr.startswith("error: teacher refused SHUTDOWN: UNAUTHORIZED")
        assert len(refused.stderr.strip().splitlines()) == 1
        assert teacher.proc.poll() is None
        parked = _cli("teacher", "park", teacher.endpoint)
        assert (parked.returncode, parked.stdout.strip()) == (0, f"{teacher.endpoint}: PARKED")
        woken = _cli("teacher", "wake", teacher.endpoint)
        assert (woken.returncode, woken.stdout.strip()) == (0, f"{teacher.endpoint}: READY")
        done = _cli("teacher", "shutdown", teacher.endpoint)
        assert done.returncode == 0, done.stderr
        assert teacher.proc.wait(30) == 0
    assert not token.exists()


def test_up_hands_the_token_to_the_student_so_swap_parks(tmp_path):
    # Users rely on: `up` with teacher.memory: swap parks its own teacher, no flags needed.
    import json

    from tests.toy_kit import ONE_TURN, events, recipe_dict, write_recipe

    data = recipe_dict("opd", tmp_path / "runs", cycles=2,
                       sections={"teacher": {"memory": "swap"}, "rollout": ONE_TURN})
    recipe = write_recipe(tmp_path / "swap.yaml", data)
    done = _cli("up", recipe, "--quiet", timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = next((tmp_path / "runs").iterdir())
    assert [e["chosen"] for e in events(run_dir, "memory_strategy")] == ["swap"]
    assert events(run_dir, "memory_swap_refused") == []
    log = [json.loads(line) for line in (run_dir / "logs" / "teacher.log").read_text().splitlines()]
    names = [row["event"] for row in log]
    assert names.count("parked") == 2 and "woken" in names
    assert not any(row.get("code") == "UNAUTHORIZED" for row in log)
