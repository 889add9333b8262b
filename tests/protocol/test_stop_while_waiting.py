"""A stop ends a wait on the teacher at once, and keeps the last checkpoint.

What a user relies on (docs/engine-teachers.md, "What holds as for any teacher", its "Stopping"): SIGTERM or SIGINT while the
student waits on a teacher that never answers — a ZeroMQ teacher holding its SCOREs, an
engine dripping its reply — stops the run within seconds, as ``interrupted``, with the
checkpoint of the last update boundary; a second signal stops the process at once and
the last checkpoint stays. Before, a wait on a dripping engine held two SIGTERMs for
minutes (its timeout bounded each read, not the request).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from miniverl.protocol.scoring_client import StopRequested
from miniverl.testing import FakeTeacher, hold
from tests.extras import require

STOP_WITHIN_S = 2.0


def test_interrupt_ends_a_zmq_wait_on_a_teacher_that_holds_its_scores():
    teacher = FakeTeacher()
    teacher.script(hold())
    with teacher.client(request_timeout_s=600, unavailable_timeout_s=600) as client:
        client.set_version(0)
        rid = client.submit(np.arange(1, 6, dtype=np.int32), [0, 5], [0, 1], k=4)
        threading.Timer(0.3, client.interrupt, args=("stop requested",)).start()
        t0 = time.monotonic()
        with pytest.raises(StopRequested, match="stop requested"):
            client.wait([rid])
        assert time.monotonic() - t0 < STOP_WITHIN_S
        with pytest.raises(StopRequested):  # and every later call
            client.wait([rid])
    # close() returned: nothing the wait started outlived it


def test_a_keyboard_interrupt_in_a_wait_cancels_it_and_close_returns():
    teacher = FakeTeacher()
    teacher.script(hold())
    client = teacher.client(request_timeout_s=600, unavailable_timeout_s=600)
    client.connect()
    client.set_version(0)
    rid = client.submit(np.arange(1, 6, dtype=np.int32), [0, 5], [0, 1], k=4)
    # A real SIGINT (Python's default handler raises KeyboardInterrupt in the main
    # thread, which is blocked in the wait), as a second Ctrl-C delivers it. The default
    # handler is set here: another test in this process may have left the student's
    # stop handler (a first signal only asks to stop) in its place.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            client.wait([rid])
    finally:
        signal.signal(signal.SIGINT, previous)
    t0 = time.monotonic()
    client.close()
    assert time.monotonic() - t0 < STOP_WITHIN_S


def _toy_tokenizer():
    from miniverl.common.modeling import load_tokenizer
    from tests.toy_kit import TEACHER, toy_dir

    return load_tokenizer(toy_dir(TEACHER))


def _engine_recipe(tmp_path: Path, engine) -> dict:
    from miniverl.testing.toy_recipe import recipe_dict

    return recipe_dict("opd", tmp_path / "runs", cycles=2, save_every=1, sections={
        "teacher": {"model": {"path": engine.model}, "endpoint": engine.url,
                    "api": engine.flavour},
        "loss": {"top_k": 4},
        "runtime": {"request_timeout_s": 600, "unavailable_timeout_s": 600}})


def _checkpoint_versions(run_dir: Path) -> list[int]:
    return sorted(json.loads(p.read_text())["version"]
                  for p in (run_dir / "checkpoints").glob("*/state.json"))


@pytest.mark.slow
def test_a_stop_while_an_engine_drips_ends_the_run_interrupted_with_its_checkpoint(tmp_path):
    require("httpx")
    from miniverl.common.recipe import Recipe
    from miniverl.student.train.trainer import Trainer
    from miniverl.testing import HostileEngine

    tok = _toy_tokenizer()
    with HostileEngine(tokenize=lambda t, s: tok.encode(t, add_special_tokens=s),
                       vocab_size=len(tok), behaviour="drip", after=4, drip_s=20) as engine:
        recipe = Recipe.model_validate(_engine_recipe(tmp_path, engine))
        with Trainer(recipe, show_progress=False, write_report=False) as trainer:
            def stop_once_stuck():
                while engine.misbehaved == 0:
                    time.sleep(0.05)
                time.sleep(0.5)
                stopped[0] = time.monotonic()
                trainer.stop_event.set()  # what the first SIGTERM or SIGINT does

            stopped = [0.0]
            threading.Thread(target=stop_once_stuck, daemon=True).start()
            result = trainer.train()
            took = time.monotonic() - stopped[0]
    assert result.status == "interrupted" and result.steps == 1, result
    assert took < 10, took  # the checkpoint and the run's records, not the drip
    assert _checkpoint_versions(result.run_dir) == [1]


@pytest.mark.slow
@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGTERM, signal.SIGTERM],
                                     [signal.SIGINT]], ids=["sigterm", "two_sigterms", "sigint"])
def test_signals_to_miniverl_train_stuck_on_a_dripping_engine(tmp_path, signals):
    require("httpx")
    from miniverl.testing import HostileEngine
    from tests.toy_kit import write_recipe

    tok = _toy_tokenizer()
    with HostileEngine(tokenize=lambda t, s: tok.encode(t, add_special_tokens=s),
                       vocab_size=len(tok), behaviour="drip", after=4, drip_s=20) as engine:
        path = write_recipe(tmp_path / "recipe.yaml", _engine_recipe(tmp_path, engine))
        proc = subprocess.Popen([str(Path(sys.executable).with_name("miniverl")), "train",
                                 str(path)], cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        while engine.misbehaved == 0 and proc.poll() is None:
            time.sleep(0.1)
        time.sleep(1.0)
        t0 = time.monotonic()
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    # The first signal ends the wait and the run (exit 130); a second that lands while
    # the process is already exiting may end it at once (killed by SIGTERM): either way
    # the last checkpoint stays.
    allowed = (130, -signal.SIGTERM) if len(signals) > 1 else (130,)
    assert proc.returncode in allowed and "Traceback" not in out, out[-2000:]
    assert took < 15, took
    run_dir = next((tmp_path / "runs").iterdir())
    assert _checkpoint_versions(run_dir) == [1]  # the first update's, kept


def test_interrupt_cancels_a_handshake_begun_early_and_the_next_connect_meets_the_stop():
    from miniverl.protocol.sync_client import SyncTeacherClient

    # Nothing listens at this endpoint: the early handshake would wait its whole timeout.
    client = SyncTeacherClient("tcp://127.0.0.1:9", tokenizer_fp="fp", vocab_size=32,
                               heartbeat_ms=50)
    try:
        future = client.connect_soon(600)
        client.interrupt("stop requested")
        t0 = time.monotonic()
        while not future.done() and time.monotonic() - t0 < STOP_WITHIN_S:
            time.sleep(0.01)
        assert future.cancelled()
        with pytest.raises(StopRequested):
            client.connect(600)
    finally:
        client.close()
