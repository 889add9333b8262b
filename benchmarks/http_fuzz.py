"""Generated input at every surface that parses another process's bytes (issue 40).

Four surfaces, 10,000+ generated inputs each (hypothesis, generation only, no shrinking):

1. ``POST /v1/completions`` of a real ``miniverl teacher serve --openai`` process on a
   toy teacher: valid, near-valid and garbage JSON, wrong types, extreme sizes and
   nesting (``tests/teacher_server/openai_bodies.py``);
2. ``/v1/models`` of the same process: any method, neighbouring paths, bodies, headers;
3. the engine-teacher client (``protocol/engine_client.py``) against generated replies
   of a ``miniverl.testing.HostileEngine`` (vLLM and SGLang shapes,
   ``tests/protocol/engine_reply_bodies.py``);
4. xvocab SCOREs at the teacher server (``tests/protocol/xvocab_frames.py``), over the
   testing kit's in-memory connections to the real server loop.

Counted per surface: requests, answers by status (or verdict), server errors (5xx or
``INTERNAL``), tracebacks in the teacher's output, hangs (no answer within the bound),
and whether the process still serves. For the client: replies accepted (every target
finite, a log-prob, inside the vocabulary) and refused in one line naming the endpoint;
anything else is counted as a client error.

Run:  python benchmarks/http_fuzz.py [--n 10000]
Writes ``http_fuzz.json`` in ``--output-dir`` (default ``runs/benchmarks/http_fuzz/``;
the committed ``benchmarks/results/http_fuzz.json`` with ``--update-committed``). About
ten minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "benchmarks" / "results" / "http_fuzz.json"
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from miniverl.student.benchmark.outputs import add_output_options, script_output_file  # noqa: E402

ANSWER_WITHIN_S = 10.0


def generate(n: int, strategy, fn) -> int:
    """Call ``fn`` on ``n`` generated examples of ``strategy``; how many it was called."""
    calls = itertools.count()

    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(example=strategy)
    def run(example):
        next(calls)
        fn(example)

    run()
    return next(calls)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ 1 and 2: the front end


def front_end(n: int, work: Path) -> dict[str, Any]:
    from miniverl.common.modeling import load_tokenizer
    from miniverl.student.teacher_process import start_teacher, stop_teacher
    from miniverl.testing.toy_recipe import TEACHER
    from tests.teacher_server.openai_bodies import completion_bodies, model_requests
    from tests.toy_kit import toy_dir

    model_dir = toy_dir(TEACHER)
    vocab = len(load_tokenizer(model_dir))
    port = free_port()
    (work / "t").mkdir(mode=0o700)
    out_log = work / "teacher.out"
    proc = start_teacher(["--model", str(model_dir), "--device", "cpu", "--threads", "1",
                          "--openai", f"127.0.0.1:{port}", "--log", str(work / "teacher.log")],
                         endpoint=f"ipc://{work}/t/teacher.sock", log=out_log, timeout_s=180)
    base = f"http://127.0.0.1:{port}"
    results: dict[str, Any] = {}
    try:
        with httpx.Client(base_url=base, timeout=ANSWER_WITHIN_S) as http:
            name = http.get("/v1/models").json()["data"][0]["id"]
            for surface, strategy, send in (
                ("v1_completions", completion_bodies(name, vocab, 16),
                 lambda ex: ("POST", http.post("/v1/completions", content=ex[1],
                                               headers={"Content-Type": "application/json"}),
                             ex[0])),
                ("v1_models", model_requests(),
                 lambda ex: (ex[0], http.request(ex[0], ex[1], content=ex[2] or None,
                                                 headers=ex[3]), "any")),
            ):
                tally: Counter = Counter()
                kinds: Counter = Counter()
                slowest = 0.0

                def one(example, send=send, tally=tally, kinds=kinds):
                    nonlocal slowest
                    t0 = time.monotonic()
                    try:
                        method, reply, kind = send(example)
                    except httpx.TimeoutException:
                        tally["hangs"] += 1
                        return
                    took = time.monotonic() - t0
                    slowest = max(slowest, took)
                    kinds[kind] += 1
                    tally[f"{reply.status_code // 100}xx"] += 1
                    tally[str(reply.status_code)] += 1
                    if reply.status_code >= 500:
                        tally["server_errors"] += 1
                    elif reply.status_code >= 400 and method != "HEAD":
                        try:
                            ok = isinstance(reply.json()["error"]["message"], str)
                        except Exception:
                            ok = False
                        tally["json_errors" if ok else "non_json_errors"] += 1
                    if kind == "valid" and reply.status_code != 200:
                        tally["valid_refused"] += 1

                t0 = time.monotonic()
                sent = generate(n, strategy, one)
                results[surface] = {"requests": sent, "by_kind": dict(kinds),
                                    "answers": dict(sorted(tally.items())),
                                    "server_errors": tally["server_errors"],
                                    "hangs": tally["hangs"],
                                    "slowest_answer_s": round(slowest, 3),
                                    "seconds": round(time.monotonic() - t0, 1)}
                print(f"{surface}: {results[surface]}", flush=True)
            health = http.get("/health")
            results["alive_after"] = proc.poll() is None and health.status_code == 200
    finally:
        stop_teacher(proc)
    text = out_log.read_text(errors="replace") + (work / "teacher.log").read_text(
        errors="replace")
    results["tracebacks"] = text.count("Traceback")
    results["error_log_lines"] = sum('"level": "error"' in line or '"level":"error"' in line
                                     for line in text.splitlines())
    return results


# ------------------------------------------------------------------ 3: the engine client


def engine_client(n: int) -> dict[str, Any]:
    from miniverl.protocol.engine_client import EngineTeacherClient
    from miniverl.protocol.engine_replies import score_body
    from miniverl.testing import HostileEngine
    from tests.protocol.engine_reply_bodies import engine_replies, judge
    from tests.testing.test_hostile_engine import SEQS, VOCAB, encode, packed

    k, out = 4, {}
    for flavour in ("vllm", "sglang"):
        verdicts: Counter = Counter()
        examples: dict[str, str] = {}
        slowest = 0.0
        with HostileEngine(tokenize=encode, vocab_size=VOCAB, flavour=flavour) as engine, \
                EngineTeacherClient(engine.url, flavour=flavour, model=engine.model,
                                    tokenize=encode, tokenizer_fp="bytes", vocab_size=VOCAB,
                                    request_timeout_s=5.0, max_retries=0) as client:
            client.set_version(0)
            client.bind()
            route, body = score_body(flavour, engine.model, SEQS, k)
            honest = engine.honest(route, body)
            tokens, cu, positions = packed()

            def one(example, engine=engine, client=client, verdicts=verdicts,
                    examples=examples, request=(tokens, cu, positions)):
                nonlocal slowest
                status, reply = example
                engine.reply_with = lambda route, body, answer=(status, reply): answer
                t0 = time.monotonic()
                try:
                    rid = client.submit(*request, k=k)
                    outcome = client.wait([rid], timeout_s=30)[rid]
                except Exception as exc:  # judged: only a one-line refusal is allowed
                    outcome = exc
                took = time.monotonic() - t0
                slowest = max(slowest, took)
                verdict = judge(outcome, url=engine.url, vocab=VOCAB, k=k,
                                actual_P=request[0][request[2] + 1])
                key = verdict if verdict in ("accepted", "refused") else "client_errors"
                verdicts[key] += 1
                if key == "client_errors":
                    examples.setdefault(verdict[:120], repr(reply[:200]))
                if took > ANSWER_WITHIN_S:
                    verdicts["hangs"] += 1

            t0 = time.monotonic()
            sent = generate(n // 2, engine_replies(honest), one)
        out[flavour] = {"replies": sent, **dict(verdicts), "slowest_s": round(slowest, 3),
                        "seconds": round(time.monotonic() - t0, 1),
                        "client_error_examples": examples}
        print(f"engine client {flavour}: {out[flavour]}", flush=True)
    out["replies"] = sum(v["replies"] for v in out.values() if isinstance(v, dict))
    return out


# ------------------------------------------------------------------ 4: xvocab SCOREs


def xvocab(n: int) -> dict[str, Any]:
    from miniverl.protocol import messages as m
    from miniverl.testing import FAKE_TOKENIZER_FP, FAKE_VOCAB, FakeBackend, TeacherHarness
    from tests.common.cross_tokenizer_kit import byte_fallback_tokenizer
    from tests.protocol.test_xvocab_fuzz import BASE, HEADER, TEACHER_FP
    from tests.protocol.xvocab_frames import xvocab_scores

    tok = byte_fallback_tokenizer()
    h = TeacherHarness(backend=FakeBackend(tokenizer=tok, tokenizer_fp=TEACHER_FP,
                                           vocab_size=len(tok)))
    raw = h.raw()
    ids = itertools.count(10)
    assert raw.call({"v": 1, "t": "HELLO", "id": 1, "client": "fuzz",
                     "tokenizer_fp": FAKE_TOKENIZER_FP, "vocab_size": FAKE_VOCAB,
                     "understands": ["xvocab"]})[0].t == "HELLO_OK"
    before = raw.call({**HEADER, "id": next(ids)}, BASE)
    tally: Counter = Counter()

    def one(example):
        header, arrays = example
        raw.send({**header, "id": next(ids)}, arrays)
        reply = raw.recv(ANSWER_WITHIN_S)
        if reply is None:
            pong = raw.call({"v": 1, "t": "PING", "id": next(ids)}, timeout_s=ANSWER_WITHIN_S)
            tally["unanswered_unreadable" if pong[0].t == "PONG" else "hangs"] += 1
            return
        msg = reply[0]
        tally[msg.t if msg.t != "ERROR" else f"ERROR {msg.code.value}"] += 1
        if msg.t == "ERROR" and msg.code == m.ErrorCode.INTERNAL:
            tally["server_errors"] += 1

    t0 = time.monotonic()
    sent = generate(n, xvocab_scores(BASE), one)
    after = raw.call({**HEADER, "id": next(ids)}, BASE)
    same = all((before[1][k] == after[1][k]).all() for k in before[1])
    h.close()
    out = {"scores": sent, "answers": dict(sorted(tally.items())),
           "server_errors": tally["server_errors"], "hangs": tally["hangs"],
           "valid_identical_after": bool(same), "seconds": round(time.monotonic() - t0, 1)}
    print(f"xvocab: {out}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="generated inputs per surface")
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["front_end", "engine_client", "xvocab"])
    add_output_options(parser, COMMITTED)
    args = parser.parse_args()
    record: dict[str, Any] = {"n_per_surface": args.n}
    with tempfile.TemporaryDirectory() as tmp:
        if "front_end" not in args.skip:
            record["front_end"] = front_end(args.n, Path(tmp))
    if "engine_client" not in args.skip:
        record["engine_client"] = engine_client(args.n)
    if "xvocab" not in args.skip:
        record["xvocab"] = xvocab(args.n)
    out = script_output_file(args, COMMITTED, ROOT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
