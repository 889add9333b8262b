"""Trust probes: what a hostile or unlucky user can do to miniverl, measured (issue 18).

Runs every probe the issue names against the real processes and prints one table:

1. fuzz: 10,000 malformed messages to a real teacher process; it must stay up, and a
   valid SCORE must get byte-identical arrays before and after;
2. unauthorised control: RELOAD (of an existing and a missing path), PARK, WAKE and
   SHUTDOWN without the admin token or with a wrong one; every one refused, nothing
   changed (state READY, same generation);
3. finite targets: SCOREs at hostile temperatures and k (1e-45 ... 1e30, k = 1 ... V,
   top-k and exact); no non-finite number delivered (``tail_logmass`` is -inf exactly
   when k = V, by the protocol);
4. tools: ``benchmarks/tool_bounds.py`` (>= 1,000 hostile tool calls, each under 1 s);
5. CLI: ``tests/cli/test_bad_inputs.py`` (>= 30 bad inputs, one line, exit 1, no
   traceback);
6. byte flips: ``benchmarks/integrity_flips.py`` (checkpoints, cache shards,
   trajectories, manifests);
7. reproducibility: ``recipes/toy_cpu_opd.yaml`` as shipped, two same-seed runs and a
   run interrupted (SIGINT once distillation has started) then resumed; the three final
   checkpoints must be bitwise equal.

Run:  python benchmarks/trust_probes.py [--skip flips determinism]
Writes ``trust_probes.json`` in ``--output-dir`` (default ``runs/benchmarks/trust_probes/``; the committed ``benchmarks/results/trust_probes.json`` with ``--update-committed``). Takes about 12 minutes (7 is ~6 of them);
run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import yaml
import zmq

from miniverl.common.recipe_models import ToySpec
from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.common.toy import toy_model_dir
from miniverl.student.benchmark.outputs import add_output_options, script_output_file
from miniverl.student.teacher_process import start_teacher, stop_teacher

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SPEC = ToySpec(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, seed=3)
FUZZ_MESSAGES = 10_000
PROBES = ("fuzz", "unauthorised", "finite", "tools", "cli", "flips", "determinism")


# -- a raw DEALER, framed by hand as docs/protocol.md describes ------------------------


class Raw:
    def __init__(self, endpoint: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None):
        arrays = arrays or {}
        header = {**header, "arrays": [[n, a.dtype.str.lstrip("<|"), list(a.shape)]
                                       for n, a in arrays.items()]}
        if not arrays:
            header.pop("arrays")
        self.sock.send_multipart([msgpack.packb(header),
                                  *[np.ascontiguousarray(a).tobytes() for a in arrays.values()]])

    def recv(self, timeout_s: float = 30.0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        if not self.sock.poll(int(timeout_s * 1000)):
            raise TimeoutError("no reply")
        frames = self.sock.recv_multipart()
        head = msgpack.unpackb(frames[0])
        arrays = {name: np.frombuffer(f, "<" + dt).reshape(shape)
                  for (name, dt, shape), f in zip(head.get("arrays") or [], frames[1:],
                                                  strict=True)}
        return head, arrays

    def call(self, header, arrays=None, timeout_s: float = 30.0):
        self.send(header, arrays)
        while True:
            head, out = self.recv(timeout_s)
            if head.get("id") == header["id"] or head.get("ref_id") == header["id"]:
                return head, out

    def close(self):
        self.sock.close(0)


def score_arrays(n: int = 24, vocab: int = 100) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, vocab, size=n).astype("<i4")
    return {"tokens": tokens, "cu_seqlens": np.array([0, n], "<i4"),
            "positions": np.arange(0, n - 1, 2, dtype="<i4")}


def fuzz_frames(rng: np.random.Generator, n: int):
    """``n`` hostile messages: garbage, random headers, valid headers with bad arrays."""
    types = ["SCORE", "HELLO", "PING", "STATUS", "RELOAD", "PARK", "WAKE", "SHUTDOWN", "X", 7]
    values = [None, -1, 2**63 - 1, 1e308, float("nan"), "", "x" * 300, [], {}, [1, [2]], True]
    for i in range(n):
        kind = i % 4
        if kind == 0:
            yield [rng.bytes(int(rng.integers(0, 200)))]
        elif kind == 1:
            header = {str(rng.choice(["v", "t", "id", "k", "kind", "arrays", "zz"])):
                      values[int(rng.integers(len(values)))] for _ in range(4)}
            yield [msgpack.packb(header)]
        elif kind == 2:
            header = {"v": 1, "t": types[int(rng.integers(len(types)))], "id": i,
                      "student_version": int(rng.integers(-5, 5)), "kind": "topk",
                      "k": int(rng.integers(-3, 10**6)),
                      "temperature": values[int(rng.integers(len(values)))]}
            yield [msgpack.packb(header)]
        else:
            header = {"v": 1, "t": "SCORE", "id": i, "student_version": 0, "kind": "topk",
                      "k": 4, "temperature": 1.0,
                      "arrays": [["tokens", "i4", [int(rng.integers(0, 2**40))]],
                                 ["cu_seqlens", "i4", [2]],
                                 ["positions", str(rng.choice(["i4", "f4", "i8", "zz"])),
                                  [int(rng.integers(-2, 9))]]]}
            yield [msgpack.packb(header), rng.bytes(int(rng.integers(0, 64))), b"", b"x"]


# -- the probes ---------------------------------------------------------------------


def teacher(work: Path) -> tuple[subprocess.Popen, str, dict[str, Any]]:
    from miniverl.common.modeling import load_tokenizer

    model_dir = toy_model_dir(SPEC)
    tok = load_tokenizer(model_dir)
    endpoint = f"ipc://{work}/t/teacher.sock"
    proc = start_teacher(["--model", str(model_dir), "--device", "cpu", "--threads", "1",
                          "--log", str(work / "teacher.log")],
                         endpoint=endpoint, log=work / "teacher.out", timeout_s=180)
    return proc, endpoint, {"fp": fingerprint_tokenizer(tok), "vocab": len(tok)}


def hello(raw: Raw, ident: dict[str, Any]) -> dict[str, Any]:
    head, _ = raw.call({"v": 1, "t": "HELLO", "id": 1, "client": "probe",
                        "tokenizer_fp": ident["fp"], "vocab_size": ident["vocab"]})
    assert head["t"] == "HELLO_OK", head
    return head


def probe_fuzz(endpoint: str, proc: subprocess.Popen, ident) -> dict[str, Any]:
    raw = Raw(endpoint)
    hello(raw, ident)
    valid = {"v": 1, "t": "SCORE", "id": 10**9, "student_version": 0, "kind": "topk",
             "k": 5, "temperature": 1.0}
    before = raw.call(valid, score_arrays(vocab=ident["vocab"]))
    t0 = time.perf_counter()
    for n, frames in enumerate(fuzz_frames(np.random.default_rng(0), FUZZ_MESSAGES)):
        raw.sock.send_multipart(frames)
        # Read the ERROR replies as they come: a client that never reads fills ZeroMQ's
        # queues (1,000 messages each way) and the ROUTER then drops its replies.
        while n % 100 == 99 and raw.sock.poll(0):
            raw.sock.recv_multipart()
    ping = raw.call({"v": 1, "t": "PING", "id": 10**9 + 1}, timeout_s=300)[0]
    after = raw.call({**valid, "id": 10**9 + 2}, score_arrays(vocab=ident["vocab"]))
    same = (before[0]["t"] == after[0]["t"] == "SCORE_OK"
            and all(np.array_equal(before[1][k], after[1][k]) for k in before[1]))
    raw.close()
    return {"messages": FUZZ_MESSAGES, "crashes": int(proc.poll() is not None),
            "state_after": ping.get("state"), "valid_identical": bool(same),
            "seconds": round(time.perf_counter() - t0, 1),
            "ok": proc.poll() is None and same and ping.get("state") == "READY"}


def probe_unauthorised(endpoint: str, proc: subprocess.Popen, ident, work: Path):
    raw = Raw(endpoint)
    hello(raw, ident)
    real = str(toy_model_dir(SPEC))
    messages = [
        {"t": "RELOAD", "model": real, "mode": "drain"},
        {"t": "RELOAD", "model": "/nonexistent/model", "mode": "drain"},
        {"t": "RELOAD", "model": "/etc", "mode": "abort"},
        {"t": "PARK"}, {"t": "WAKE"},
        {"t": "SHUTDOWN", "mode": "abort", "timeout_s": 1.0},
    ]
    sent = refused = leaked = 0
    codes: dict[str, int] = {}
    gen0 = raw.call({"v": 1, "t": "PING", "id": 2})[0].get("gen")
    i = 100
    for proof in (None, "", "0" * 64, secrets.token_hex(32), secrets.token_hex(8)):
        for message in messages:
            for _ in range(10):
                i += 1
                header = {"v": 1, "id": i, **message}
                if proof is not None:
                    header["auth"] = proof
                head, _ = raw.call(header)
                sent += 1
                codes[str(head.get("code", head.get("t")))] = codes.get(
                    str(head.get("code", head.get("t"))), 0) + 1
                # UNAUTHORIZED, or BAD_REQUEST for a malformed proof (an empty `auth`).
                refused += head.get("t") == "ERROR" and head.get("code") in (
                    "UNAUTHORIZED", "BAD_REQUEST")
                text = str(head.get("message", ""))
                leaked += any(p in text for p in ("/etc", "/nonexistent", real))
    pong = raw.call({"v": 1, "t": "PING", "id": 3})[0]
    raw.close()
    unchanged = pong.get("state") == "READY" and pong.get("gen") == gen0 and proc.poll() is None
    return {"sent": sent, "refused": refused, "rate": refused / sent, "codes": codes,
            "paths_revealed": leaked, "teacher_unchanged": unchanged,
            "ok": refused == sent and leaked == 0 and unchanged}


def probe_finite(endpoint: str, ident) -> dict[str, Any]:
    raw = Raw(endpoint)
    hello(raw, ident)
    vocab = ident["vocab"]
    temps = [1e-45, 1e-30, 1e-8, 1e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 20.0, 100.0, 1e6,
             1e30, float("inf"), float("nan"), -1.0, 0.0]
    replies = delivered_bad = refused = 0
    i = 1000
    for temperature in temps:
        for kind, k in (("topk", 1), ("topk", 5), ("topk", vocab), ("exact", 0)):
            i += 1
            head, arrays = raw.call({"v": 1, "t": "SCORE", "id": i, "student_version": 0,
                                     "kind": kind, "k": k, "temperature": temperature},
                                    score_arrays(vocab=vocab))
            replies += 1
            if head["t"] != "SCORE_OK":
                refused += 1
                continue
            for name, values in arrays.items():
                values = np.asarray(values, dtype=np.float64)
                if name == "tail_logmass" and kind == "topk" and k == vocab:
                    ok = bool(np.all(values == -math.inf))
                else:
                    ok = bool(np.all(np.isfinite(values)))
                delivered_bad += not ok
    raw.close()
    return {"requests": replies, "refused": refused, "scored": replies - refused,
            "non_finite_delivered": delivered_bad, "ok": delivered_bad == 0}


def run_json(cmd: list[str], result: Path) -> dict[str, Any]:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    out = json.loads(result.read_text()) if result.is_file() else {}
    return {"exit": proc.returncode, "result": out, "tail": proc.stdout[-1500:]}


def probe_tools(work: Path) -> dict[str, Any]:
    got = run_json([sys.executable, "benchmarks/tool_bounds.py", "--output-dir", str(work)],
                   work / "tool_bounds.json")
    return {"exit": got["exit"], "summary": got["result"].get("summary", got["result"]),
            "ok": got["exit"] == 0}


def probe_cli() -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/cli/test_bad_inputs.py"],
                          cwd=ROOT, capture_output=True, text=True)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    sys.path.insert(0, str(ROOT))
    from tests.cli.test_bad_inputs import CASES

    return {"bad_inputs": len(CASES), "pytest": last, "tracebacks": proc.stdout.count(
        "Traceback (most recent call last)") if proc.returncode else 0,
        "ok": proc.returncode == 0}


def probe_flips(work: Path) -> dict[str, Any]:
    got = run_json([sys.executable, "benchmarks/integrity_flips.py", "--output-dir", str(work)],
                   work / "integrity_flips.json")
    return {"exit": got["exit"], "result": got["result"], "ok": got["exit"] == 0}


def checkpoint_hash(run_dir: Path) -> str:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from behaviour_hashes import checkpoint_sha256

    return checkpoint_sha256(run_dir)[0]


def up(recipe: Path, out: Path, run_id: str, *extra: str, interrupt: bool = False) -> int:
    cmd = [sys.executable, "-m", "miniverl.cli.app", "up", str(recipe), "--run-id", run_id,
           "--output-dir", str(out), "--quiet", *extra]
    proc = subprocess.Popen(cmd, cwd=out, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    if interrupt:
        metrics = out / run_id / "metrics.jsonl"
        while proc.poll() is None:
            rows = metrics.read_text().splitlines() if metrics.is_file() else []
            # Interrupt once distillation has started (a row of phase "train").
            if any(json.loads(r).get("phase") == "train" for r in rows[-3:] if r.strip()):
                os.killpg(proc.pid, signal.SIGINT)  # once: finish the update, checkpoint, stop
                break
            time.sleep(0.5)
    return proc.wait()


def probe_determinism(work: Path) -> dict[str, Any]:
    recipe = ROOT / "recipes" / "toy_cpu_opd.yaml"
    data = yaml.safe_load(recipe.read_text())
    prepare = (data.get("teacher") or {}).get("prepare")
    if prepare and not Path(prepare).is_absolute():
        data["teacher"]["prepare"] = str((recipe.parent / prepare).resolve())
    copy = work / "toy_cpu_opd.yaml"
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    out = work / "runs"
    out.mkdir()
    t0 = time.perf_counter()
    codes = {"a": up(copy, out, "a"), "b": up(copy, out, "b")}
    codes["c-interrupted"] = up(copy, out, "c", interrupt=True)
    codes["c-resumed"] = up(copy, out, "c", "--resume")
    hashes = {run: checkpoint_hash(out / run) for run in ("a", "b", "c")}
    resumed_at = [json.loads(line) for line in (out / "c" / "events.jsonl").read_text()
                  .splitlines() if '"resumed"' in line or '"run_resumed"' in line]
    return {"deterministic": data["run"].get("deterministic"), "exit_codes": codes,
            "hashes": hashes, "resume_events": len(resumed_at),
            "seconds": round(time.perf_counter() - t0, 1),
            "ok": len(set(hashes.values())) == 1 and codes["a"] == codes["b"] == 0
            and codes["c-interrupted"] == 130 and codes["c-resumed"] == 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", nargs="*", default=[], choices=PROBES)
    parser.add_argument("--table", action="store_true",
                        help="Print the table of the committed results and exit.")
    add_output_options(parser, RESULTS / "trust_probes.json")
    args = parser.parse_args()
    if args.table:
        print_table(json.loads((RESULTS / "trust_probes.json").read_text())["probes"])
        return 0
    output = script_output_file(args, RESULTS / "trust_probes.json", ROOT)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mvl-trust-") as tmp:
        work = Path(tmp)
        if {"fuzz", "unauthorised", "finite"} - set(args.skip):
            proc, endpoint, ident = teacher(work)
            try:
                if "finite" not in args.skip:
                    results["finite"] = probe_finite(endpoint, ident)
                if "fuzz" not in args.skip:
                    results["fuzz"] = probe_fuzz(endpoint, proc, ident)
                if "unauthorised" not in args.skip:
                    results["unauthorised"] = probe_unauthorised(endpoint, proc, ident, work)
            finally:
                stop_teacher(proc)
        if "tools" not in args.skip:
            results["tools"] = probe_tools(work)
        if "cli" not in args.skip:
            results["cli"] = probe_cli()
        if "flips" not in args.skip:
            results["flips"] = probe_flips(work)
        if "determinism" not in args.skip:
            results["determinism"] = probe_determinism(work)
    print_table(results)
    record = {"benchmark": "trust_probes", "machine": platform.machine(),
              "python": platform.python_version(), "probes": results}
    output.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {output}")
    return 0 if all(r["ok"] for r in results.values()) else 1


LINES = {
    "fuzz": lambda r: f"{r['messages']:,} malformed messages, {r['crashes']} crashes, "
                      f"valid SCORE identical after: {r['valid_identical']}",
    "unauthorised": lambda r: f"{r['refused']}/{r['sent']} unauthorised RELOAD/PARK/WAKE/"
                              f"SHUTDOWN refused, paths revealed {r['paths_revealed']}, "
                              f"teacher unchanged: {r['teacher_unchanged']}",
    "finite": lambda r: f"{r['requests']} hostile SCOREs: {r['refused']} refused, "
                        f"{r['scored']} scored, {r['non_finite_delivered']} non-finite "
                        "delivered",
    "tools": lambda r: "{} hostile tool calls, {} over 1 s, slowest {:.3f} s".format(
        r["summary"].get("total_calls"),
        sum(e["over_1s"] for e in r["summary"].get("environments", {}).values()),
        max((e["slowest_s"] for e in r["summary"].get("environments", {}).values()),
            default=float("nan"))),
    "cli": lambda r: f"{r['bad_inputs']} bad CLI inputs: {r['pytest']}",
    "flips": lambda r: "single-byte flips detected: " + ", ".join(
        f"{name} {v['detected']}/{v['flips'] - v.get('semantically_identical', 0)}"
        for name, v in r["result"].get("results", {}).items()
        if isinstance(v, dict) and "flips" in v),
    "determinism": lambda r: f"toy_cpu_opd: exits {r['exit_codes']}, distinct final "
                             f"hashes {len(set(r['hashes'].values()))}",
}


def print_table(results: dict[str, Any]) -> None:
    print(f"{'probe':<13} {'ok':<5} result")
    for name, r in results.items():
        print(f"{name:<13} {('yes' if r['ok'] else 'NO'):<5} {LINES[name](r)}")


if __name__ == "__main__":
    sys.exit(main())
