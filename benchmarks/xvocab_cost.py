"""What does a teacher with another tokenizer cost per position? xvocab against topk.

    python benchmarks/xvocab_cost.py [--episodes 48] [--repeats 7] [--warmup 2] [--smoke]
                                     [--teacher-dir DIR] [--update-committed]

On the same oracle episodes of the calculator environment (``--episodes`` tasks,
``--seed``), the toy byte student asks two teachers of one shape (the trainer tests'
``TEACHER``, random weights, seed 1) for its training targets:

- **topk**: a teacher over the toy tokenizer, the student's own; the SCORE carries the
  episode's token ids and the positions the loss trains on (``target_positions``), as
  the trainer sends them;
- **xvocab**: a teacher over the byte-fallback BPE of ``tests/common/cross_tokenizer_kit.py``
  (another vocabulary and fingerprint, the same chat template), reached with
  ``teacher.tokenizer: other``; the SCORE carries the episode, the teacher renders,
  tokenizes and aligns it (``teacher_server/xvocab.py``) and scores its own positions.

Each teacher is a real :class:`~miniverl.teacher_server.server.TeacherServer` on an ipc
socket, on its own event-loop thread; the client is a
:class:`~miniverl.protocol.sync_client.SyncTeacherClient` on its portal thread, one
request in flight at a time. A repeat sends every episode to both teachers, the two
taking turns and the first one alternating between repeats; ``--warmup`` repeats come
first and are discarded. A request's time is the client's, from ``submit`` to the
accepted reply: wire, the teacher's planning (rendering and alignment, for xvocab) and
its forward; both servers keep their default prefix cache, whose counters the record
holds. Per repeat, each arm's total over the episodes divided by the student
positions the loss trains on (the same positions for both arms: same episodes, same
student) is its cost per student position; the record holds their median, minimum and
maximum over the repeats, and the ratio xvocab / topk per repeat. Timed in-process the
same way: the student's side of xvocab (building a request, ``xvocab_request``; mapping a
reply onto its groups, ``student_targets``) and the teacher's plan alone
(``plan_xvocab``). The xvocab reply trains only the positions of trainable groups; the
record gives their share, and the cost per trained position.

``--teacher-dir DIR`` measures a real teacher instead (e.g. the SmolLM2-135M teacher
``recipes/smollm2_cpu_opd_teacher.yaml`` prepares): both servers load DIR's weights and
tokenizer; **topk** is then asked by a student of the teacher's own tokenizer (the same
tasks' oracle episodes, rendered and tokenized by it: the same-tokenizer pairing) and
**xvocab** by the toy byte student. The two students' positions differ in number, so the
record adds the cost per episode (the same episodes, the same teacher) and per teacher
position scored beside the per-student-position figures. Written as
``xvocab_cost_real.json`` (the record names DIR and its tokenizer).

Writes ``xvocab_cost.json`` in ``--output-dir`` (default ``runs/benchmarks/xvocab_cost/``;
the committed ``benchmarks/results/xvocab_cost.json`` with ``--update-committed``).
``--smoke`` runs four episodes, one warm-up and two repeats, in seconds: it checks that
the script runs, and its figures are not a measurement. Run the full form on a quiet
machine: the figures are wall-clock times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the byte-fallback tokenizer and bare_qwen3 live under tests/

import numpy as np  # noqa: E402

from miniverl.student.benchmark.outputs import add_output_options, script_output_file  # noqa: E402

COMMITTED = ROOT / "benchmarks" / "results" / "xvocab_cost.json"
COMMITTED_REAL = ROOT / "benchmarks" / "results" / "xvocab_cost_real.json"
ENVIRONMENT = "calculator"
SMOKE = {"episodes": 4, "warmup": 1, "repeats": 2}
MAX_POSITIONS = 4096  # the teachers' position table; the longest rendering must fit


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=48, help="oracle episodes (tasks)")
    parser.add_argument("--seed", type=int, default=0, help="the tasks' seed")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats (median)")
    parser.add_argument("--warmup", type=int, default=2, help="discarded repeats first")
    parser.add_argument("--k", type=int, default=16, help="top-k of both kinds (recipes: 16)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--smoke", action="store_true",
                        help=f"a seconds-long run ({SMOKE}); its figures are not a measurement")
    parser.add_argument("--teacher-dir", type=Path, default=None,
                        help="a real teacher's model directory (weights and tokenizer) for "
                             f"both servers; written as {COMMITTED_REAL.name} when committed")
    add_output_options(parser, COMMITTED)
    args = parser.parse_args(argv)
    if args.teacher_dir is not None and not (args.teacher_dir / "config.json").is_file():
        parser.exit(1, f"error: --teacher-dir {args.teacher_dir} holds no config.json; pass a "
                       "model directory (a prepared teacher's, or miniverl convert-gguf's)\n")
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    for name, least in (("episodes", 1), ("repeats", 1), ("warmup", 0), ("k", 1),
                        ("threads", 1)):
        if getattr(args, name) < least:
            parser.exit(1, f"error: --{name} {getattr(args, name)} must be at least {least}; "
                           f"pass a larger value\n")
    args.out = script_output_file(args, COMMITTED if args.teacher_dir is None else COMMITTED_REAL,
                                  ROOT)
    return args


def _episodes(n: int, seed: int, toy, toy_fp: str) -> list:
    from miniverl.student.environments.registry import make_tasks
    from miniverl.student.rollout.oracle import oracle_trajectory

    return [oracle_trajectory(ENVIRONMENT, task, toy, toy_fp)
            for task in make_tasks(ENVIRONMENT, "train", n, "mixed", seed)]


def _serve(endpoint: str, tokenizer, model_dir: Path | None = None):
    """A TeacherServer on its own thread around a ``TEACHER``-shaped model over
    ``tokenizer``'s vocabulary (seed 1, as the integration test builds it), or around
    ``model_dir``'s weights (float32) when given."""
    import torch

    from miniverl.common.modeling import load_causal_lm
    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.teacher_server.loader import LoadedTeacher
    from miniverl.teacher_server.server import TeacherServer
    from miniverl.teacher_server.server_state import ServerConfig
    from miniverl.teacher_server.torch_backend import TorchTeacher
    from tests.toy_kit import TEACHER, bare_qwen3

    torch.manual_seed(1)
    if model_dir is None:
        model = bare_qwen3(TEACHER, vocab=len(tokenizer), max_positions=MAX_POSITIONS).eval()
        name = f"{ENVIRONMENT}-cost-teacher-{len(tokenizer)}"
    else:
        model = load_causal_lm(model_dir, dtype="float32", device="cpu").eval()
        name = model_dir.name
    loaded = LoadedTeacher(model, None, fingerprint_tokenizer(tokenizer), len(tokenizer),
                           {"name": name, "model": name}, "cpu", "float32",
                           extra={"tokenizer": tokenizer})
    backend = TorchTeacher(loaded, exact_max_vocab=1 << 20, max_batch_tokens=8192)
    server = TeacherServer(ServerConfig(endpoint=endpoint), lambda request: backend)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while server.endpoint is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if server.endpoint is None:
        raise SystemExit(f"error: the teacher server at {endpoint} did not bind within 60 s")
    return server, thread, backend


def _spread(values: list[float], scale: float = 1.0, digits: int = 3) -> dict:
    v = [x * scale for x in values]
    return {"median": round(statistics.median(v), digits), "min": round(min(v), digits),
            "max": round(max(v), digits)}


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(args: argparse.Namespace, progress=None) -> dict:
    import torch

    from miniverl.common.tokenizer_id import fingerprint_tokenizer
    from miniverl.common.toy import build_toy_tokenizer
    from miniverl.protocol.sync_client import SyncTeacherClient
    from miniverl.student.train.teacher.xvocab import XvocabRequests, student_targets
    from miniverl.teacher_server.xvocab import plan_xvocab
    from tests.common.cross_tokenizer_kit import byte_fallback_tokenizer
    from tests.toy_kit import TEACHER

    torch.set_num_threads(args.threads)
    real = args.teacher_dir
    toy = build_toy_tokenizer()
    if real is None:
        other, same, same_name = byte_fallback_tokenizer(), toy, "toy"
    else:
        from miniverl.common.modeling import load_tokenizer

        other = same = load_tokenizer(real)
        same_name = real.name
    toy_fp, same_fp = fingerprint_tokenizer(toy), fingerprint_tokenizer(same)
    trajs = _episodes(args.episodes, args.seed, toy, toy_fp)
    # topk's student: the toy itself, or with a real teacher one of its own tokenizer.
    same_trajs = trajs if real is None else _episodes(args.episodes, args.seed, same, same_fp)
    build = XvocabRequests(toy)
    requests = [build(t) for t in trajs]
    unaligned = [t.id for t, r in zip(trajs, requests, strict=True) if r is None]
    if unaligned:  # an oracle episode always renders to its own tokens
        raise SystemExit(f"error: the toy rendering of {unaligned[0]} is not its tokens; "
                         "the oracle episodes must align (common/alignment.py)")
    positions = [np.asarray(t.target_positions(), dtype=np.int32) for t in trajs]
    tokens = [np.asarray(t.tokens, dtype=np.int32) for t in trajs]
    student_positions = int(sum(p.shape[0] for p in positions))
    same_positions = [np.asarray(t.target_positions(), dtype=np.int32) for t in same_trajs]
    same_tokens = [np.asarray(t.tokens, dtype=np.int32) for t in same_trajs]
    topk_positions = int(sum(p.shape[0] for p in same_positions))

    rounds = args.warmup + args.repeats
    task = progress.add_task("scoring", total=rounds * 2 * len(trajs)) if progress else None
    totals = {"topk": [], "xvocab": []}  # per timed repeat: seconds over all episodes
    compute = {"topk": [], "xvocab": []}  # the teachers' own compute_ms, summed
    with tempfile.TemporaryDirectory(prefix="mvl-xvocab-cost-") as tmp:
        served = {"topk": _serve(f"ipc://{tmp}/topk.sock", same, real),
                  "xvocab": _serve(f"ipc://{tmp}/xvocab.sock", other, real)}
        asking = {"topk": (same_fp, len(same)), "xvocab": (toy_fp, len(toy))}
        clients = {kind: SyncTeacherClient(server.endpoint, tokenizer_fp=asking[kind][0],
                                           vocab_size=asking[kind][1], xvocab=kind == "xvocab",
                                           request_timeout_s=600, unavailable_timeout_s=600)
                   for kind, (server, _, _) in served.items()}
        try:
            for client in clients.values():
                client.connect()

            def topk(i: int):
                c = clients["topk"]
                cu = np.array([0, same_tokens[i].shape[0]], dtype=np.int32)
                rid = c.submit(same_tokens[i], cu, same_positions[i], kind="topk", k=args.k)
                return c.wait([rid])[rid]

            def xvocab(i: int):
                c, r = clients["xvocab"], requests[i]
                rid = c.submit_xvocab(r["episode"], r["student_cuts"], r["student_pieces"],
                                      k=args.k)
                return c.wait([rid])[rid]

            calls = {"topk": topk, "xvocab": xvocab}
            replies: dict[int, object] = {}
            for rnd in range(rounds):
                order = ["topk", "xvocab"] if rnd % 2 == 0 else ["xvocab", "topk"]
                spent = {"topk": 0.0, "xvocab": 0.0}
                ms = {"topk": 0.0, "xvocab": 0.0}
                for i in range(len(trajs)):
                    for kind in order:
                        dt, reply = _timed(lambda kind=kind, i=i: calls[kind](i))
                        spent[kind] += dt
                        ms[kind] += reply.timing["compute_ms"]
                        if kind == "xvocab":
                            replies[i] = reply
                        if progress:
                            progress.advance(task)
                if rnd >= args.warmup:
                    for kind in spent:
                        totals[kind].append(spent[kind])
                        compute[kind].append(ms[kind] / 1000)
        finally:
            for client in clients.values():
                client.close()
            for server, thread, _ in served.values():
                server.shutdown_threadsafe("abort")
                thread.join(30)
    # Both servers keep their default prefix cache (the system block's KV), as a served
    # teacher does; its counters over the whole run, warm-up included.
    prefix_cache = {kind: backend.prefix_cache.stats() for kind, (_, _, backend) in served.items()}

    # In-process, the same rounds: the student's two steps and the teacher's plan alone.
    episodes = [json.loads(r["episode"].tobytes().decode("utf-8")) for r in requests]
    side = {"request": [], "map": [], "plan": []}
    trained = 0
    for rnd in range(rounds):
        spent = {name: 0.0 for name in side}
        trained = 0
        for i, traj in enumerate(trajs):
            dt, _ = _timed(lambda traj=traj: build(traj))
            spent["request"] += dt
            dt, (kept, _) = _timed(lambda i=i, traj=traj: student_targets(
                traj, positions[i], replies[i].arrays))
            spent["map"] += dt
            trained += int(kept.shape[0])
            dt, _ = _timed(lambda i=i: plan_xvocab(other, episodes[i], requests[i]))
            spent["plan"] += dt
        if rnd >= args.warmup:
            for name in side:
                side[name].append(spent[name])

    per_pos = 1e6 / student_positions  # seconds over the episodes -> us per student position
    per_topk_pos = 1e6 / topk_positions
    # Per student position each: with a real teacher the two students' counts differ.
    ratios = [(x * per_pos) / (t * per_topk_pos)
              for x, t in zip(totals["xvocab"], totals["topk"], strict=True)]
    teacher_tokens = int(sum(r.arrays["teacher_ids"].shape[0] for r in replies.values()))
    teacher_scored = int(sum(r.arrays["positions"].shape[0] for r in replies.values()))
    return {
        "benchmark": "xvocab_cost",
        "smoke": bool(args.smoke),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": platform.machine(),
        "threads": args.threads,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "environment": ENVIRONMENT,
        "episodes": len(trajs),
        "seed": args.seed,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "k": args.k,
        "teacher_shape": dict(TEACHER) if real is None else None,
        "teacher_dir": None if real is None else str(real),
        "tokenizers": {"student": {"name": "toy", "vocab": len(toy)},
                       "topk_student": {"name": same_name, "vocab": len(same)},
                       "topk_teacher": {"name": same_name, "vocab": len(same)},
                       "xvocab_teacher": {"name": "byte_fallback" if real is None else real.name,
                                          "vocab": len(other)}},
        "totals": {
            "student_tokens": int(sum(t.shape[0] for t in tokens)),
            "student_positions": student_positions,
            "topk_student_positions": topk_positions,
            "topk_teacher_tokens": int(sum(t.shape[0] for t in same_tokens)),
            "topk_teacher_positions": topk_positions,
            "xvocab_teacher_tokens": teacher_tokens,
            "xvocab_teacher_positions": teacher_scored,
            "xvocab_trained_positions": trained,
        },
        "xvocab_trained_share": trained / student_positions,
        # Per student position the loss trains on, microseconds: median, min, max over
        # the timed repeats.
        "us_per_student_position": {
            "topk": _spread(totals["topk"], per_topk_pos),
            "xvocab": _spread(totals["xvocab"], per_pos),
            "topk_teacher_compute": _spread(compute["topk"], per_topk_pos),
            "xvocab_teacher_compute": _spread(compute["xvocab"], per_pos),
            "xvocab_teacher_plan": _spread(side["plan"], per_pos),
            "xvocab_student_request": _spread(side["request"], per_pos),
            "xvocab_student_map": _spread(side["map"], per_pos),
        },
        "us_per_trained_position": {
            "topk": _spread(totals["topk"], per_topk_pos),
            "xvocab": _spread(totals["xvocab"], 1e6 / max(trained, 1)),
        },
        # xvocab / topk per student position, per repeat (the same episodes; the same
        # student positions unless a real teacher's own tokenizer asks for topk).
        "ratio_xvocab_to_topk": _spread(ratios, digits=4),
        "ratio_with_student_side": _spread(
            [((x + r + m) * per_pos) / (t * per_topk_pos)
             for x, r, m, t in zip(totals["xvocab"], side["request"], side["map"],
                                   totals["topk"], strict=True)],
            digits=4),
        # The same episodes asked of the same teacher: xvocab / topk per episode, and
        # per position the teacher scored.
        "ratio_per_episode": _spread(
            [x / t for x, t in zip(totals["xvocab"], totals["topk"], strict=True)], digits=4),
        "us_per_teacher_position": {
            "topk": _spread(totals["topk"], 1e6 / max(topk_positions, 1)),
            "xvocab": _spread(totals["xvocab"], 1e6 / max(teacher_scored, 1)),
        },
        "prefix_cache": prefix_cache,
        "seconds_per_repeat": {"topk": _spread(totals["topk"], digits=4),
                               "xvocab": _spread(totals["xvocab"], digits=4)},
    }


def _summary(record: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    us = record["us_per_student_position"]
    table = Table(title=f"cost per student position, us ({record['episodes']} episodes, "
                        f"median of {record['repeats']} repeats, min, max)"
                        + ("; smoke: not a measurement" if record["smoke"] else ""))
    table.add_column("what")
    table.add_column("median", justify="right")
    table.add_column("min", justify="right")
    table.add_column("max", justify="right")
    for name, row in us.items():
        table.add_row(name, f"{row['median']:.2f}", f"{row['min']:.2f}", f"{row['max']:.2f}")
    console = Console()
    console.print(table)
    r, t = record["ratio_xvocab_to_topk"], record["totals"]
    console.print(f"xvocab / topk per student position: {r['median']:.3f} "
                  f"[{r['min']:.3f}, {r['max']:.3f}]; with the student's side "
                  f"{record['ratio_with_student_side']['median']:.3f}; the teacher forwards "
                  f"{t['xvocab_teacher_tokens']} tokens for xvocab, {t['topk_teacher_tokens']} "
                  f"for topk; xvocab trains {record['xvocab_trained_share']:.1%} of the "
                  f"{t['student_positions']} student positions", markup=False)
    e = record["ratio_per_episode"]
    console.print(f"xvocab / topk per episode (the same episodes, the same teacher): "
                  f"{e['median']:.3f} [{e['min']:.3f}, {e['max']:.3f}]"
                  + (f"; topk asked by a {record['tokenizers']['topk_student']['name']} "
                     f"student ({t['topk_student_positions']} positions)"
                     if record["teacher_dir"] else ""), markup=False)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    # The server's worker thread reads its OpenMP thread count from the environment
    # before torch loads (torch.set_num_threads only reaches the calling thread).
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True)) as progress:
        record = measure(args, progress)
    _summary(record)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
