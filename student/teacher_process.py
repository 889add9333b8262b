"""Start a teacher process (``python -m miniverl.teacher_server``) and wait until it is READY.

The one place a teacher child is started: ``miniverl up``'s supervisor, the
benchmark's default cells (:class:`miniverl.student.benchmark.run.TrainerCells`) and
``benchmarks/opd_cycle.py`` all come here. :func:`teacher_command` is the child's
command line; :func:`wait_until_ready` PINGs the endpoint until ``PONG`` says
``READY`` while watching the child, so a teacher that crashes while loading fails at
once with an error naming its log instead of a timeout (the teacher binds before it
loads, so a loading teacher answers ``LOADING`` and is never mistaken for a dead one);
:func:`start_teacher` does both for a child whose output goes to a log file, and
:func:`stop_teacher` ends one (SIGTERM means ``SHUTDOWN drain``).

The supervisor spawns the child itself (its output is pumped to the console and to
``logs/teacher.stderr.log``) and then calls :func:`wait_until_ready`: no caller uses a
teacher before it answered READY. This module only spawns a process and talks the
wire protocol; it loads no model and imports no torch.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import zmq

from miniverl.common.errors import MiniverlError, TeacherUnavailable
from miniverl.protocol.codec import decode, encode
from miniverl.protocol.messages import Ping, Pong

PING_WAIT_MS = 500  # how long one PING waits for its PONG before the next is sent
STOP_KILL_WAIT_S = 10.0


class StudentExited(MiniverlError):
    """The student process ended while a teacher for it was still starting."""

    def __init__(self, code: int):
        super().__init__(f"the student process exited with code {code} during start-up")
        self.code = code


def teacher_command(args: Sequence[str]) -> list[str]:
    """``python -m miniverl.teacher_server ARGS`` with this interpreter."""
    return [sys.executable, "-m", "miniverl.teacher_server", *args]


def wait_until_ready(
    endpoint: str,
    proc: subprocess.Popen,
    timeout_s: float,
    *,
    log: str | Path,
    also_watch: subprocess.Popen | None = None,
) -> dict[str, Any]:
    """PING ``endpoint`` until ``PONG`` says READY and return that PONG; fail fast if ``proc`` exits.

    ``log`` is where the child's output goes: the error for a child that exits while
    loading names it. ``also_watch`` (the student under ``miniverl up``) ends the wait
    with :class:`StudentExited`: there is no point in a teacher for a student that
    already failed.
    """
    deadline = time.monotonic() + timeout_s
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    rid = 1
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise TeacherUnavailable(
                    f"the teacher process exited with code {proc.returncode} while loading "
                    f"(its output: {log})"
                )
            if also_watch is not None and also_watch.poll() is not None:
                raise StudentExited(also_watch.returncode)
            sock.send_multipart(encode(Ping(id=rid)))
            if sock.poll(PING_WAIT_MS):
                msg, _ = decode(sock.recv_multipart())
                if isinstance(msg, Pong) and msg.state.value == "READY":
                    return msg.model_dump(mode="json")
            rid += 1
        raise TeacherUnavailable(
            f"the teacher at {endpoint} was not READY within {timeout_s:g} s "
            "(runtime.teacher_startup_timeout_s)"
        )
    finally:
        sock.close()


def start_teacher(
    args: Sequence[str],
    *,
    endpoint: str,
    log: str | Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen:
    """Start ``python -m miniverl.teacher_server ARGS --bind ENDPOINT``; return it once READY.

    The child's stdout and stderr are appended to ``log``. A child that does not get
    READY (it exited, or ``timeout_s`` passed) is stopped and the error is raised.
    """
    with Path(log).open("ab") as out:
        proc = subprocess.Popen(
            teacher_command([*args, "--bind", endpoint]),
            stdout=out,
            stderr=out,
            env=None if env is None else dict(env),
        )
    try:
        wait_until_ready(endpoint, proc, timeout_s, log=log)
    except BaseException:
        stop_teacher(proc)
        raise
    return proc


def stop_teacher(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM (``SHUTDOWN drain``), then kill a child that has not exited after ``timeout_s``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_KILL_WAIT_S)
