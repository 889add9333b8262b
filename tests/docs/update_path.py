"""Record the functions one strict OPD update runs, for docs/architecture.md's reading path.

:func:`record_update` trains a toy student by strict OPD (pipelined, a resident teacher,
``run.deterministic: true``, top-k + tail targets) against the real teacher server
around the toy teacher model (``miniverl.testing.TeacherHarness`` with the torch
backend: admission, batcher, scoring; in-memory connections instead of sockets), with
``sys.setprofile`` and ``threading.setprofile`` recording every call of miniverl's own
functions. It returns, for the second update (the first warms caches), the functions in
the order of their first call, per thread role: ``student`` (the training thread),
``client`` (the client's event loop: the wire in and out) and ``teacher`` (the server's
threads). Comprehensions, lambdas, generator expressions and nested functions are left
out: they are lines of the function that holds them.

``python -m tests.docs.update_path`` prints the recording (to write the page from).
Not a test module: pytest collects nothing here.
"""

from __future__ import annotations

import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import miniverl.student

PACKAGE = Path(miniverl.student.__file__).resolve().parents[1]  # the package's root folder
ROLES = ("student", "client", "teacher")


def _name(code: Any) -> str | None:
    """``module.qualname`` of a miniverl function's code object (None: not ours, or a
    comprehension, lambda or generator expression)."""
    path = Path(code.co_filename)
    if path.suffix != ".py" or not path.is_relative_to(PACKAGE):
        return None
    if code.co_name.startswith("<") or "<locals>" in code.co_qualname:
        return None  # a comprehension, lambda or nested function: lines of its holder
    module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    return f"{module.removesuffix('.__init__')}.{code.co_qualname}"


class Recorder:
    """Every call of a miniverl function: ``(sequence, thread id, name)``, and the calls
    and returns of the mode's cycle on the training thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, str]] = []
        self.cycles: list[tuple[int, int]] = []  # (start, end) sequence of each OPD cycle
        self._open: int | None = None
        self._lock = threading.Lock()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        name = _name(frame.f_code)
        if name is None:
            return
        with self._lock:
            seq = len(self.calls)
            if event == "call":
                self.calls.append((seq, threading.get_ident(), name))
            if name == "student.train.modes.opd.OpdMode.cycle":
                if event == "call":
                    self._open = seq
                elif self._open is not None:
                    self.cycles.append((self._open, len(self.calls)))
                    self._open = None

    def window(self, n: int) -> list[tuple[int, int, str]]:
        """The calls made while update ``n`` (0-based) ran, on any thread."""
        start, end = self.cycles[n]
        return self.calls[start:end]


def first_calls(calls: list[tuple[int, int, str]], main: int) -> dict[str, list[str]]:
    """Per role, the names in the order of their first call. A thread that ran any
    ``teacher_server`` function is the teacher's; ``main`` is the student's; any other
    thread is the client's."""
    by_thread: dict[int, list[str]] = defaultdict(list)
    for _, thread, name in calls:
        by_thread[thread].append(name)
    out: dict[str, list[str]] = {role: [] for role in ROLES}
    seen: dict[str, set[str]] = {role: set() for role in ROLES}
    roles = {thread: ("student" if thread == main else
                      "teacher" if any(n.startswith("teacher_server.") for n in names)
                      else "client")
             for thread, names in by_thread.items()}
    for _, thread, name in calls:
        role = roles[thread]
        if name not in seen[role]:
            seen[role].add(name)
            out[role].append(name)
    return out


def record_update(tmp: Path) -> dict[str, list[str]]:
    """Train two strict OPD updates as the module docstring says; the second's calls."""
    from miniverl.student.train.trainer import Trainer
    from miniverl.teacher_server.loader import TeacherSpec, load_teacher
    from miniverl.teacher_server.torch_backend import TorchTeacher
    from miniverl.testing import TeacherHarness
    from tests.toy_kit import TEACHER, make_recipe, toy_dir

    loaded = load_teacher(TeacherSpec(model=str(toy_dir(TEACHER)), dtype="float32",
                                      device="cpu"))
    backend = TorchTeacher(loaded, exact_max_vocab=1 << 20, max_batch_tokens=1 << 14)
    recipe = make_recipe("opd", tmp, cycles=2, pipelining=True,
                         sections={"loss": {"divergence": "reverse_kl"},
                                   "eval": {"before": False, "max_tasks": 1}})
    recorder = Recorder()
    # Before the harness and the client start their threads: threading.setprofile
    # reaches only threads started after it.
    threading.setprofile(recorder)
    sys.setprofile(recorder)
    try:
        with TeacherHarness(backend) as harness:
            # No heartbeat inside the update: a PING and its PONG would interleave with
            # the SCOREs at random; a lost request is resent after a minute, not 0.5 s.
            client = harness.client(heartbeat_ms=60_000, request_timeout_s=60.0,
                                    unavailable_timeout_s=600.0)
            with Trainer(recipe, client=client, show_progress=False,
                         write_report=False, checkpoints=False) as trainer:
                trainer.train()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    if len(recorder.cycles) < 2:
        raise RuntimeError(f"recorded {len(recorder.cycles)} OPD updates, wanted 2")
    return first_calls(recorder.window(1), threading.main_thread().ident)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for role, names in record_update(Path(folder)).items():
            print(f"## {role}")
            for name in names:
                print(name)
