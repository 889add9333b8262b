"""A toy student's `miniverl train` against each misbehaviour of a hostile engine (issue 40).

For every behaviour of ``miniverl.testing.HostileEngine`` (and both flavours), one strict
OPD run (top-4, the toy recipe, two cycles of four trajectories) whose teacher is the
engine: the first cycle's four scoring requests are answered honestly, then the engine
misbehaves. Recorded per run: the exit code, the one line the student printed last on
stderr, the updates made (``metrics.jsonl`` rows), the run's status, and the version of
the last checkpoint. "No update from a bad reply" is: exactly one update (the honest
cycle's) and a checkpoint at version 1.

Then the signal scenarios: a student stuck on a teacher that drips its answer one byte
every 20 s (``runtime.request_timeout_s: 600``, so no deadline frees it), and one whose
ZeroMQ teacher holds every SCORE (a ``miniverl teacher serve`` stopped with SIGSTOP),
sent one SIGTERM, two SIGTERMs, or one SIGINT after its first update: the seconds until
it exited, its exit code, and the checkpoint it kept.

Run:  python benchmarks/hostile_engine_runs.py [--only vllm:positive_logprobs ...]
Writes ``hostile_engine_runs.json`` in ``--output-dir`` (default
``runs/benchmarks/hostile_engine_runs/``; the committed
``benchmarks/results/hostile_engine_runs.json`` with ``--update-committed``). About ten
minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "benchmarks" / "results" / "hostile_engine_runs.json"
sys.path.insert(0, str(ROOT))

from miniverl.student.benchmark.outputs import add_output_options, script_output_file  # noqa: E402
from miniverl.testing import HOSTILE_BEHAVIOURS, HostileEngine  # noqa: E402
from miniverl.testing.toy_recipe import TEACHER, recipe_dict  # noqa: E402
from tests.toy_kit import toy_dir, write_recipe  # noqa: E402

# The console script beside this interpreter (what a user runs).
MINIVERL = str(Path(sys.executable).with_name("miniverl"))
K = 4
HONEST_REQUESTS = 4  # one cycle: four trajectories, one request each
# The list first; the rest of the engine's repertoire after.
BEHAVIOURS = ["positive_logprobs", "huge", "drip", "out_of_vocab", "model_changed",
              "nan_logprob", "short", "missing_actual", "http_500",
              *[b for b in HOSTILE_BEHAVIOURS if b not in (
                  "honest", "positive_logprobs", "huge", "drip", "out_of_vocab",
                  "model_changed", "nan_logprob", "short", "missing_actual", "http_500")]]
SGLANG = ["positive_logprobs", "mass_over_one", "short", "out_of_vocab", "huge",
          "duplicate_ids", "deep_nesting"]


def tokenizer():
    from miniverl.common.modeling import load_tokenizer

    return load_tokenizer(toy_dir(TEACHER))


def engine_recipe(work: Path, engine: HostileEngine, **runtime: Any) -> Path:
    data = recipe_dict("opd", work / "runs", cycles=2, save_every=1, sections={
        "teacher": {"model": {"path": engine.model}, "endpoint": engine.url,
                    "api": engine.flavour},
        "loss": {"top_k": K},
        "runtime": {"request_timeout_s": 2, "unavailable_timeout_s": 20, **runtime}})
    return write_recipe(work / "recipe.yaml", data)


def run_dir(work: Path) -> Path:
    return next((work / "runs").iterdir())


def outcome(work: Path, proc: subprocess.CompletedProcess | None, stderr: str,
            code: int) -> dict[str, Any]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    out: dict[str, Any] = {"exit_code": code, "line": lines[-1] if lines else "",
                           "traceback": "Traceback" in stderr}
    try:
        path = run_dir(work)
    except (StopIteration, FileNotFoundError):
        out["output"] = stderr[-2000:]
        return out
    rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()
            if x.strip()] if (path / "metrics.jsonl").exists() else []
    status = json.loads((path / "status.json").read_text()) if (path / "status.json").exists() \
        else {}
    ckpts = sorted((path / "checkpoints").glob("*/state.json")) \
        if (path / "checkpoints").exists() else []
    versions = [json.loads(p.read_text()).get("version") for p in ckpts]
    out.update(updates=len([r for r in rows if "loss" in r]), status=status.get("status"),
               checkpoint_versions=versions)
    return out


def train(work: Path, timeout_s: float = 300) -> tuple[str, int]:
    proc = subprocess.run([MINIVERL, "train", str(work / "recipe.yaml")],
                          capture_output=True, text=True, timeout=timeout_s, cwd=work,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc.stderr + proc.stdout, proc.returncode


def hostile_run(flavour: str, behaviour: str, tok) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, HostileEngine(
            tokenize=lambda text, special: tok.encode(text, add_special_tokens=special),
            vocab_size=len(tok), flavour=flavour, behaviour=behaviour,
            after=HONEST_REQUESTS) as engine:
        work = Path(tmp)
        engine_recipe(work, engine)
        t0 = time.monotonic()
        text, code = train(work)
        out = outcome(work, None, text, code)
        out.update(seconds=round(time.monotonic() - t0, 1), misbehaved=engine.misbehaved,
                   scored=engine.scored)
        out["line"] = out["line"].replace(engine.url, "http://HOST:PORT")
    return out


def signal_run(signals: list[int], tok) -> dict[str, Any]:
    """A student stuck on a dripping engine after its first update, then ``signals``."""
    with tempfile.TemporaryDirectory() as tmp, HostileEngine(
            tokenize=lambda text, special: tok.encode(text, add_special_tokens=special),
            vocab_size=len(tok), behaviour="drip", after=HONEST_REQUESTS,
            drip_s=20.0) as engine:
        work = Path(tmp)
        engine_recipe(work, engine, request_timeout_s=600)
        proc = subprocess.Popen([MINIVERL, "train",
                                 str(work / "recipe.yaml")], cwd=work, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        while engine.misbehaved == 0 and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(2.0)  # well inside the wait
        t0 = time.monotonic()
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.2)
        try:
            text, _ = proc.communicate(timeout=120)
            took = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            took = None
        out = outcome(work, None, text, proc.returncode)
        out.update(signals=[signal.Signals(s).name for s in signals],
                   exit_s=None if took is None else round(took, 2),
                   printed=[line for line in text.splitlines() if "stopping" in line
                            or line.startswith(("run ", "updates"))])
    return out


def zmq_signal_run(signals: list[int]) -> dict[str, Any]:
    """A student whose ZeroMQ teacher stops answering (SIGSTOP) after the first update,
    with ``runtime.unavailable_timeout_s`` at 600 s (so nothing else frees it), then
    ``signals``."""
    from miniverl.student.teacher_process import start_teacher, stop_teacher

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "t").mkdir(mode=0o700)
        endpoint = f"ipc://{work}/t/teacher.sock"
        teacher = start_teacher(["--model", str(toy_dir(TEACHER)), "--device", "cpu",
                                 "--threads", "1"], endpoint=endpoint,
                                log=work / "teacher.log", timeout_s=180)
        try:
            data = recipe_dict("opd", work / "runs", cycles=2, save_every=1, sections={
                "teacher": {"endpoint": endpoint}, "loss": {"top_k": K},
                "runtime": {"request_timeout_s": 600, "unavailable_timeout_s": 600}})
            write_recipe(work / "recipe.yaml", data)
            proc = subprocess.Popen([MINIVERL, "train", str(work / "recipe.yaml")], cwd=work,
                                    text=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            metrics = None
            while proc.poll() is None:
                found = list((work / "runs").glob("*/metrics.jsonl"))
                metrics = found[0] if found else None
                if metrics is not None and '"loss"' in metrics.read_text():
                    break
                time.sleep(0.05)
            teacher.send_signal(signal.SIGSTOP)  # the teacher hangs: no reply, no heartbeat
            time.sleep(3.0)
            t0 = time.monotonic()
            for sig in signals:
                proc.send_signal(sig)
                time.sleep(0.2)
            try:
                text, _ = proc.communicate(timeout=120)
                took = time.monotonic() - t0
            except subprocess.TimeoutExpired:
                proc.kill()
                text, _ = proc.communicate()
                took = None
        finally:
            teacher.send_signal(signal.SIGCONT)
            stop_teacher(teacher)
        out = outcome(work, None, text, proc.returncode)
        out.update(signals=[signal.Signals(s).name for s in signals],
                   exit_s=None if took is None else round(took, 2),
                   printed=[line for line in text.splitlines() if "stopping" in line
                            or line.startswith(("run ", "updates"))])
    return out


def children(pid: int) -> dict[int, str]:
    """This script's grandchildren by pid: ``{pid: command line}`` of ``pid``'s children."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(
                    b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
    return out


def up_signal_run() -> dict[str, Any]:
    """``miniverl up`` on the toy recipe; after the first update its teacher is stopped
    (SIGSTOP: alive, silent) and ``up`` gets one SIGINT (a Ctrl-C)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = recipe_dict("opd", work / "runs", cycles=2, save_every=1, sections={
            "loss": {"top_k": K},
            "runtime": {"request_timeout_s": 600, "unavailable_timeout_s": 600}})
        write_recipe(work / "recipe.yaml", data)
        proc = subprocess.Popen([MINIVERL, "up", str(work / "recipe.yaml")], cwd=work,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        while proc.poll() is None:
            found = list((work / "runs").glob("*/metrics.jsonl"))
            if found and '"loss"' in found[0].read_text():
                break
            time.sleep(0.05)
        kids = children(proc.pid)
        teacher = next(pid for pid, cmd in kids.items() if "teacher_server" in cmd)
        student = next(pid for pid, cmd in kids.items() if pid != teacher)
        os.kill(teacher, signal.SIGSTOP)
        time.sleep(3.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        while Path(f"/proc/{student}").exists() and time.monotonic() - t0 < 120:
            stat = Path(f"/proc/{student}/stat")
            if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break  # exited, not reaped yet
            time.sleep(0.05)
        student_s = time.monotonic() - t0
        try:
            text, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        up_s = time.monotonic() - t0
        if Path(f"/proc/{teacher}").exists():
            os.kill(teacher, signal.SIGCONT)
        out = outcome(work, None, text, proc.returncode)
        out.update(student_exit_s=round(student_s, 2), up_exit_s=round(up_s, 2),
                   printed=[line for line in text.splitlines() if "stopping" in line])
    return out


HARMLESS = ("ranks_shuffled",)  # the same targets as an honest reply: trained on


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """Counts over the runs: refused in one line (exit 1, no traceback) with no update
    after the honest cycle's; the harmless behaviours trained on as honest replies."""
    hostile = [r for name, r in record["runs"].items() if name.split(":")[1] not in HARMLESS]
    harmless = [r for name, r in record["runs"].items() if name.split(":")[1] in HARMLESS]
    return {
        "runs": len(record["runs"]),
        "hostile_runs": len(hostile),
        "refused_in_one_line": sum(r["exit_code"] == 1 and not r["traceback"] for r in hostile),
        "updates_from_a_hostile_reply": sum(max((r.get("updates") or 0) - 1, 0)
                                            for r in hostile),
        "harmless_runs_completed": sum(r["exit_code"] == 0 and r.get("updates") == 2
                                       for r in harmless),
        "tracebacks": sum(r["traceback"] for r in record["runs"].values()),
        "signal_runs": len(record["signals"]),
        "signal_runs_interrupted_with_checkpoint_1": sum(
            r["exit_code"] == 130 and r.get("checkpoint_versions") == [1]
            for r in record["signals"].values()),
        "signal_exit_s_max": max((r["exit_s"] for r in record["signals"].values()
                                  if r.get("exit_s") is not None), default=None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None,
                        help="FLAVOUR:BEHAVIOUR runs to do (default: all)")
    parser.add_argument("--skip-signals", action="store_true")
    parser.add_argument("--up-only", action="store_true",
                        help="only the `miniverl up` run, added to the committed record")
    parser.add_argument("--summarize", type=Path, default=None,
                        help="recompute the summary of an existing record and rewrite it")
    add_output_options(parser, COMMITTED)
    args = parser.parse_args()
    if args.summarize is not None:
        record = json.loads(args.summarize.read_text())
        record["summary"] = summarize(record)
        args.summarize.write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(record["summary"], indent=2))
        return
    if args.up_only:
        record = json.loads(COMMITTED.read_text())
        record["up"] = up_signal_run()
        print(json.dumps(record["up"], indent=2))
        out = script_output_file(args, COMMITTED, ROOT)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
        return
    tok = tokenizer()
    plan = [("vllm", b) for b in BEHAVIOURS] + [("sglang", b) for b in SGLANG]
    if args.only is not None:
        plan = [tuple(x.split(":")) for x in args.only]
    record: dict[str, Any] = {"k": K, "honest_requests_first": HONEST_REQUESTS, "runs": {},
                              "signals": {}}
    for flavour, behaviour in plan:
        result = hostile_run(flavour, behaviour, tok)
        record["runs"][f"{flavour}:{behaviour}"] = result
        print(f"{flavour:6} {behaviour:18} exit {result['exit_code']:3} updates "
              f"{result.get('updates')} ckpt {result.get('checkpoint_versions')} "
              f"{result['seconds']:5.1f}s | {result['line'][:150]}", flush=True)
    if not args.skip_signals:
        for name, sigs in (("one_sigterm", [signal.SIGTERM]),
                           ("two_sigterms", [signal.SIGTERM, signal.SIGTERM]),
                           ("one_sigint", [signal.SIGINT])):
            for teacher, run in (("engine", lambda s=sigs: signal_run(s, tok)),
                                 ("zmq", lambda s=sigs: zmq_signal_run(s))):
                result = run()
                record["signals"][f"{teacher}:{name}"] = result
                print(f"{teacher:6} {name:14} exit {result['exit_code']} in "
                      f"{result['exit_s']} s, checkpoints {result.get('checkpoint_versions')} "
                      f"status {result.get('status')}", flush=True)
        record["up"] = up_signal_run()
    record["summary"] = summarize(record)
    out = script_output_file(args, COMMITTED, ROOT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
